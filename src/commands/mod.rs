//! The incident commands an operator runs with `kubectl exec`: [`status`], [`backups`]
//! (`backup --list`), [`recover`]
//! (prints the plan of [`crate::recovery`] and, with `--yes`, hands it to every pod),
//! [`restore`] (`restore --snapshot`: takes a live cluster back to a snapshot through the
//! same pods), [`leave`] (`leave`, `rejoin`) and [`set_aside`] (the copies set aside on this
//! volume: listed, and one removed when named). The two that hand requests to the pods
//! share [`hand_over`] here.

pub mod backups;
pub mod history;
pub mod leave;
pub mod recover;
pub mod restore;
pub mod set_aside;
pub mod status;

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::Config;
use crate::facts::{Facts, Lookup};

/// How often the commands look while following a request.
pub const POLL: Duration = Duration::from_secs(1);
/// How often they hand the request over again (a sidecar restarted meanwhile forgot it).
pub const REPOST: Duration = Duration::from_secs(5);
/// A sidecar checks a request before it takes it (the survivor of a recovery observes the
/// cluster and its peers, a restore lists the store): time for that.
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why control requests cannot be sent from here, before anything is planned: with
/// neither peer TLS nor `--control-token-file`, every sidecar refuses them.
pub fn control_unavailable(cfg: &Config) -> Option<String> {
    (cfg.peer_tls.is_none() && cfg.control_token.is_none()).then(|| {
        format!(
            "control requests need {} (the same file the sidecars are given) or peer TLS (--peer-cert-file, --peer-key-file, --peer-trusted-ca-file); without either every sidecar refuses them",
            crate::control::TOKEN_OPTION
        )
    })
}

/// POSTs `body` to `path` on the sidecar of every pod of `f` whose name resolves (this pod
/// included), on the peer-facing port (mutual TLS with peer TLS on), with the control token
/// when one is configured: each pod's name and whether it took the request (`Err` says why
/// not).
pub async fn hand_over(
    cfg: &Config,
    f: &Facts,
    path: &str,
    body: &[u8],
) -> Vec<(String, Result<(), String>)> {
    let port = cfg.peer_report_port;
    let tls = cfg.peer_tls.as_ref().map(|t| t.client_config());
    // Read for this round: a rotated token is the one sent.
    let authorization = cfg.control_token.as_ref().map(|t| t.header()).transpose();
    let mut targets: Vec<(u32, Lookup)> = vec![(f.ordinal, f.own_dns.clone())];
    targets.extend(f.peers.iter().map(|p| (p.ordinal, p.dns.clone())));
    let mut answers = Vec::new();
    for (o, lookup) in targets {
        let Some(ip) = lookup.first() else { continue };
        let authorization = match &authorization {
            Ok(a) => a.clone(),
            Err(e) => {
                answers.push((cfg.identity.pod_name(o), Err(e.clone())));
                continue;
            }
        };
        let r = crate::http_client::post_json(
            SocketAddr::new(ip, port),
            &cfg.identity.host(o),
            path,
            crate::http_client::Post {
                body: body.to_vec(),
                authorization,
            },
            POST_TIMEOUT,
            tls.as_ref(),
        )
        .await;
        let took = match r {
            Ok((202, _)) => Ok(()),
            Ok((status, body)) => Err(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body).trim()
            )),
            Err(e) => Err(e.to_string()),
        };
        answers.push((cfg.identity.pod_name(o), took));
    }
    answers
}
