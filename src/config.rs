//! Command-line and environment options, validated once into a typed [`Config`].
//! Every bad option is reported in one run, each naming the constraint it breaks.
//! No other module reads the environment.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use thiserror::Error;

use crate::identity::{parse_pod_name, Identity};
use crate::tls::{TlsFiles, TlsMaterial};

#[derive(Debug, Parser)]
#[command(
    name = "etcd-steward",
    version,
    about = "Starts, joins, heals and promotes the etcd members of a Kubernetes StatefulSet"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The etcd container's entrypoint: decide how this member starts, then exec etcd.
    Init(InitArgs),
    /// The second container: promote the learner, remove dead learners, serve health.
    Sidecar(SidecarArgs),
    /// Copy this binary into DIR (an emptyDir shared with the upstream etcd image).
    Install(InstallArgs),
    /// Take one snapshot now through the local member (or --list, or --drill).
    Backup(BackupCmdArgs),
    /// When a majority of volumes is lost: print the plan to recover the cluster from the
    /// freshest surviving volume (changing nothing), or carry it out with --yes.
    Recover(RecoverArgs),
    /// Take the whole live cluster back to a snapshot from the backup store: every pod sets
    /// its data aside (renamed, not deleted) and the cluster re-forms from the snapshot.
    /// Prints the plan; --yes carries it out.
    Restore(SnapshotRestoreArgs),
    /// One screen for an incident: each member's role, lag, database size, alarms and
    /// version, each pod's volume and last decision, and the backups.
    Status(StatusArgs),
    /// Leave the cluster for good (a planned departure): remove this pod's member, set its
    /// data aside, and stay out until `rejoin`. Prints the plan; --yes carries it out.
    Leave(LeaveArgs),
    /// After `leave`: let this pod join the cluster again (as a new member).
    Rejoin(RejoinArgs),
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The directory to copy `etcd-steward` into.
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Print the decision as one JSON object on stdout and exit 0, changing nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Extra flags passed to etcd after the computed ones (after `--`).
    #[arg(last = true)]
    pub etcd_args: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SidecarArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Options shared by `init` and `sidecar`. Numbers and addresses are taken as text so that
/// every bad value is reported together, with the constraint it breaks.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// The pod name, ending in -<ordinal> (e.g. etcd-2). Falls back to HOSTNAME.
    #[arg(long, env = "POD_NAME")]
    pub name: Option<String>,
    #[arg(long = "hostname-fallback", env = "HOSTNAME", hide = true)]
    pub hostname: Option<String>,
    /// The headless service [default: the pod name without -<ordinal>].
    #[arg(long, env = "ETCD_STEWARD_SERVICE")]
    pub service: Option<String>,
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    #[arg(
        long,
        env = "ETCD_STEWARD_CLUSTER_DOMAIN",
        default_value = "cluster.local"
    )]
    pub cluster_domain: String,
    /// The initial cluster size (required).
    #[arg(long, env = "ETCD_STEWARD_REPLICAS")]
    pub replicas: Option<String>,
    #[arg(long, env = "ETCD_STEWARD_DATA_DIR", default_value = "/var/lib/etcd")]
    pub data_dir: PathBuf,
    #[arg(long, env = "ETCD_STEWARD_CLIENT_PORT", default_value = "2379")]
    pub client_port: String,
    #[arg(long, env = "ETCD_STEWARD_PEER_PORT", default_value = "2380")]
    pub peer_port: String,
    /// The sidecar's HTTP port, the same in every pod.
    #[arg(long, env = "ETCD_STEWARD_HTTP_PORT", default_value = "8080")]
    pub http_port: String,
    /// The address etcd and the sidecar bind.
    #[arg(long, env = "POD_IP", default_value = "0.0.0.0")]
    pub listen_ip: String,
    /// A DNS server as IP:PORT [default: the system resolver].
    #[arg(long, env = "ETCD_STEWARD_DNS_SERVER")]
    pub dns_server: Option<String>,
    #[arg(long, env = "ETCD_STEWARD_ETCD_BIN", default_value = "etcd")]
    pub etcd_bin: PathBuf,
    /// How long a learner may go without starting or progressing before the leader's
    /// sidecar removes it (humantime: 10s, 5m).
    #[arg(long, env = "ETCD_STEWARD_LEARNER_STALL_TIMEOUT", default_value = "5m")]
    pub learner_stall_timeout: String,
    /// Recover automatically from the freshest surviving volume (what `recover --yes`
    /// does) once a majority of the initial pods has answered for this long that their
    /// volumes are empty, every pod answered, and no cluster has quorum. Off by default.
    #[arg(long, env = "ETCD_STEWARD_AUTO_RECOVER_AFTER")]
    pub auto_recover_after: Option<String>,
    /// Client TLS: this certificate serves etcd's client port and authenticates
    /// etcd-steward to etcd (it needs the server and client usages).
    #[arg(long, env = "ETCD_STEWARD_CLIENT_CERT_FILE")]
    pub client_cert_file: Option<PathBuf>,
    #[arg(long, env = "ETCD_STEWARD_CLIENT_KEY_FILE")]
    pub client_key_file: Option<PathBuf>,
    /// The CA that signs client certificates (etcd's --trusted-ca-file).
    #[arg(long, env = "ETCD_STEWARD_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,
    /// Peer TLS: etcd's peer certificate, also used for the mutual-TLS peer reports.
    #[arg(long, env = "ETCD_STEWARD_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,
    #[arg(long, env = "ETCD_STEWARD_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,
    #[arg(long, env = "ETCD_STEWARD_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// The port the sidecar serves its peer-facing surface on (peer reports and control
    /// requests): mutual TLS with peer TLS, plain HTTP without.
    #[arg(long, env = "ETCD_STEWARD_PEER_REPORT_PORT", default_value = "8443")]
    pub peer_report_port: String,
    /// A file holding the shared token control requests (`recover --yes`, `restore --yes`)
    /// carry as `Authorization: Bearer <token>`; re-read for every request. Without it and
    /// without peer TLS, the sidecars refuse every control request.
    #[arg(long, env = "ETCD_STEWARD_CONTROL_TOKEN_FILE")]
    pub control_token_file: Option<PathBuf>,
    /// etcd user for membership calls when etcd's authentication is enabled (needs root).
    #[arg(long, env = "ETCD_STEWARD_AUTH_USERNAME")]
    pub auth_username: Option<String>,
    /// A file holding that user's password.
    #[arg(long, env = "ETCD_STEWARD_AUTH_PASSWORD_FILE")]
    pub auth_password_file: Option<PathBuf>,
    #[command(flatten)]
    pub backup: BackupArgs,
    #[command(flatten)]
    pub defrag: DefragArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// etcd credentials; `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Loads one side's TLS files: all three or none.
