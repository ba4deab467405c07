//! The rebuild's I/O on the leader's side (issue 27): [`Step::TellRebuild`] hands the
//! diverged member's sidecar the request (`POST /peer/rebuild`) as the incident commands
//! hand theirs: on the peer-facing port, over mutual TLS with peer TLS on, with the control
//! token when one is configured. The POST runs in a task of its own (the diverged member's
//! sidecar checks its own hash before it answers); its answer is logged there.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::config::Config;
use crate::control::ControlToken;
use crate::facts::rebuild::RebuildRequest;
use crate::identity::Identity;
use crate::tls::TlsMaterial;

/// The receiving sidecar asks its own etcd's `HashKV` before it answers.
const POST_TIMEOUT: Duration = Duration::from_secs(30);

/// How this sidecar sends rebuild requests.
#[derive(Clone)]
pub struct Teller {
    identity: Identity,
    port: u16,
    peer_tls: Option<TlsMaterial>,
    token: Option<ControlToken>,
}

impl Teller {
    pub fn new(cfg: &Config) -> Self {
        Teller {
            identity: cfg.identity.clone(),
            port: cfg.peer_report_port,
            peer_tls: cfg.peer_tls.clone(),
            token: cfg.control_token.clone(),
        }
    }

    /// The pod whose peer URL is one of `peer_urls`: its name and DNS name.
    pub fn pod_of(&self, peer_urls: &[String]) -> Option<(String, String)> {
        let o = self.identity.ordinal_of_peer_urls(peer_urls)?;
        Some((self.identity.pod_name(o), self.identity.host(o)))
    }

    /// Sends `request` to the sidecar of pod `pod` (`host` at `ip`) in the background.
    pub fn tell(&self, pod: String, host: String, ip: IpAddr, request: &RebuildRequest) {
        let body = match serde_json::to_vec(request) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "the rebuild request cannot be encoded");
                return;
            }
        };
        let authorization = match self.token.as_ref().map(ControlToken::header).transpose() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, pod, "the rebuild request is not sent");
                return;
            }
        };
        let tls = self.peer_tls.as_ref().map(TlsMaterial::client_config);
        let addr = SocketAddr::new(ip, self.port);
        let (id, member) = (request.id.clone(), request.member);
        tokio::spawn(async move {
            let sent = crate::http_client::post_json(
                addr,
                &host,
                "/peer/rebuild",
                crate::http_client::Post {
                    body,
                    authorization,
                },
                POST_TIMEOUT,
                tls.as_ref(),
            )
            .await;
            let member = format!("{member:x}");
            match sent {
                Ok((202, _)) => {
                    tracing::warn!(request = %id, %member, %pod, "rebuild request taken: that pod's sidecar confirmed its own hash differs and stops its etcd; init sets the data aside and the member joins again as a new one")
                }
                Ok((status, body)) => {
                    tracing::warn!(request = %id, %member, %pod, status, answer = %String::from_utf8_lossy(&body).trim(), "rebuild request refused: nothing is rebuilt; the next check tells it again")
                }
                Err(e) => {
                    tracing::warn!(request = %id, %member, %pod, error = %e, "rebuild request not delivered: nothing is rebuilt; the next check tells it again")
                }
            }
        });
    }
}
