//! A throw-away single-member etcd on 127.0.0.1 (ephemeral ports), started on a restored
//! data directory: the drill's and the archive replay's. It runs the cluster's own etcd
//! binary with a clean environment and is killed when dropped.

use std::path::Path;

use super::snapshot::EtcdTarget;
use super::tool::MemberParams;

/// The ports and member of a throw-away etcd, chosen before its data is restored (the
/// restore names the member's peer URL).
#[derive(Debug, Clone)]
pub struct Scratch {
    pub member: MemberParams,
    pub client_port: u16,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Scratch {
    /// A member `name` of a one-member cluster `token`, on two free loopback ports.
    pub fn new(name: &str, token: &str) -> std::io::Result<Scratch> {
        let (peer, client_port) = (free_port()?, free_port()?);
        let peer_url = format!("http://127.0.0.1:{peer}");
        Ok(Scratch {
            member: MemberParams {
                name: name.into(),
                initial_cluster: format!("{name}={peer_url}"),
                token: token.into(),
                peer_url,
            },
            client_port,
        })
    }

    /// Starts `etcd_bin` on `data` (restored for [`Scratch::member`]) with `extra` flags;
    /// its output goes to `log` (or nowhere).
    pub fn spawn(
        &self,
        etcd_bin: &Path,
        data: &Path,
        extra: &[String],
        log: Option<&Path>,
    ) -> std::io::Result<tokio::process::Child> {
        let client_url = format!("http://127.0.0.1:{}", self.client_port);
        let m = &self.member;
        let stderr = match log {
            Some(p) => std::process::Stdio::from(std::fs::File::create(p)?),
            None => std::process::Stdio::null(),
        };
        // A clean environment: etcd reads ETCD_* variables as flags, and the agent's own
        // (ETCD_STEWARD_*) are not meant for it.
        super::tool::clean_command(etcd_bin, std::env::var_os("PATH"))
            .arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-peer-urls={}", m.peer_url))
            .arg(format!("--initial-advertise-peer-urls={}", m.peer_url))
            .arg(format!("--initial-cluster={}", m.initial_cluster))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
    }

    /// How to reach it.
    pub fn target(&self) -> EtcdTarget {
        EtcdTarget {
            host: "127.0.0.1".into(),
            ip: [127, 0, 0, 1].into(),
            port: self.client_port,
            tls: None,
            auth: None,
        }
    }
}

/// `etcd --version` of `etcd_bin` (`None` when it does not say).
pub async fn etcd_release(etcd_bin: &Path) -> Option<crate::facts::EtcdVersion> {
    let out = super::tool::clean_command(etcd_bin, std::env::var_os("PATH"))
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    crate::facts::EtcdVersion::parse(&String::from_utf8_lossy(&out.stdout))
}

/// Creates `dir` and its parents as etcd wants its directories: owner only.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}