fn tls_side(
    names: [&str; 3],
    files: [&Option<PathBuf>; 3],
    problems: &mut Vec<String>,
) -> Option<TlsMaterial> {
    match files {
        [None, None, None] => None,
        [Some(cert), Some(key), Some(ca)] => {
            let files = TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            };
            match TlsMaterial::load(&files) {
                Ok(m) => Some(m),
                Err(e) => {
                    problems.push(format!("--{}: {e}", names[0]));
                    None
                }
            }
        }
        _ => {
            problems.push(format!(
                "--{}, --{} and --{} go together: give all three or none",
                names[0], names[1], names[2]
            ));
            None
        }
    }
}

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
    /// `--auto-recover-after`: off when `None`.
    pub auto_recover_after: Option<Duration>,
    pub client_tls: Option<TlsMaterial>,
    pub peer_tls: Option<TlsMaterial>,
    pub peer_report_port: u16,
    /// `--control-token-file`: the token control requests must carry.
    pub control_token: Option<crate::control::ControlToken>,
    pub auth: Option<Auth>,
    /// Backups, when `--backup-url` is given.
    pub backup: Option<crate::backup::BackupConfig>,
    /// Defragmentation and the NOSPACE alarm (sidecar).
    pub defrag: crate::sidecar::plan::defrag::DefragPolicy,
    /// The Kubernetes API, when its URL is known (`--kube-api-url`, or in a cluster).
    pub kube: Option<crate::kube_api::KubeAccess>,
    /// `--scale-in`: how often the leader's sidecar asks the API.
    pub scale_in: Option<Duration>,
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
}

/// `init`'s validated options.
#[derive(Debug, Clone)]
pub struct InitConfig {
    pub config: Config,
    pub dry_run: bool,
    pub etcd_args: Vec<String>,
}

fn port(name: &str, value: &str, problems: &mut Vec<String>) -> u16 {
    match value.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => {
            problems.push(format!(
                "--{name} must be a port from 1 to 65535, got {value:?}"
            ));
            0
        }
    }
}

