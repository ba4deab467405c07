//! The command line: every subcommand and option, with its environment variable and
//! default. Plain clap structs; validation is in the concern's own file.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

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
    /// The copies set aside on this volume (renamed, never deleted): each with why, size and
    /// age (--list, the default); --remove NAME prints what would go, --yes removes it.
    SetAside(SetAsideArgs),
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
    /// How often the leader's sidecar compares every voter's `HashKV` at one common revision
    /// to find a member whose data silently diverged (humantime: 10m, 1h); `0` turns it off.
    #[arg(
        long,
        env = "ETCD_STEWARD_CORRUPTION_CHECK_INTERVAL",
        default_value = "10m"
    )]
    pub corruption_check_interval: String,
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
    /// Issue this pod's own client and peer certificates from the CAs in this directory
    /// (`peer-ca.crt`, `peer-ca.key`, `client-ca.crt`, `client-ca.key`: the chart's
    /// `<name>-ca` Secret), into `--tls-issued-dir`, and renew them before they expire;
    /// instead of the six `--*-file` TLS options, which then follow from it.
    #[arg(long, env = "ETCD_STEWARD_TLS_ISSUER_DIR")]
    pub tls_issuer_dir: Option<PathBuf>,
    /// Where the issued certificates go: a directory of this pod's own that both
    /// containers mount (an emptyDir).
    #[arg(
        long,
        env = "ETCD_STEWARD_TLS_ISSUED_DIR",
        default_value = "/var/run/etcd-steward/tls"
    )]
    pub tls_issued_dir: PathBuf,
    /// How long each issued certificate is valid; renewed with a third of it left.
    #[arg(long, env = "ETCD_STEWARD_TLS_ISSUED_VALIDITY", default_value = "720h")]
    pub tls_issued_validity: String,
    /// More names or addresses the issued certificates carry, comma-separated (the client
    /// Service's names).
    #[arg(long, env = "ETCD_STEWARD_TLS_SAN", value_delimiter = ',')]
    pub tls_san: Vec<String>,
    /// The common name every peer certificate of this StatefulSet carries: etcd
    /// (`--peer-cert-allowed-cn`) and the sidecar's peer surface admit no other peer.
    /// With `--tls-issuer-dir`, `<statefulset>-peer` unless given.
    #[arg(long, env = "ETCD_STEWARD_PEER_CERT_ALLOWED_CN")]
    pub peer_cert_allowed_cn: Option<String>,
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
    /// Kubernetes Events (events.k8s.io/v1) for every act that changes membership or data,
    /// or that a person must act on, posted on this pod (needs RBAC create and patch on
    /// events.k8s.io events). On whenever the API is known; best-effort, never in a
    /// decision's way.
    #[arg(long, env = "ETCD_STEWARD_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub events: bool,
    /// This pod's UID (the downward API's metadata.uid), so that its Events are not shown
    /// on a later pod of the same name.
    #[arg(long = "pod-uid", env = "POD_UID", hide = true)]
    pub pod_uid: Option<String>,
}

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
    /// The sidecar that takes snapshots (the leader's) also archives every change etcd
    /// makes, in segments written this often (humantime: 5s, 1m); `0` turns it off.
    #[arg(long, env = "ETCD_STEWARD_ARCHIVE_INTERVAL", default_value = "5s")]
    pub archive_interval: String,
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
    /// How new snapshots are compressed before any encryption: `zstd` (streamed, level 3)
    /// or `none`. Restores read either, whatever this says (each manifest records it).
    #[arg(long, env = "ETCD_STEWARD_BACKUP_COMPRESSION", default_value = "zstd")]
    pub backup_compression: String,
}

/// `backup`'s options: the sidecar's, and what to do.
#[derive(Debug, Args)]
pub struct BackupCmdArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// List the stored snapshots, newest first, each with how far it restores through the
    /// archive: one JSON object per line (`-o json`, the default), or a screen with the
    /// restorable range first (`-o text`).
    #[arg(long, conflicts_with = "drill")]
    pub list: bool,
    /// `--list`'s form: `json` (one object per snapshot) or `text`.
    #[arg(short = 'o', long = "output", default_value = "json", value_parser = ["text", "json"])]
    pub output: String,
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

/// `set-aside`'s options.
#[derive(Debug, Args)]
pub struct SetAsideArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// List the copies (the default).
    #[arg(long, conflicts_with = "remove")]
    pub list: bool,
    /// The copy to remove, by the name `--list` shows (`<unix-time>-<why>`).
    #[arg(long, value_name = "NAME")]
    pub remove: Option<String>,
    /// Carry the removal out.
    #[arg(long, requires = "remove")]
    pub yes: bool,
    /// `text` or `json`, for the list.
    #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

/// `status`'s options.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// `text` (one screen) or `json` (the same data, for scripts).
    #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// Instead of the screen, one timeline of every pod's acts, newest last: the decisions
    /// `init` recorded on each volume and each sidecar's acts (time, pod, act, reason).
    #[arg(long)]
    pub history: bool,
    /// With --history, only the acts of this last while (`1h`, `30m`, `2d`).
    #[arg(long, requires = "history", value_parser = humantime::parse_duration)]
    pub since: Option<Duration>,
}

/// `restore`'s options: exactly one of `--snapshot`, `--to-revision`, `--to-time`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("point").required(true).multiple(false).args(["snapshot", "to_revision", "to_time"])))]
pub struct SnapshotRestoreArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The snapshot's name, as `etcd-steward backup --list` shows it.
    #[arg(long)]
    pub snapshot: Option<String>,
    /// Take the cluster back to this revision: the newest usable snapshot at or before it,
    /// with the archive replayed onto it up to it.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub to_revision: Option<i64>,
    /// Take the cluster back to this moment (RFC 3339 with its offset: 2026-11-27T10:01:59Z,
    /// 2026-11-27T11:01:59+01:00): the last revision archived at or before it.
    // Held as Unix milliseconds.
    #[arg(long, value_parser = crate::units::parse_moment)]
    pub to_time: Option<u64>,
    /// Carry the plan out and follow it until the restored cluster serves.
    #[arg(long)]
    pub yes: bool,
    /// With --yes, how long to follow the restore before giving up (it goes on in the pods).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}
