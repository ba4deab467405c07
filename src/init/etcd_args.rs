//! Pure: how etcd is started for a decision. etcd listens on the pod's IP (it refuses
//! host names in listen URLs) and advertises the stable DNS names.

use crate::config::Config;
use crate::facts::MemberInfo;
use crate::identity::Identity;

/// How etcd joins the cluster when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartMode {
    /// The data directory holds this member's WAL: etcd ignores `--initial-cluster*`.
    Restart,
    /// A new cluster formed by all initial members with a fresh token.
    New {
        initial_cluster: String,
        token: String,
    },
    /// A member already added to a running cluster (learner or never-started entry),
    /// started with every member the cluster lists.
    Existing { members: Vec<MemberInfo> },
}

/// `--initial-cluster` for joining a running cluster: every listed member, named by its
/// published name, or (not started yet) by the pod its peer URL names, and this pod.
pub fn existing_initial_cluster(identity: &Identity, members: &[MemberInfo]) -> String {
    let me = identity.peer_url(identity.ordinal);
    let mut entries = Vec::new();
    for m in members {
        let name = if m.peer_urls.contains(&me) {
            identity.name()
        } else if !m.name.is_empty() {
            m.name.clone()
        } else {
            m.peer_urls
                .iter()
                .find_map(|u| identity.ordinal_of_peer_url(u))
                .map(|o| identity.pod_name(o))
                .unwrap_or_else(|| format!("member-{:x}", m.id))
        };
        for url in &m.peer_urls {
            entries.push(format!("{name}={url}"));
        }
    }
    if !members.iter().any(|m| m.peer_urls.contains(&me)) {
        entries.push(format!("{}={me}", identity.name()));
    }
    entries.join(",")
}

/// The full etcd command line (without the binary) for `mode`, then the user's extras.
pub fn etcd_argv(cfg: &Config, mode: &StartMode, extra: &[String]) -> Vec<String> {
    let id = &cfg.identity;
    let listen = match cfg.listen_ip {
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    let mut argv = vec![
        format!("--name={}", id.name()),
        format!("--data-dir={}", cfg.data_dir.display()),
        format!(
            "--listen-peer-urls={}://{listen}:{}",
            id.peer_scheme, id.peer_port
        ),
        format!(
            "--listen-client-urls={}://{listen}:{}",
            id.client_scheme, id.client_port
        ),
        format!("--initial-advertise-peer-urls={}", id.peer_url(id.ordinal)),
        format!("--advertise-client-urls={}", id.client_url(id.ordinal)),
    ];
    if let Some(t) = &cfg.client_tls {
        argv.push(format!("--cert-file={}", t.files.cert.display()));
        argv.push(format!("--key-file={}", t.files.key.display()));
        argv.push(format!("--trusted-ca-file={}", t.files.ca.display()));
        argv.push("--client-cert-auth=true".into());
    }
    if let Some(t) = &cfg.peer_tls {
        argv.push(format!("--peer-cert-file={}", t.files.cert.display()));
        argv.push(format!("--peer-key-file={}", t.files.key.display()));
        argv.push(format!("--peer-trusted-ca-file={}", t.files.ca.display()));
        argv.push("--peer-client-cert-auth=true".into());
    }
    match mode {
        StartMode::Restart => {}
        StartMode::New {
            initial_cluster,
            token,
        } => {
            argv.push(format!("--initial-cluster={initial_cluster}"));
            argv.push("--initial-cluster-state=new".into());
            argv.push(format!("--initial-cluster-token={token}"));
        }
        StartMode::Existing { members } => {
            let initial_cluster = existing_initial_cluster(id, members);
            argv.push(format!("--initial-cluster={initial_cluster}"));
            argv.push("--initial-cluster-state=existing".into());
        }
    }
    argv.extend(extra.iter().cloned());
    argv
}