fn dns_label_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl CommonArgs {
    /// Validates every option; returns all broken constraints at once.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let name = self.name.clone().or_else(|| self.hostname.clone());
        let (set_name, ordinal) = match name.as_deref().map(parse_pod_name) {
            Some(Ok(parsed)) => parsed,
            Some(Err(e)) => {
                problems.push(e.to_string());
                (String::new(), 0)
            }
            None => {
                problems.push(
                    "--name (or POD_NAME, or HOSTNAME) is required: the pod name, such as etcd-0"
                        .into(),
                );
                (String::new(), 0)
            }
        };
        let service = self.service.clone().unwrap_or_else(|| set_name.clone());
        if !service.is_empty() && !dns_label_ok(&service) {
            problems.push(format!("--service {service:?} must be a DNS label"));
        }
        if !dns_label_ok(&self.namespace) {
            problems.push(format!(
                "--namespace {:?} must be a DNS label",
                self.namespace
            ));
        }
        let domain = self.cluster_domain.trim_end_matches('.').to_string();
        if domain.is_empty() || !domain.split('.').all(dns_label_ok) {
            problems.push(format!(
                "--cluster-domain {:?} must be a DNS name such as cluster.local",
                self.cluster_domain
            ));
        }
        let replicas = match self.replicas.as_deref().map(str::parse::<u32>) {
            Some(Ok(n)) if (1..=99).contains(&n) => n,
            Some(_) => {
                problems.push(format!(
                    "--replicas must be the initial cluster size, a whole number from 1 to 99, got {:?}",
                    self.replicas.as_deref().unwrap_or_default()
                ));
                0
            }
            None => {
                problems.push(
                    "--replicas (or ETCD_STEWARD_REPLICAS) is required: the initial cluster size"
                        .into(),
                );
                0
            }
        };
        let client_port = port("client-port", &self.client_port, &mut problems);
        let peer_port = port("peer-port", &self.peer_port, &mut problems);
        let http_port = port("http-port", &self.http_port, &mut problems);
        let peer_report_port = port("peer-report-port", &self.peer_report_port, &mut problems);
        let ports = [
            ("client-port", client_port),
            ("peer-port", peer_port),
            ("http-port", http_port),
            ("peer-report-port", peer_report_port),
        ];
        for (i, (a, pa)) in ports.iter().enumerate() {
            for (b, pb) in &ports[i + 1..] {
                if *pa != 0 && pa == pb {
                    problems.push(format!("--{a} and --{b} must differ, both are {pa}"));
                }
            }
        }
        let listen_ip = match self.listen_ip.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => {
                problems.push(format!(
                    "--listen-ip must be an IP address (etcd refuses host names in listen URLs), got {:?}",
                    self.listen_ip
                ));
                IpAddr::from([0, 0, 0, 0])
            }
        };
        let dns_server = match self.dns_server.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => match s.parse::<SocketAddr>() {
                Ok(addr) if addr.port() != 0 => Some(addr),
                _ => {
                    problems.push(format!(
                        "--dns-server must be IP:PORT such as 10.96.0.10:53, got {s:?}"
                    ));
                    None
                }
            },
        };
        let learner_stall_timeout = match humantime::parse_duration(&self.learner_stall_timeout) {
            Ok(d) if d >= Duration::from_secs(1) => d,
            _ => {
                problems.push(format!(
                    "--learner-stall-timeout must be a duration of at least 1s such as 30s or 5m, got {:?}",
                    self.learner_stall_timeout
                ));
                Duration::ZERO
            }
        };
        let auto_recover_after = match self
            .auto_recover_after
            .as_deref()
            .map(humantime::parse_duration)
        {
            None => None,
            Some(Ok(d)) if d >= Duration::from_secs(1) => Some(d),
            Some(_) => {
                problems.push(format!(
                    "--auto-recover-after must be a duration of at least 1s such as 10m, got {:?}",
                    self.auto_recover_after.as_deref().unwrap_or_default()
                ));
                None
            }
        };
        if self.data_dir.as_os_str().is_empty() || self.data_dir.is_relative() {
            problems.push(format!(
                "--data-dir must be an absolute path, got {:?}",
                self.data_dir
            ));
        }
        let client_tls = tls_side(
            ["client-cert-file", "client-key-file", "trusted-ca-file"],
            [
                &self.client_cert_file,
                &self.client_key_file,
                &self.trusted_ca_file,
            ],
            &mut problems,
        );
        let peer_tls = tls_side(
            ["peer-cert-file", "peer-key-file", "peer-trusted-ca-file"],
            [
                &self.peer_cert_file,
                &self.peer_key_file,
                &self.peer_trusted_ca_file,
            ],
            &mut problems,
        );
        let auth = match (&self.auth_username, &self.auth_password_file) {
            (None, None) => None,
            (Some(username), Some(file)) => match std::fs::read_to_string(file) {
                Ok(p) if !p.trim_end_matches(['\r', '\n']).is_empty() => Some(Auth {
                    username: username.clone(),
                    password: p.trim_end_matches(['\r', '\n']).to_string(),
                }),
                Ok(_) => {
                    problems.push(format!("--auth-password-file {file:?} is empty"));
                    None
                }
                Err(e) => {
                    problems.push(format!("--auth-password-file {file:?} cannot be read: {e}"));
                    None
                }
            },
            _ => {
                problems.push("--auth-username and --auth-password-file go together".into());
                None
            }
        };
        let control_token = match &self.control_token_file {
            None => None,
            Some(file) => match crate::control::ControlToken::load(file) {
                Ok(t) => Some(t),
                Err(e) => {
                    problems.push(e);
                    None
                }
            },
        };
        let backup = self.backup.validate(&self.etcd_bin, &mut problems);
        let defrag = self.defrag.validate(&mut problems);
        let (kube, scale_in) = self
            .kube
            .validate(&set_name, &self.namespace, &mut problems);
        if !problems.is_empty() {
            return Err(ConfigError { problems });
        }
        Ok(Config {
            identity: Identity {
                set_name,
                ordinal,
                service,
                namespace: self.namespace.clone(),
                cluster_domain: domain,
                client_port,
                peer_port,
                client_scheme: if client_tls.is_some() {
                    "https"
                } else {
                    "http"
                },
                peer_scheme: if peer_tls.is_some() { "https" } else { "http" },
            },
            replicas,
            data_dir: self.data_dir.clone(),
            http_port,
            listen_ip,
            dns_server,
            etcd_bin: self.etcd_bin.clone(),
            learner_stall_timeout,
            auto_recover_after,
            client_tls,
            peer_tls,
            peer_report_port,
            control_token,
            auth,
            backup,
            defrag,
            kube,
            scale_in,
        })
    }
}

