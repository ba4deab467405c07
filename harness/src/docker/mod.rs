//! Pods as Docker containers, for the fault suite (tests/fault.rs).
//!
//! A pod is two containers sharing one network namespace, as in Kubernetes:
//! - `<run>-etcd-<o>`: `etcd-steward init` (which execs etcd), on the scenario's cluster
//!   network with the network alias `etcd-<o>.etcd.default.svc.cluster.local`, so Docker's
//!   embedded DNS serves that name only while the container runs (a headless service with
//!   `publishNotReadyAddresses`). Its named volume `<run>-data-<o>` is the data directory.
//! - `<run>-steward-<o>`: `etcd-steward sidecar`, started with `--network container:<etcd>`
//!   and the same volume read-only. It lives in the etcd container's network namespace, so
//!   it is stopped and started (or removed and recreated) with the pod.
//!
//! Every pod is also attached to a second network, `<run>-mgmt`, at a fixed address: the
//! test (on the host) reaches etcd and the sidecar there, and a partition cuts only the
//! cluster network. Nothing is published on the host's ports.
//!
//! Everything a scenario creates carries the label `esf.run=<run>`; [`Cluster`]'s `Drop`
//! removes it all synchronously (containers, networks, volumes) even when the test failed,
//! after printing the containers' logs.

//!
//! Like an assertion, a Docker pod that cannot be made fails its scenario: the methods panic
//! with Docker's own words rather than return errors.

mod checks;
mod cli;
mod pods;

pub use cli::{docker, must};

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::Clients;
use cli::{cleanup_sync, create_network, log, sweep_dead_runs};

/// The test image `images/build-test-image.sh` builds.
pub const DEFAULT_IMAGE: &str = "etcd-steward:test";
/// Where Debian's etcd 3.4 is mounted in a pod that runs it.
const ETCD_3_4_IN_POD: &str = "/opt/etcd-3.4/etcd";
/// Where the backup store's volume is mounted in a pod ([`Cluster::enable_backups`]).
pub const BACKUP_MOUNT: &str = "/backups";
/// The headless Service's DNS name (pods with peer TLS carry it as a network alias).
pub const SERVICE_HOST: &str = "etcd.default.svc.cluster.local";
/// Where [`Cluster::enable_peer_tls`] mounts the peer certificates in a pod.
pub const PEER_TLS_MOUNT: &str = "/etc/etcd-steward/peer-tls";

/// Scenarios running at once (`STEWARD_FAULT_PARALLEL`, default 2). A heavy scenario takes
/// every slot.
static SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
static SLOTS_INIT: std::sync::Once = std::sync::Once::new();

/// How many scenarios may run at once.
pub fn parallelism() -> u32 {
    std::env::var("STEWARD_FAULT_PARALLEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(2)
}

/// Waits for a turn: `exclusive` scenarios (timing-sensitive ones) run alone.
pub async fn slot(exclusive: bool) -> tokio::sync::SemaphorePermit<'static> {
    SLOTS_INIT.call_once(|| SLOTS.add_permits(parallelism() as usize));
    let n = if exclusive { parallelism() } else { 1 };
    SLOTS
        .acquire_many(n)
        .await
        .unwrap_or_else(|e| panic!("the scenario slots: {e}"))
}

/// The image pods run: `STEWARD_TEST_IMAGE`, or [`DEFAULT_IMAGE`].
pub fn image() -> String {
    std::env::var("STEWARD_TEST_IMAGE").unwrap_or_else(|_| DEFAULT_IMAGE.to_string())
}

/// Fails loudly when Docker or the test image is missing: CI has both.
pub async fn ensure_image() {
    let image = image();
    match docker(&["image", "inspect", "--format", "{{.Id}}", &image]).await {
        Ok(_) => {}
        Err(e) => panic!(
            "the fault suite needs Docker and the image {image}: build it with \
             `bash images/build-test-image.sh` (or set STEWARD_TEST_IMAGE). Docker said: {e}"
        ),
    }
}

/// Where the control token is mounted in every container (the chart's path).
const CONTROL_MOUNT: &str = "/var/run/etcd-steward/control";

/// Writes the scenario's control token into `dir/token`, readable by the containers' user.
fn write_control_token(dir: &std::path::Path, run: &str) {
    use std::os::unix::fs::PermissionsExt;
    let file = dir.join("token");
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&file, format!("control-{run}\n")))
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)))
        .and_then(|()| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)))
        .unwrap_or_else(|e| panic!("control token in {}: {e}", dir.display()));
}

