//! Who may send a pod's sidecar a control request (`POST /peer/recovery`, `/peer/restore`:
//! requests that stop etcd). The peer-facing port serves them, never the probe port; with
//! peer TLS a client must hold a peer certificate (mutual TLS); with `--control-token-file`
//! it must also send `Authorization: Bearer <token>`, the file's content. With neither,
//! every control request is refused.
//!
//! The token file is read again for every request, so a rotated Secret takes effect
//! without a restart; its content is compared in constant time.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a control request is held: long enough for kubelet to restart a container,
/// short enough never to act on a later, different outage.
pub const REQUEST_TTL: Duration = Duration::from_secs(15 * 60);

/// The option that turns control requests on without peer TLS, as refusals name it.
pub const TOKEN_OPTION: &str = "--control-token-file";

/// The shared token, read from its file when needed (never kept in memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlToken {
    pub path: PathBuf,
}

impl ControlToken {
    /// Checks at start that the file holds a token: a missing or empty file is a
    /// configuration error.
    pub fn load(path: &Path) -> Result<ControlToken, String> {
        let t = ControlToken {
            path: path.to_path_buf(),
        };
        t.read()?;
        Ok(t)
    }

    /// The token as the file holds it now (a final newline is not part of it).
    pub fn read(&self) -> Result<Vec<u8>, String> {
        let bytes = std::fs::read(&self.path)
            .map_err(|e| format!("{TOKEN_OPTION} {:?} cannot be read: {e}", self.path))?;
        let token = trim_newline(&bytes).to_vec();
        if token.is_empty() {
            return Err(format!("{TOKEN_OPTION} {:?} is empty", self.path));
        }
        Ok(token)
    }

    /// The `Authorization` header value the commands send.
    pub fn header(&self) -> Result<String, String> {
        let token = self.read()?;
        let text = String::from_utf8(token).map_err(|_| {
            format!(
                "{TOKEN_OPTION} {:?} must hold text (a header value)",
                self.path
            )
        })?;
        Ok(format!("Bearer {text}"))
    }
}

fn trim_newline(b: &[u8]) -> &[u8] {
    let mut end = b.len();
    while end > 0 && matches!(b[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    &b[..end]
}

/// Why a control request was turned away before its content was looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Allowed through.
    Open,
    /// No or a wrong token (401).
    Unauthenticated,
    /// Control requests are off: neither peer TLS nor a token is configured (403).
    Off,
}

/// How this sidecar authenticates control requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlAuth {
    /// Neither peer TLS nor a token: every control request is refused.
    Off,
    /// Peer TLS: the listener admits only holders of a peer certificate.
    MutualTls,
    /// A token (with or without peer TLS underneath).
    Token(ControlToken),
}

impl ControlAuth {
    pub fn new(peer_tls: bool, token: Option<&ControlToken>) -> Self {
        match (token, peer_tls) {
            (Some(t), _) => ControlAuth::Token(t.clone()),
            (None, true) => ControlAuth::MutualTls,
            (None, false) => ControlAuth::Off,
        }
    }

    /// Whether a request carrying `authorization` (the header's value) may go on. The
    /// token file is read now: a rotated token is the one that counts.
    pub fn admit(&self, authorization: Option<&[u8]>) -> Gate {
        match self {
            ControlAuth::Off => Gate::Off,
            ControlAuth::MutualTls => Gate::Open,
            ControlAuth::Token(t) => {
                let Some(presented) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else {
                    return Gate::Unauthenticated;
                };
                match t.read() {
                    Ok(want) if constant_time_eq(presented, &want) => Gate::Open,
                    Ok(_) => Gate::Unauthenticated,
                    Err(e) => {
                        tracing::warn!(error = %e, "the control token cannot be read: refusing control requests");
                        Gate::Unauthenticated
                    }
                }
            }
        }
    }
}

/// `a == b`, in a time that depends only on the lengths (a wrong token's first bytes
/// right or wrong take as long).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn equal_tokens_match_and_any_difference_does_not() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3creT"));
        assert!(!constant_time_eq(b"s3cret", b"s3cret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(!constant_time_eq(b"x", b""));
    }

    #[test]
    fn the_token_is_read_again_for_every_request_so_a_rotation_counts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "one\n").unwrap();
        let auth = ControlAuth::new(false, Some(&ControlToken::load(&path).unwrap()));
        assert_eq!(auth.admit(Some(b"Bearer one")), Gate::Open);
        std::fs::write(&path, "two").unwrap();
        assert_eq!(auth.admit(Some(b"Bearer one")), Gate::Unauthenticated);
        assert_eq!(auth.admit(Some(b"Bearer two")), Gate::Open);
        assert_eq!(auth.admit(Some(b"two")), Gate::Unauthenticated);
        assert_eq!(auth.admit(None), Gate::Unauthenticated);
    }

    #[test]
    fn a_missing_or_empty_token_file_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        assert!(ControlToken::load(&path)
            .unwrap_err()
            .contains("cannot be read"));
        std::fs::write(&path, "\n").unwrap();
        assert!(ControlToken::load(&path).unwrap_err().contains("is empty"));
    }

    #[test]
    fn without_peer_tls_or_a_token_control_is_off() {
        assert_eq!(
            ControlAuth::new(false, None).admit(Some(b"Bearer x")),
            Gate::Off
        );
        assert_eq!(ControlAuth::new(true, None).admit(None), Gate::Open);
    }
}