/// Finds an executable: a path with a `/` as it is, a bare name on `PATH`.
fn find_executable(bin: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if bin.components().count() > 1 || bin.is_absolute() {
        return if executable(bin) {
            Ok(bin.to_path_buf())
        } else {
            Err(format!(
                "--etcd-bin {bin:?} does not exist or is not an executable file"
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(bin))
        .find(|p| executable(p))
        .ok_or_else(|| {
            format!("--etcd-bin {bin:?} was not found on PATH; install etcd or give its full path")
        })
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

impl InitArgs {
    /// Validates the shared options and, unless this is a dry run, that etcd can be exec'd.
    pub fn validate(&self) -> Result<InitConfig, ConfigError> {
        let mut config = self.common.validate();
        if !self.dry_run {
            match (find_executable(&self.common.etcd_bin), &mut config) {
                (Ok(path), Ok(c)) => c.etcd_bin = path,
                (Err(p), Ok(_)) => config = Err(ConfigError { problems: vec![p] }),
                (Err(p), Err(e)) => e.problems.push(p),
                (Ok(_), Err(_)) => {}
            }
        }
        Ok(InitConfig {
            config: config?,
            dry_run: self.dry_run,
            etcd_args: self.etcd_args.clone(),
        })
    }
}

// ---- defragmentation and NOSPACE (issue 12) --------------------------------------------

/// When the sidecar defragments its member, and what NOSPACE is measured against.
#[derive(Debug, Args)]
pub struct DefragArgs {
    /// Defragment a member when its database file is at least this fragmented:
    /// `PERCENT%,SIZE`, both reached (free share of the file and free bytes, e.g.
    /// `50%,100MiB`); `0` turns it off.
    #[arg(
        long,
        env = "ETCD_STEWARD_DEFRAG_THRESHOLD",
        default_value = "50%,100MiB"
    )]
    pub defrag_threshold: String,
    /// Also defragment every member this often, fragmented or not (humantime: 24h, 7d).
    /// Off by default.
    #[arg(long, env = "ETCD_STEWARD_DEFRAG_SCHEDULE")]
    pub defrag_schedule: Option<String>,
    /// etcd's --quota-backend-bytes (give both the same value; SIZE such as 8GiB): under
    /// NOSPACE the alarm is disarmed only when every member's file is under 80% of it.
    #[arg(long, env = "ETCD_STEWARD_QUOTA_BACKEND_BYTES", default_value = "2GiB")]
    pub quota_backend_bytes: String,
}

impl DefragArgs {
    /// The typed policy; adds every broken constraint to `problems`.
    pub fn validate(
        &self,
        problems: &mut Vec<String>,
    ) -> crate::sidecar::plan::defrag::DefragPolicy {
        use crate::sidecar::plan::defrag::{parse_size, DefragPolicy, Threshold};
        let threshold = Threshold::parse(&self.defrag_threshold).unwrap_or_else(|e| {
            problems.push(format!("--defrag-threshold: {e}"));
            None
        });
        let schedule = match self
            .defrag_schedule
            .as_deref()
            .map(humantime::parse_duration)
        {
            None => None,
            Some(Ok(d)) if d >= Duration::from_secs(60) => Some(d),
            Some(_) => {
                problems.push(format!(
                    "--defrag-schedule must be a duration of at least 1m such as 24h, got {:?}",
                    self.defrag_schedule.as_deref().unwrap_or_default()
                ));
                None
            }
        };
        let quota = match parse_size(self.quota_backend_bytes.trim()) {
            Ok(q) if q >= 1 << 20 => q,
            Ok(_) => {
                problems.push(format!(
                    "--quota-backend-bytes must be at least 1MiB, got {:?}",
                    self.quota_backend_bytes
                ));
                0
            }
            Err(e) => {
                problems.push(format!("--quota-backend-bytes: {e}"));
                0
            }
        };
        DefragPolicy {
            threshold,
            schedule,
            quota,
        }
    }
}

// ---- scale-in (issue 12) ---------------------------------------------------------------

/// Kubernetes API options: scale-in in the sidecar, and `leave --if-scaled-in`.
#[derive(Debug, Args)]
pub struct KubeArgs {
    /// The leader's sidecar removes the members of ordinals >= the StatefulSet's
    /// spec.replicas whose pods are gone (needs the API: RBAC get on the StatefulSet,
    /// get/list on pods). Off by default.
    #[arg(long, env = "ETCD_STEWARD_SCALE_IN")]
    pub scale_in: bool,
    /// How often the sidecar asks the API (humantime).
    #[arg(long, env = "ETCD_STEWARD_SCALE_IN_INTERVAL", default_value = "10s")]
    pub scale_in_interval: String,
    /// The API's URL [default: in a cluster, https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT].
    #[arg(long, env = "ETCD_STEWARD_KUBE_API_URL")]
    pub kube_api_url: Option<String>,
    #[arg(
        long = "kubernetes-service-host",
        env = "KUBERNETES_SERVICE_HOST",
        hide = true
    )]
    pub service_host: Option<String>,
    #[arg(
        long = "kubernetes-service-port",
        env = "KUBERNETES_SERVICE_PORT",
        hide = true
    )]
    pub service_port: Option<String>,
    /// The bearer token, read before every call.
    #[arg(long, env = "ETCD_STEWARD_KUBE_TOKEN_FILE", default_value = crate::kube_api::SA_TOKEN)]
    pub kube_token_file: PathBuf,
    /// The CA of the API server's certificate (https).
    #[arg(long, env = "ETCD_STEWARD_KUBE_CA_FILE", default_value = crate::kube_api::SA_CA)]
    pub kube_ca_file: PathBuf,
    /// The StatefulSet [default: the pod name without -<ordinal>].
    #[arg(long, env = "ETCD_STEWARD_STATEFULSET_NAME")]
    pub statefulset_name: Option<String>,
}

