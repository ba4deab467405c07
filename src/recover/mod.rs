//! Recovery from the freshest surviving volume when a majority is lost: the pure
//! [`plan`], and the `etcd-steward recover` command that prints it and, with `--yes`, hands
//! it to every pod; and `restore --snapshot` (`to_snapshot`), which takes a live cluster
//! back to a snapshot through the same pods.

pub mod command;
pub mod plan;
pub mod to_snapshot;

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::Config;
use crate::facts::{Facts, Lookup};

/// How often the commands look while following a request.
pub const POLL: Duration = Duration::from_secs(1);
/// How often they hand the request over again (a sidecar restarted meanwhile forgot it).
pub const REPOST: Duration = Duration::from_secs(5);
const POST_TIMEOUT: Duration = Duration::from_secs(3);

/// POSTs `body` to `path` on the sidecar of every pod of `f` whose name resolves (this pod
/// included), on the peer-facing port (mutual TLS with peer TLS on): each pod's name and
/// whether it took the request (`Err` says why not).
pub async fn hand_over(
    cfg: &Config,
    f: &Facts,
    path: &str,
    body: &[u8],
) -> Vec<(String, Result<(), String>)> {
    let (port, tls) = match &cfg.peer_tls {
        Some(t) => (cfg.peer_report_port, Some(t.client_config())),
        None => (cfg.http_port, None),
    };
    let mut targets: Vec<(u32, Lookup)> = vec![(f.ordinal, f.own_dns.clone())];
    targets.extend(f.peers.iter().map(|p| (p.ordinal, p.dns.clone())));
    let mut answers = Vec::new();
    for (o, lookup) in targets {
        let Some(ip) = lookup.first() else { continue };
        let r = crate::http_get::post_json(
            SocketAddr::new(ip, port),
            &cfg.identity.host(o),
            path,
            body.to_vec(),
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
