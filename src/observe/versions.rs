//! Which etcd releases are in play: the binary this pod would start, what its peers run,
//! and whether a peer still on 3.4 has authentication on (the upgrade gate's facts).

use std::time::Duration;

use crate::etcd::Connector;
use crate::facts::{EtcdVersion, Facts, PeerVersion};

/// Whether a peer that still runs etcd 3.4 has authentication on: asked only when this pod
/// would start etcd 3.5 or newer beside it (the one upgrade path etcd calls unsafe with auth
/// on, see [`upgrade`]), of the first such peer whose name resolved.
pub async fn auth_on_3_4<C: Connector>(
    connector: &C,
    id: &crate::identity::Identity,
    f: &Facts,
) -> Option<bool> {
    let binary = f.versions.binary?;
    if (binary.major, binary.minor) < (3, 5) {
        return None;
    }
    for v in f
        .versions
        .peers
        .iter()
        .filter(|v| (v.server.major, v.server.minor) == (3, 4))
    {
        let Some(p) = f.peers.iter().find(|p| p.name == v.name) else {
            continue;
        };
        let Some(ip) = p.dns.first() else {
            continue;
        };
        if let Some(on) = connector
            .auth_enabled(&id.host(p.ordinal), ip, id.client_port)
            .await
        {
            return Some(on);
        }
    }
    None
}

/// `etcd --version` of the binary this pod starts; `None` (logged) when it cannot be read,
/// which holds no start (see [`upgrade`]).
pub async fn binary_version(bin: &std::path::Path) -> Option<crate::facts::EtcdVersion> {
    // A blocking thread, not tokio's process driver: it holds a paused test clock still,
    // and `etcd --version` answers at once.
    let run = {
        let bin = bin.to_path_buf();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(bin).arg("--version").output()
        })
    };
    let out = match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Ok(Ok(out))) if out.status.success() => out,
        Ok(Ok(Ok(out))) => {
            tracing::warn!(bin = %bin.display(), status = %out.status, "etcd --version failed: its release is unknown, no upgrade check holds it");
            return None;
        }
        Ok(Ok(Err(e))) => {
            tracing::warn!(bin = %bin.display(), error = %e, "etcd --version could not run: its release is unknown, no upgrade check holds it");
            return None;
        }
        Ok(Err(e)) => {
            tracing::warn!(bin = %bin.display(), error = %e, "etcd --version did not finish: its release is unknown, no upgrade check holds it");
            return None;
        }
        Err(_) => {
            tracing::warn!(bin = %bin.display(), "etcd --version did not answer within 10s: its release is unknown, no upgrade check holds it");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let v = EtcdVersion::parse(&text);
    match v {
        Some(v) => tracing::info!(bin = %bin.display(), version = %v, "etcd release"),
        None => {
            tracing::warn!(bin = %bin.display(), output = %text, "etcd --version names no release: no upgrade check holds it")
        }
    }
    v
}

/// Reads etcd's `/version` answer: `{"etcdserver":"3.5.30","etcdcluster":"3.5.0"}`
/// (`etcdcluster` is `not_decided` until the cluster agreed on one).
pub fn parse_peer_version(name: &str, body: &[u8]) -> Result<PeerVersion, String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        etcdserver: String,
        etcdcluster: String,
    }
    let a: Answer =
        serde_json::from_slice(body).map_err(|e| format!("/version unreadable: {e}"))?;
    let server = EtcdVersion::parse(&a.etcdserver)
        .ok_or_else(|| format!("/version names no release: {:?}", a.etcdserver))?;
    Ok(PeerVersion {
        name: name.to_string(),
        server,
        cluster: EtcdVersion::parse(&a.etcdcluster),
    })
}