impl KubeArgs {
    /// The API access (when its URL is known) and the scale-in interval (with --scale-in).
    fn validate(
        &self,
        set_name: &str,
        namespace: &str,
        problems: &mut Vec<String>,
    ) -> (Option<crate::kube_api::KubeAccess>, Option<Duration>) {
        let statefulset = self
            .statefulset_name
            .clone()
            .unwrap_or_else(|| set_name.to_string());
        if !statefulset.is_empty() && !dns_label_ok(&statefulset) {
            problems.push(format!(
                "--statefulset-name {statefulset:?} must be a DNS label"
            ));
        }
        let url = match (&self.kube_api_url, &self.service_host) {
            (Some(u), _) if !u.is_empty() => Some(u.clone()),
            (_, Some(host)) if !host.is_empty() => {
                let port = self.service_port.as_deref().unwrap_or("443");
                Some(match host.parse::<std::net::Ipv6Addr>() {
                    Ok(_) => format!("https://[{host}]:{port}"),
                    Err(_) => format!("https://{host}:{port}"),
                })
            }
            _ => None,
        };
        let access = url.map(|url| crate::kube_api::KubeAccess {
            url,
            token_file: self.kube_token_file.clone(),
            ca_file: self.kube_ca_file.clone(),
            namespace: namespace.to_string(),
            statefulset,
        });
        if !self.scale_in {
            return (access, None);
        }
        let interval = match humantime::parse_duration(&self.scale_in_interval) {
            Ok(d) if d >= Duration::from_secs(1) => d,
            _ => {
                problems.push(format!(
                    "--scale-in-interval must be a duration of at least 1s such as 10s, got {:?}",
                    self.scale_in_interval
                ));
                Duration::ZERO
            }
        };
        match &access {
            None => problems.push(
                "--scale-in needs the Kubernetes API: run in a cluster (KUBERNETES_SERVICE_HOST) or give --kube-api-url"
                    .into(),
            ),
            Some(a) => {
                if let Err(e) = crate::kube_api::ApiWorkload::new(a) {
                    problems.push(format!("--scale-in: {e}"));
                }
            }
        }
        (access, Some(interval))
    }
}

// ---- backups (issue 10) -----------------------------------------------------------------

/// Backup options, shared by `init` (restore when every volume is lost), `sidecar`
/// (periodic snapshots) and `backup` (one now, list, drill).
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Where snapshots go: s3://bucket/prefix, gs://bucket/prefix, az://container/prefix
    /// or file:///path. S3 reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// AWS_ENDPOINT_URL and AWS_ALLOW_HTTP. Without it, no backups.
    #[arg(long, env = "ETCD_STEWARD_BACKUP_URL")]
    pub backup_url: Option<String>,
    /// How often the leader's sidecar takes a snapshot (humantime: 30m, 1h).
    #[arg(long, env = "ETCD_STEWARD_BACKUP_INTERVAL", default_value = "30m")]
    pub backup_interval: String,
    /// How many of the newest snapshots to keep; the newest verified one is never deleted.
    #[arg(long, env = "ETCD_STEWARD_BACKUP_KEEP", default_value = "48")]
    pub backup_keep: String,
    /// etcd's offline tool for restores and drills: etcdutl (etcd 3.5+), or for etcd 3.4 a
    /// path whose file name contains `etcdctl` (run with ETCDCTL_API=3) [default: etcdutl,
    /// else etcdctl, beside --etcd-bin, then on PATH].
    #[arg(long, env = "ETCD_STEWARD_ETCDUTL_BIN")]
    pub etcdutl_bin: Option<PathBuf>,
    /// How far every restore from a backup moves the revision forward
    /// (`etcdutl snapshot restore --bump-revision N --mark-compacted`), so the restored
    /// revision is above any the cluster served and watchers re-list; `0` turns it off.
    #[arg(
        long,
        env = "ETCD_STEWARD_RESTORE_BUMP_REVISION",
        default_value = "1000000000"
    )]
    pub restore_bump_revision: String,
    /// Scratch space for the restore drill (an emptyDir: the root file system is read-only).
    #[arg(
        long,
        env = "ETCD_STEWARD_BACKUP_SCRATCH_DIR",
        default_value = "/var/lib/etcd-steward-scratch"
    )]
    pub backup_scratch_dir: PathBuf,
    /// init, when every volume is lost: `latest` (the default with a backup URL),
    /// `never`, or a snapshot's name as `backup --list` prints it.
    #[arg(long, env = "ETCD_STEWARD_RESTORE")]
    pub restore: Option<String>,
    /// An age key file (`AGE-SECRET-KEY-1…`): every new snapshot is encrypted to it before it
    /// leaves the pod, and restores decrypt with it.
    #[arg(long, env = "ETCD_STEWARD_BACKUP_ENCRYPTION_KEY_FILE")]
    pub backup_encryption_key_file: Option<PathBuf>,
    /// Older key files, only to read snapshots encrypted before a key rotation (repeat the
    /// option, or separate paths with commas in the variable).
    #[arg(
        long,
        env = "ETCD_STEWARD_BACKUP_DECRYPTION_KEY_FILES",
        value_delimiter = ','
    )]
    pub backup_decryption_key_file: Vec<PathBuf>,
}