/// One scenario's pods, networks and volumes (see the module's documentation).
pub struct Cluster {
    /// Prefix of every container, network and volume name of this scenario.
    pub run: String,
    /// `--replicas`.
    pub replicas: u32,
    /// `--learner-stall-timeout`, when given.
    pub stall_timeout: Option<String>,
    /// More options for every `etcd-steward` a pod runs (init, sidecar, exec), e.g.
    /// `--scale-in` and the Kubernetes API's.
    pub extra_args: Vec<String>,
    /// The backup store's volume, once [`Cluster::enable_backups`] made it.
    backups: Option<String>,
    /// The host directory of the peer certificates, once [`Cluster::enable_peer_tls`]
    /// made them.
    peer_tls: Option<std::path::PathBuf>,
    /// The host directory holding the control token (`token`), mounted read-only into
    /// every container at [`CONTROL_MOUNT`], as the chart mounts its Secret.
    control: std::path::PathBuf,
    /// `--backup-interval` of pods created with backups (default `1h`: the periodic
    /// snapshots stay out of the way of the ones a scenario takes).
    pub backup_interval: String,
    /// The cluster network (a partition cuts it).
    pub net: String,
    /// The management network the test reaches pods on.
    pub mgmt: String,
    mgmt_octet: u8,
    pods: BTreeSet<u32>,
    mounts_3_4: Vec<String>,
    started: Instant,
    clients: Clients,
    net_octet: u8,
    /// Each pod container's address on the cluster network, fixed when the container is
    /// created: kept across kills, restarts and partitions, as a Kubernetes pod keeps its IP
    /// while it lives (Docker would hand a restarted or reconnected container whatever
    /// address is free, another pod's old one included: a cut pod healed onto a new address
    /// left its peers' streams to the old one hanging until TCP gave up, and a cut pod's
    /// address taken by a restarted pod meanwhile could not be given back). A pod created
    /// anew (a lost volume) gets a new one, as a new pod would.
    cluster_ips: BTreeMap<u32, Ipv4Addr>,
    /// The last octet of the next fresh cluster-network address (10–249, then round again,
    /// skipping those in use; Docker's own dynamic addresses start at .2).
    next_host: u8,
}

/// What `/ready` and friends answered.
pub type HttpAnswer = Option<(u16, String)>;

impl Cluster {
    /// Networks for a scenario; no pod yet.
    pub async fn new(scenario: &str, replicas: u32) -> Cluster {
        ensure_image().await;
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(sweep_dead_runs);
        let run = format!("esf-{}-{scenario}", std::process::id());
        // A leftover of an earlier run with this very name (same pid) must not get in the way.
        cleanup_sync(&run);
        let net = format!("{run}-net");
        let mgmt = format!("{run}-mgmt");
        let net_octet = create_network(&net, &run).await;
        let mgmt_octet = create_network(&mgmt, &run).await;
        let control = std::env::temp_dir().join(format!("{run}-control"));
        write_control_token(&control, &run);
        log(
            &run,
            &format!("networks {net} and {mgmt} (10.213.{mgmt_octet}.0/24) created"),
        );
        Cluster {
            run,
            replicas,
            stall_timeout: None,
            extra_args: Vec::new(),
            backups: None,
            peer_tls: None,
            control,
            backup_interval: "1h".to_string(),
            net,
            mgmt,
            mgmt_octet,
            pods: BTreeSet::new(),
            mounts_3_4: Vec::new(),
            started: Instant::now(),
            clients: Clients::new(
                Duration::from_millis(500),
                Duration::from_secs(2),
                None,
                false,
            ),
            net_octet,
            cluster_ips: BTreeMap::new(),
            next_host: 10,
        }
    }

    /// Logs a step of the scenario, with the time since it began.
    pub fn say(&self, what: &str) {
        log(
            &self.run,
            &format!("[{:>6.1}s] {what}", self.started.elapsed().as_secs_f64()),
        );
    }

    /// Pod `o`'s stable name.
    pub fn host(&self, o: u32) -> String {
        format!("etcd-{o}.etcd.default.svc.cluster.local")
    }
    /// Pod `o`'s etcd container.
    pub fn etcd_ctr(&self, o: u32) -> String {
        format!("{}-etcd-{o}", self.run)
    }
    /// Pod `o`'s sidecar container.
    pub fn steward_ctr(&self, o: u32) -> String {
        format!("{}-steward-{o}", self.run)
    }
    /// Pod `o`'s volume.
    pub fn volume(&self, o: u32) -> String {
        format!("{}-data-{o}", self.run)
    }
    /// The pod's fixed address on the management network (how the test reaches it).
    pub fn ip(&self, o: u32) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.mgmt_octet, 10 + o as u8)
    }
    /// The host's address on the management network (its bridge's gateway): what a pod
    /// reaches a server of the test at, e.g. a fake Kubernetes API.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.mgmt_octet, 1)
    }
    /// Pod `o`'s etcd client URL on the management network.
    pub fn client_url(&self, o: u32) -> String {
        format!("http://{}:2379", self.ip(o))
    }
    /// The pods created so far.
    pub fn ordinals(&self) -> Vec<u32> {
        self.pods.iter().copied().collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let dump = self.dump_sync();
            let _ = writeln!(std::io::stderr(), "{dump}");
            if std::env::var("STEWARD_FAULT_KEEP").as_deref() == Ok("1") {
                let _ = writeln!(
                    std::io::stderr(),
                    "STEWARD_FAULT_KEEP=1: containers, networks and volumes labelled esf.run={} kept",
                    self.run
                );
                return;
            }
        }
        cleanup_sync(&self.run);
    }
}
