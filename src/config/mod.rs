//! Command-line and environment options, validated once into a typed [`Config`].
//! Every bad option is reported in one run, each naming the constraint it breaks.
//! No other module reads the environment.
//!
//! [`cli`] holds the clap structs; each concern validates its own options in a file of its
//! own ([`common`], [`backup`], [`defrag`], [`kube`]) with the helpers of [`parse`], one per
//! kind of value. `Config` is made of the settings types of the modules it configures
//! (`etcd::Access`, `backup::BackupConfig`, `policy::DefragPolicy`, `kube_api::KubeAccess`…):
//! each module is handed its own part, never the whole.

mod backup;
pub mod cli;
mod common;
mod defrag;
mod kube;
pub mod parse;
#[cfg(test)]
mod tests;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::identity::Identity;
use crate::tls::TlsMaterial;

pub use cli::*;

/// Every broken constraint found in one run of validation.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid configuration: {}", .problems.join("; "))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// The validated configuration both roles run on.
#[derive(Debug, Clone)]
pub struct Config {
    pub identity: Identity,
    pub replicas: u32,
    pub data_dir: PathBuf,
    pub http_port: u16,
    pub listen_ip: IpAddr,
    pub dns_server: Option<SocketAddr>,
    pub etcd_bin: PathBuf,
    pub learner_stall_timeout: Duration,
    /// `--corruption-check-interval`: off when `None`.
    pub corruption_check: Option<Duration>,
    /// `--auto-recover-after`: off when `None`.
    pub auto_recover_after: Option<Duration>,
    /// How the agent reaches etcd: client TLS (`--client-*-file`) and credentials.
    pub etcd: crate::etcd::Access,
    pub peer_tls: Option<TlsMaterial>,
    /// `--tls-issuer-dir`: this pod issues its own certificates (the sidecar renews them).
    pub issuing: Option<crate::tls::issue::Issuing>,
    /// `--peer-cert-allowed-cn`: the only peer certificate name etcd and the sidecar admit.
    pub peer_cert_allowed_cn: Option<String>,
    pub peer_report_port: u16,
    /// `--control-token-file`: the token control requests must carry.
    pub control_token: Option<crate::control::ControlToken>,
    /// Backups, when `--backup-url` is given.
    pub backup: Option<crate::backup::BackupConfig>,
    /// Defragmentation and the NOSPACE alarm (sidecar).
    pub defrag: crate::policy::DefragPolicy,
    /// The Kubernetes API, when its URL is known (`--kube-api-url`, or in a cluster).
    pub kube: Option<crate::kube_api::KubeAccess>,
    /// `--scale-in`: how often the leader's sidecar asks the API.
    pub scale_in: Option<Duration>,
    /// The pod Kubernetes Events are posted on, when they are on (`--events`, and the API
    /// known).
    pub events: Option<crate::kube_api::events::Regarding>,
}

impl Config {
    /// The address local clients use to reach this pod's etcd and sidecar: the listen
    /// address, or loopback when etcd listens on every address.
    pub fn local_ip(&self) -> IpAddr {
        if self.listen_ip.is_unspecified() {
            IpAddr::from([127, 0, 0, 1])
        } else {
            self.listen_ip
        }
    }

    /// This pod as the observer needs it.
    pub fn pod(&self) -> crate::observe::Pod {
        crate::observe::Pod {
            identity: self.identity.clone(),
            replicas: self.replicas,
            data_dir: self.data_dir.clone(),
            restore: self.backup.as_ref().map(|b| b.restore.clone()),
        }
    }

    /// An observer of this pod's world as the commands and the sidecar look at it: not
    /// `init`'s (no store, every peer given the full deadline).
    pub fn observer<D, C>(
        &self,
        dns: D,
        connector: C,
    ) -> crate::observe::Observer<D, C, crate::observe::HttpReports> {
        crate::observe::Observer {
            pod: self.pod(),
            dns,
            connector,
            reports: self.peer_reports(),
            store: None,
            starting: false,
        }
    }

    /// The peers' reports, asked as this configuration says: on their peer-report port,
    /// over peer TLS when it is on; without it, on the probe port too (a pod of the
    /// previous release serves its report there only).
    pub fn peer_reports(&self) -> crate::observe::HttpReports {
        crate::observe::HttpReports::new(
            self.peer_report_port,
            self.peer_tls.is_none().then_some(self.http_port),
            self.peer_tls.clone(),
            self.identity.peer_port,
        )
    }
}

/// `init`'s validated options.
#[derive(Debug, Clone)]
pub struct InitConfig {
    pub config: Config,
    pub dry_run: bool,
    pub etcd_args: Vec<String>,
}

/// With backups configured (a restore or a drill may run): runs etcd's offline tool once,
/// bounded, and keeps what it learned (its version, whether it can move the revision
/// forward). A tool that does not run is refused here, at start, rather than when every
/// volume is lost and the restore needs it.
pub async fn check_restore_tool(cfg: &mut Config) -> Result<(), ConfigError> {
    let Some(backup) = cfg.backup.as_mut() else {
        return Ok(());
    };
    let looked = backup.tool.looked_at();
    match backup
        .tool
        .clone()
        .check(crate::backup::tool::CHECK_TIMEOUT)
        .await
    {
        Ok(tool) => {
            backup.tool = tool;
            Ok(())
        }
        Err(e) => {
            let said = e.to_string().replace(['\n', '\r'], " ");
            Err(ConfigError {
                problems: vec![format!(
                    "--etcdutl-bin: etcd's offline tool, which restores and drills need with --backup-url, does not run: {said} (looked at {looked}; give its path with --etcdutl-bin)"
                )],
            })
        }
    }
}

/// For the roles that restore (`init`, and the sidecar that validates restore requests and
/// drills with the same tool): refuses a checked tool that would take a restore's revision
/// backwards ([`jump_refused`]). `backup --drill` restores nothing a client sees and is not
/// refused.
pub fn check_restore_jump(cfg: &Config) -> Result<(), ConfigError> {
    match cfg.backup.as_ref().and_then(|b| jump_refused(&b.tool)) {
        Some(problem) => Err(ConfigError {
            problems: vec![problem],
        }),
        None => Ok(()),
    }
}

/// Why a checked tool cannot be used for restores, when it cannot: a revision jump is
/// asked for (`--restore-bump-revision` is not 0) and the tool's `snapshot restore` has no
/// `--bump-revision`. A restore with it (when every volume is lost, or an operator's
/// `restore`, which `--restore never` does not turn off) would take the revision
/// backwards, which Kubernetes' watch caches cannot survive, so it is refused at start
/// rather than found out during a disaster.
pub fn jump_refused(tool: &crate::backup::EtcdTool) -> Option<String> {
    use crate::backup::tool::{Jump, JUMP_NEEDS};
    if tool.jump() != Jump::Unsupported {
        return None;
    }
    Some(format!(
        "--etcdutl-bin: {} ({}) cannot move a restore's revision forward (its snapshot restore has no --bump-revision/--mark-compacted), so a restore would take the cluster's revision backwards and clients that saw a later revision would see it again with other data; give {JUMP_NEEDS} with --etcdutl-bin, or accept the revision going back with --restore-bump-revision 0 (then restart every API server after a restore)",
        tool.bin.display(),
        tool.version.as_deref().unwrap_or("version unknown"),
    ))
}