impl BackupArgs {
    /// The typed backup options, or `None` without `--backup-url`; adds every broken
    /// constraint to `problems`. `etcd_bin` is where the restore tool is looked for first.
    pub fn validate(
        &self,
        etcd_bin: &Path,
        problems: &mut Vec<String>,
    ) -> Option<crate::backup::BackupConfig> {
        use crate::backup::{BackupConfig, EtcdTool, RestoreChoice};
        let before = problems.len();
        let url = self.backup_url.as_deref().filter(|u| !u.is_empty());
        if let Some(u) = url {
            if let Err(why) = crate::backup::store::check_url(u) {
                problems.push(format!("--backup-url {u:?}: {why}"));
            }
        }
        let interval = match humantime::parse_duration(&self.backup_interval) {
            Ok(d) if d >= Duration::from_secs(1) => d,
            _ => {
                problems.push(format!(
                    "--backup-interval must be a duration of at least 1s such as 30m, got {:?}",
                    self.backup_interval
                ));
                Duration::ZERO
            }
        };
        let keep = match self.backup_keep.parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => {
                problems.push(format!(
                    "--backup-keep must be a whole number of at least 1, got {:?}",
                    self.backup_keep
                ));
                0
            }
        };
        // Below i64::MAX with room: etcd's revisions are signed 64-bit.
        let bump_revision = match self.restore_bump_revision.parse::<u64>() {
            Ok(n) if n <= 1 << 62 => n,
            _ => {
                problems.push(format!(
                    "--restore-bump-revision must be a whole number from 0 to 2^62, got {:?}",
                    self.restore_bump_revision
                ));
                0
            }
        };
        if self.backup_scratch_dir.is_relative() {
            problems.push(format!(
                "--backup-scratch-dir must be an absolute path, got {:?}",
                self.backup_scratch_dir
            ));
        }
        let restore = match self.restore.as_deref() {
            None | Some("latest") => RestoreChoice::Latest,
            Some("never") => RestoreChoice::Never,
            Some(name)
                if !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) =>
            {
                RestoreChoice::Named(name.to_string())
            }
            Some(other) => {
                problems.push(format!(
                    "--restore must be latest, never or a snapshot name, got {other:?}"
                ));
                RestoreChoice::Never
            }
        };
        let mut keys = crate::backup::crypt::Keys::default();
        if let Some(path) = &self.backup_encryption_key_file {
            match crate::backup::crypt::Key::load(path) {
                Ok(k) => keys.write = Some(k),
                Err(e) => problems.push(e.to_string()),
            }
        }
        for path in &self.backup_decryption_key_file {
            match crate::backup::crypt::Key::load(path) {
                Ok(k) => keys.read.push(k),
                Err(e) => problems.push(e.to_string()),
            }
        }
        if url.is_none() {
            if !keys.is_empty() {
                problems.push(
                    "--backup-encryption-key-file and --backup-decryption-key-file need --backup-url"
                        .into(),
                );
            }
            if let Some(r) = self.restore.as_deref().filter(|r| *r != "never") {
                problems.push(format!(
                    "--restore {r:?} needs --backup-url (where the snapshots are)"
                ));
            }
            return None;
        }
        if problems.len() > before {
            return None;
        }
        Some(BackupConfig {
            url: url.unwrap_or_default().to_string(),
            interval,
            keep,
            tool: EtcdTool {
                bump_revision,
                ..EtcdTool::resolve(
                    self.etcdutl_bin.as_deref(),
                    etcd_bin,
                    std::env::var_os("PATH").as_deref(),
                )
            },
            scratch_dir: self.backup_scratch_dir.clone(),
            restore,
            keys,
        })
    }
}

/// `backup`'s options: the sidecar's, and what to do.
#[derive(Debug, Args)]
pub struct BackupCmdArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// List the stored snapshots, newest first, one JSON object per line.
    #[arg(long, conflicts_with = "drill")]
    pub list: bool,
    /// Run the restore drill once on the newest verified snapshot and print its outcome.
    #[arg(long)]
    pub drill: bool,
    /// Print a new encryption key file (an age X25519 identity) for
    /// --backup-encryption-key-file, and exit.
    #[arg(long, conflicts_with_all = ["list", "drill"])]
    pub generate_key: bool,
}

/// `recover`'s options: `init`'s, and what to do.
#[derive(Debug, Args)]
pub struct RecoverArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Carry the plan out: hand it to every pod, then follow it until the survivor serves
    /// as a one-member cluster.
    #[arg(long)]
    pub yes: bool,
    /// A pod lost for good (its volume gone, its node dead): its silence is no longer read
    /// as "it could hold fresher data". Repeat for several.
    #[arg(long = "force-lost", value_name = "POD")]
    pub force_lost: Vec<String>,
    /// With --yes, how long to follow the recovery before giving up (it goes on in the pods).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `leave`'s options.
#[derive(Debug, Args)]
pub struct LeaveArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Carry the leave out.
    #[arg(long)]
    pub yes: bool,
    /// The preStop hook: leave (without the "do not rejoin" marker) only when the
    /// StatefulSet's spec.replicas no longer covers this pod's ordinal; otherwise do
    /// nothing and exit 0. Asks the Kubernetes API (implies --yes).
    #[arg(long)]
    pub if_scaled_in: bool,
}

/// `rejoin`'s options.
#[derive(Debug, Args)]
pub struct RejoinArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `status`'s options.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// `text` (one screen) or `json` (the same data, for scripts).
    #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

/// `restore`'s options.
#[derive(Debug, Args)]
pub struct SnapshotRestoreArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The snapshot's name, as `etcd-steward backup --list` shows it.
    #[arg(long)]
    pub snapshot: String,
    /// Carry the plan out and follow it until the restored cluster serves.
    #[arg(long)]
    pub yes: bool,
    /// With --yes, how long to follow the restore before giving up (it goes on in the pods).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        match Cli::try_parse_from(args) {
            Ok(cli) => cli,
            Err(e) => panic!("parse failed: {e}"),
        }
    }

    fn common(args: &[&str]) -> CommonArgs {
        let mut full = vec!["etcd-steward", "sidecar", "--hostname-fallback", ""];
        full.extend_from_slice(args);
        match parse(&full).command {
            Command::Sidecar(s) => s.common,
            _ => unreachable!(),
        }
    }

    #[test]
    fn scale_in_needs_the_api_and_an_interval_of_at_least_a_second() {
        let base = [
            "--name",
            "etcd-4",
            "--replicas",
            "3",
            "--kubernetes-service-host=",
        ];
        let with = |extra: &[&str]| {
            let mut a = base.to_vec();
            a.extend_from_slice(extra);
            common(&a).validate()
        };
        let problems = |r: Result<Config, ConfigError>| match r {
            Ok(_) => panic!("accepted"),
            Err(e) => e.problems.join("; "),
        };
        assert!(problems(with(&["--scale-in"])).contains("--scale-in needs the Kubernetes API"));
        let p = problems(with(&[
            "--scale-in",
            "--kube-api-url=http://127.0.0.1:8001",
            "--scale-in-interval=0s",
        ]));
        assert!(
            p.contains("--scale-in-interval must be a duration of at least 1s"),
            "{p}"
        );
        assert!(problems(with(&[
            "--scale-in",
            "--kube-api-url=https://10.96.0.1",
            "--kube-ca-file=/nonexistent/ca.crt"
        ]))
        .contains("--kube-ca-file"));
        let c = match with(&["--scale-in", "--kube-api-url=http://127.0.0.1:8001"]) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(c.scale_in, Some(Duration::from_secs(10)));
        assert_eq!(c.kube.map(|k| k.statefulset), Some("etcd".to_string()));
        // Off by default; in a cluster the API's address is known all the same (for the
        // preStop hook, `leave --if-scaled-in`).
        let c = match common(&[
            "--name",
            "etcd-0",
            "--replicas",
            "3",
            "--kubernetes-service-host=10.96.0.1",
            "--kubernetes-service-port=443",
        ])
        .validate()
        {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(c.scale_in, None);
        assert_eq!(
            c.kube.map(|k| k.url),
            Some("https://10.96.0.1:443".to_string())
        );
    }

    #[test]
    fn defaults_follow_the_statefulset_conventions() {
        let c = common(&["--name", "etcd-2", "--replicas", "3"]).validate();
        let c = c.map_err(|e| e.to_string());
        let c = match c {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(c.identity.set_name, "etcd");
        assert_eq!(c.identity.service, "etcd");
        assert_eq!(c.identity.ordinal, 2);
        assert_eq!(c.identity.host(2), "etcd-2.etcd.default.svc.cluster.local");
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/etcd"));
        assert_eq!(
            (c.identity.client_port, c.identity.peer_port, c.http_port),
            (2379, 2380, 8080)
        );
        assert_eq!(c.learner_stall_timeout, Duration::from_secs(300));
        assert!(c.dns_server.is_none());
    }

    #[test]
    fn every_broken_constraint_is_reported_in_one_run() {
        let err = common(&[
            "--name",
            "etcd",
            "--replicas",
            "0",
            "--client-port",
            "70000",
            "--peer-port",
            "8080",
            "--listen-ip",
            "pod.local",
            "--dns-server",
            "10.0.0.1",
            "--learner-stall-timeout",
            "soon",
        ])
        .validate()
        .err()
        .map(|e| e.problems)
        .unwrap_or_default();
        let text = err.join("\n");
        for needle in [
            "-<ordinal>",
            "--replicas",
            "--client-port",
            "--peer-port and --http-port must differ",
            "--listen-ip",
            "--dns-server",
            "--learner-stall-timeout",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        assert_eq!(err.len(), 7, "{text}");
    }

    #[test]
    fn missing_name_falls_back_to_hostname() {
        let full = [
            "etcd-steward",
            "sidecar",
            "--hostname-fallback",
            "db-4",
            "--replicas",
            "5",
        ];
        let Command::Sidecar(s) = parse(&full).command else {
            unreachable!()
        };
        let c = s.common.validate().map_err(|e| e.to_string());
        assert_eq!(c.map(|c| c.identity.ordinal), Ok(4));
    }

    #[test]
    fn init_takes_extra_etcd_args_after_double_dash() {
        let Command::Init(i) = parse(&[
            "etcd-steward",
            "init",
            "--name",
            "etcd-0",
            "--replicas",
            "1",
            "--dry-run",
            "--",
            "--quota-backend-bytes",
            "8589934592",
        ])
        .command
        else {
            unreachable!()
        };
        assert!(i.dry_run);
        assert_eq!(i.etcd_args, ["--quota-backend-bytes", "8589934592"]);
    }

    #[test]
    fn a_missing_etcd_binary_is_a_configuration_error() {
        let Command::Init(i) = parse(&[
            "etcd-steward",
            "init",
            "--name",
            "etcd-0",
            "--replicas",
            "1",
            "--etcd-bin",
            "/nonexistent/etcd",
        ])
        .command
        else {
            unreachable!()
        };
        let err = i
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("--etcd-bin \"/nonexistent/etcd\" does not exist"),
            "{err}"
        );
    }

    #[test]
    fn unknown_options_are_rejected_by_the_parser() {
        assert!(Cli::try_parse_from(["etcd-steward", "init", "--bogus"]).is_err());
    }

    /// Backup options (issue 10).
    #[allow(clippy::unwrap_used)]
    mod backup_options {
        use super::*;

        #[test]
        fn without_a_backup_url_there_are_no_backups() {
            let c = common(&["--name", "etcd-0", "--replicas", "3"])
                .validate()
                .unwrap();
            assert_eq!(c.backup, None);
        }

        #[test]
        fn backup_options_default_to_latest_restore_every_30m_keeping_48() {
            let c = common(&[
                "--name",
                "etcd-0",
                "--replicas",
                "3",
                "--backup-url",
                "s3://bucket/etcd",
            ])
            .validate()
            .unwrap();
            let b = c.backup.unwrap();
            assert_eq!(b.url, "s3://bucket/etcd");
            assert_eq!(b.interval, Duration::from_secs(1800));
            assert_eq!(b.keep, 48);
            assert_eq!(b.restore, crate::backup::RestoreChoice::Latest);
            // Which tool is found depends on this machine's PATH (tool.rs tests the search).
            assert_eq!(b.tool.bump_revision, 1_000_000_000);
        }

        #[test]
        fn bad_backup_options_are_reported_with_the_others() {
            let e = common(&[
                "--name",
                "etcd-0",
                "--replicas",
                "0",
                "--backup-url",
                "ftp://x",
                "--backup-interval",
                "soon",
                "--backup-keep",
                "0",
                "--restore",
                "../x",
                "--restore-bump-revision",
                "1e9",
            ])
            .validate()
            .unwrap_err();
            let all = e.problems.join("\n");
            for flag in [
                "--replicas",
                "--backup-url",
                "--backup-interval",
                "--backup-keep",
                "--restore",
                "--restore-bump-revision",
            ] {
                assert!(all.contains(flag), "{flag} missing from {all}");
            }
        }

        #[test]
        fn a_named_restore_needs_a_backup_url() {
            let e = common(&["--name", "etcd-0", "--replicas", "1", "--restore", "latest"])
                .validate()
                .unwrap_err();
            assert!(e.problems[0].contains("--backup-url"), "{e}");
            let c = common(&[
                "--name",
                "etcd-0",
                "--replicas",
                "1",
                "--backup-url",
                "file:///b",
                "--restore",
                "never",
                "--etcdutl-bin",
                "/usr/bin/etcdctl",
            ])
            .validate()
            .unwrap();
            let b = c.backup.unwrap();
            assert_eq!(b.restore, crate::backup::RestoreChoice::Never);
            assert_eq!(b.tool.kind, crate::backup::tool::ToolKind::Etcdctl);
        }
    }
    #[test]
    fn defrag_options_default_on_and_bad_ones_name_their_constraint() {
        let c = match common(&["--name", "etcd-0", "--replicas", "3"]).validate() {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let t = c.defrag.threshold.map(|t| (t.free_percent, t.free_bytes));
        assert_eq!(t, Some((50, 100 << 20)));
        assert_eq!(c.defrag.schedule, None);
        assert_eq!(c.defrag.quota, 2 << 30);
        let c = common(&[
            "--name",
            "etcd-0",
            "--replicas",
            "3",
            "--defrag-threshold",
            "0",
            "--defrag-schedule",
            "24h",
            "--quota-backend-bytes",
            "16MiB",
        ])
        .validate();
        let c = c.map_err(|e| e.to_string());
        assert!(
            matches!(&c, Ok(c) if c.defrag.threshold.is_none()
            && c.defrag.schedule == Some(Duration::from_secs(86_400))
            && c.defrag.quota == 16 << 20),
            "{c:?}"
        );
        let e = common(&[
            "--name",
            "etcd-0",
            "--replicas",
            "3",
            "--defrag-threshold",
            "half",
            "--defrag-schedule",
            "1s",
            "--quota-backend-bytes",
            "lots",
        ])
        .validate();
        let text = e
            .map(|_| ())
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert!(text.contains("--defrag-threshold"), "{text}");
        assert!(
            text.contains("--defrag-schedule must be a duration of at least 1m"),
            "{text}"
        );
        assert!(text.contains("--quota-backend-bytes"), "{text}");
    }
}
