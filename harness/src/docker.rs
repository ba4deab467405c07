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

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use tokio::process::Command;
use tokio::time::Instant;

use crate::client::{http_get, Clients};
use crate::writer::write_key;
use crate::{logs, Etcd};

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

// ---- docker CLI ------------------------------------------------------------------------

/// Runs `docker ARGS`; its trimmed stdout, or an error naming the command and its stderr.
pub async fn docker(args: &[&str]) -> Result<String, String> {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run docker {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "docker {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `docker ARGS`, panicking on failure.
pub async fn must(args: &[&str]) -> String {
    docker(args).await.unwrap_or_else(|e| panic!("{e}"))
}

/// `docker ARGS` from a synchronous context (Drop); stdout+stderr, errors ignored.
fn docker_sync(args: &[&str]) -> String {
    match std::process::Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => format!("cannot run docker: {e}"),
    }
}

// ---- etcd versions ---------------------------------------------------------------------

/// `-v` options that put the host's etcd 3.4 and its shared libraries into a pod.
async fn etcd_3_4_mounts() -> Vec<String> {
    let bin = Etcd::V3_4.bin().display().to_string();
    let out = Command::new("ldd")
        .arg(&bin)
        .output()
        .await
        .unwrap_or_else(|e| panic!("ldd must be installed: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut mounts = vec![format!("{bin}:{ETCD_3_4_IN_POD}:ro")];
    if text.contains("not a dynamic executable") || !out.status.success() {
        return mounts;
    }
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux….so.2 (0x…)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            mounts.push(format!("{p}:{p}:ro"));
        }
    }
    mounts
}

// ---- the cluster -----------------------------------------------------------------------

static NEXT_SUBNET: AtomicU32 = AtomicU32::new(0);

/// A /24 under 10.213.0.0/16 not used by another Docker network: the third octet.
async fn create_network(name: &str, run: &str) -> u8 {
    let _ = docker(&["network", "rm", name]).await;
    let base = std::process::id();
    let mut last = String::new();
    for _ in 0..256 {
        let n = ((base.wrapping_mul(7) + NEXT_SUBNET.fetch_add(1, Ordering::SeqCst)) % 250) as u8;
        let subnet = format!("10.213.{n}.0/24");
        match docker(&[
            "network",
            "create",
            "--driver",
            "bridge",
            "--subnet",
            &subnet,
            "--label",
            &format!("esf.run={run}"),
            "--label",
            &host_label(),
            name,
        ])
        .await
        {
            Ok(_) => return n,
            Err(e) if e.contains("overlap") => last = e,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("no free 10.213.N.0/24 for network {name}: {last}");
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

    fn common_args(&self, o: u32) -> Vec<String> {
        let mut args = vec![
            format!("--name=etcd-{o}"),
            format!("--replicas={}", self.replicas),
            "--listen-ip=0.0.0.0".to_string(),
        ];
        if let Some(t) = &self.stall_timeout {
            args.push(format!("--learner-stall-timeout={t}"));
        }
        args.push(format!("--control-token-file={CONTROL_MOUNT}/token"));
        args.extend(self.extra_args.iter().cloned());
        if self.peer_tls.is_some() {
            for (opt, file) in [
                ("--peer-cert-file", "peer.pem"),
                ("--peer-key-file", "peer-key.pem"),
                ("--peer-trusted-ca-file", "peer-ca.pem"),
            ] {
                args.push(format!("{opt}={PEER_TLS_MOUNT}/{file}"));
            }
        }
        args
    }

    /// `-v` options that mount the control token (read-only).
    fn control_args(&self) -> Vec<String> {
        vec![
            "-v".into(),
            format!("{}:{CONTROL_MOUNT}:ro", self.control.display()),
        ]
    }

    /// `-v` options that mount the peer certificates (read-only), once enabled.
    fn peer_tls_args(&self) -> Vec<String> {
        match &self.peer_tls {
            Some(dir) => vec![
                "-v".into(),
                format!("{}:{PEER_TLS_MOUNT}:ro", dir.display()),
            ],
            None => Vec::new(),
        }
    }

    /// `-e`/`-v` options that give a container the backup store (`file://` on a volume
    /// mounted at [`BACKUP_MOUNT`]; read-only for init, which only restores from it).
    fn backup_args(&self, writable: bool) -> Vec<String> {
        let Some(vol) = &self.backups else {
            return Vec::new();
        };
        let mode = if writable { "rw" } else { "ro" };
        vec![
            "-e".into(),
            format!("ETCD_STEWARD_BACKUP_URL=file://{BACKUP_MOUNT}"),
            "-e".into(),
            format!("ETCD_STEWARD_BACKUP_INTERVAL={}", self.backup_interval),
            "-e".into(),
            "ETCD_STEWARD_BACKUP_SCRATCH_DIR=/tmp/backup-scratch".into(),
            "-v".into(),
            format!("{vol}:{BACKUP_MOUNT}:{mode}"),
        ]
    }

    fn security_args(&self) -> Vec<String> {
        [
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--user",
            "65532:65532",
            "--tmpfs",
            "/tmp",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(labels(&self.run))
        .collect()
    }

    /// Creates a pod's volume (if missing) and its etcd container, without starting it.
    pub async fn create_etcd_container(&mut self, o: u32, etcd: Etcd) {
        self.create_etcd_container_with(o, etcd, &[]).await;
    }

    /// As [`Self::create_etcd_container`], passing `etcd_args` to etcd (`init -- ARGS`).
    pub async fn create_etcd_container_with(&mut self, o: u32, etcd: Etcd, etcd_args: &[&str]) {
        assert!(
            !etcd.tls() && etcd != Etcd::V3_5Current,
            "Docker pods run the image's etcd 3.5 or the host's 3.4; {etcd:?} is a loopback set's"
        );
        if etcd == Etcd::V3_4 && self.mounts_3_4.is_empty() {
            self.mounts_3_4 = etcd_3_4_mounts().await;
        }
        self.pods.insert(o);
        let vol = self.volume(o);
        if docker(&["volume", "inspect", &vol]).await.is_err() {
            let mut args = vec!["volume".to_string(), "create".to_string()];
            args.extend(labels(&self.run));
            args.push(vol.clone());
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            must(&refs).await;
        }
        let cluster_ip = self.fresh_cluster_ip(o);
        let mut args: Vec<String> = vec![
            "create".into(),
            "--name".into(),
            self.etcd_ctr(o),
            "--hostname".into(),
            format!("etcd-{o}"),
            "--network".into(),
            self.net.clone(),
            "--ip".into(),
            cluster_ip.to_string(),
            "--network-alias".into(),
            self.host(o),
            "-e".into(),
            "ETCD_STEWARD_LOG=info".into(),
            "-v".into(),
            format!("{vol}:/var/lib/etcd"),
        ];
        args.extend(self.backup_args(false));
        args.extend(self.control_args());
        args.extend(self.peer_tls_args());
        if self.peer_tls.is_some() {
            // The headless Service's name, resolving to every pod: etcd checks that a peer's
            // client certificate names the address it connects from, by an IP or by a DNS
            // name that resolves to it (a wildcard resolves to nothing).
            args.extend(["--network-alias".into(), SERVICE_HOST.into()]);
        }
        args.extend(self.security_args());
        if etcd == Etcd::V3_4 {
            for m in &self.mounts_3_4 {
                args.push("-v".into());
                args.push(m.clone());
            }
        }
        args.push(image());
        args.push("etcd-steward".into());
        args.push("init".into());
        args.extend(self.common_args(o));
        if etcd == Etcd::V3_4 {
            args.push(format!("--etcd-bin={ETCD_3_4_IN_POD}"));
        }
        if !etcd_args.is_empty() {
            args.push("--".into());
            args.extend(etcd_args.iter().map(|a| a.to_string()));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        must(&refs).await;
        let ip = self.ip(o).to_string();
        must(&[
            "network",
            "connect",
            "--ip",
            &ip,
            &self.mgmt,
            &self.etcd_ctr(o),
        ])
        .await;
    }

    /// Creates and starts a whole pod (volume kept if it exists).
    pub async fn create_pod(&mut self, o: u32, etcd: Etcd) {
        self.create_pod_with(o, etcd, &[]).await;
    }

    /// As [`Self::create_pod`], passing `etcd_args` to etcd.
    pub async fn create_pod_with(&mut self, o: u32, etcd: Etcd, etcd_args: &[&str]) {
        self.create_etcd_container_with(o, etcd, etcd_args).await;
        must(&["start", &self.etcd_ctr(o)]).await;
        if let Err(e) = self.run_sidecar(o).await {
            // Only a pod whose etcd container already exited (a misconfigured etcd) may
            // lack its sidecar: there is no network namespace left to join.
            assert!(
                !self.running(&self.etcd_ctr(o)).await,
                "pod {o}'s sidecar did not start: {e}"
            );
            self.say(&format!(
                "pod {o}: its etcd container exited before the sidecar could join it"
            ));
        }
        self.say(&format!("pod {o} created and started ({etcd:?})"));
    }

    async fn run_sidecar(&self, o: u32) -> Result<String, String> {
        let mut args: Vec<String> = vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            self.steward_ctr(o),
            "--network".into(),
            format!("container:{}", self.etcd_ctr(o)),
            // The pod's process namespace, shared as in the manifests: the sidecar stops
            // etcd once for a recovery.
            "--pid".into(),
            format!("container:{}", self.etcd_ctr(o)),
            "-e".into(),
            "ETCD_STEWARD_LOG=info".into(),
            "-v".into(),
            format!("{}:/var/lib/etcd:ro", self.volume(o)),
        ];
        args.extend(self.backup_args(true));
        args.extend(self.control_args());
        args.extend(self.peer_tls_args());
        args.extend(self.security_args());
        args.push(image());
        args.push("etcd-steward".into());
        args.push("sidecar".into());
        args.extend(self.common_args(o));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&refs).await
    }

    /// Starts a stopped pod: its etcd container, then the sidecar in its (new) namespace.
    pub async fn start(&self, o: u32) {
        must(&["start", &self.etcd_ctr(o)]).await;
        must(&["start", &self.steward_ctr(o)]).await;
        self.say(&format!("pod {o} started"));
    }

    /// What kubelet does for a container whose process exited: for every pod whose etcd
    /// container stopped by itself, starts it again, and restarts its sidecar, whose
    /// network and process namespaces were that container's. Returns those pods.
    pub async fn restart_exited(&self) -> Vec<u32> {
        let mut restarted = Vec::new();
        for o in self.ordinals() {
            let ctr = self.etcd_ctr(o);
            let exited = docker(&["inspect", "-f", "{{.State.Status}}", &ctr])
                .await
                .is_ok_and(|s| s == "exited");
            if exited && docker(&["start", &ctr]).await.is_ok() {
                let _ = docker(&["restart", "-t", "2", &self.steward_ctr(o)]).await;
                self.say(&format!(
                    "pod {o}: etcd container exited; restarted (as kubelet does)"
                ));
                restarted.push(o);
            }
        }
        restarted
    }

    /// `etcd-steward ARGS` run in pod `o`'s etcd container with the pod's options (what
    /// `kubectl exec etcd-o -c etcd -- etcd-steward ARGS` does): (exit code, stdout, stderr).
    pub async fn exec_steward(&self, o: u32, args: &[&str]) -> (i32, String, String) {
        self.exec_steward_in(&self.etcd_ctr(o), o, args).await
    }

    /// As [`Self::exec_steward`], in the pod's sidecar container (which holds the backup
    /// store writable: `kubectl exec etcd-o -c steward -- etcd-steward backup`).
    pub async fn exec_sidecar_steward(&self, o: u32, args: &[&str]) -> (i32, String, String) {
        self.exec_steward_in(&self.steward_ctr(o), o, args).await
    }

    async fn exec_steward_in(&self, ctr: &str, o: u32, args: &[&str]) -> (i32, String, String) {
        let mut cmd = tokio::process::Command::new("docker");
        cmd.args(["exec", ctr, "etcd-steward"])
            .args(args)
            .args(self.common_args(o));
        let out = cmd
            .output()
            .await
            .unwrap_or_else(|e| panic!("docker exec: {e}"));
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let r = (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        );
        self.say(&format!(
            "pod {o}: etcd-steward {} → {}",
            args.join(" "),
            r.0
        ));
        r
    }

    /// SIGKILLs the pod's containers (etcd first: the pod's etcd container is what dies).
    pub async fn kill(&self, o: u32) {
        for c in [self.etcd_ctr(o), self.steward_ctr(o)] {
            if let Err(e) = docker(&["kill", &c]).await {
                assert!(e.contains("is not running"), "{e}");
            }
        }
        self.say(&format!("pod {o} killed"));
    }

    /// Stops the pod gracefully (SIGTERM, then SIGKILL after 10 s), both containers at once.
    pub async fn stop(&self, o: u32) {
        must(&["stop", "-t", "10", &self.etcd_ctr(o), &self.steward_ctr(o)]).await;
        self.say(&format!("pod {o} stopped"));
    }

    /// Removes the pod's containers; with `wipe`, its volume too (the PVC is gone).
    pub async fn remove(&mut self, o: u32, wipe: bool) {
        let _ = docker(&["rm", "-f", &self.steward_ctr(o), &self.etcd_ctr(o)]).await;
        if wipe {
            must(&["volume", "rm", &self.volume(o)]).await;
        }
        self.pods.remove(&o);
        self.say(&format!(
            "pod {o} removed{}",
            if wipe { " with its volume" } else { "" }
        ));
    }

    /// Cuts the pod off the cluster network (it keeps the management network).
    pub async fn partition(&self, o: u32) {
        must(&["network", "disconnect", &self.net, &self.etcd_ctr(o)]).await;
        self.say(&format!("pod {o} partitioned from the cluster network"));
    }

    /// Reconnects it, with its DNS name and its own address.
    pub async fn heal(&self, o: u32) {
        let host = self.host(o);
        let ctr = self.etcd_ctr(o);
        let mut args = vec!["network", "connect", "--alias", host.as_str()];
        let ip = self.cluster_ips.get(&o).map(Ipv4Addr::to_string);
        if let Some(ip) = &ip {
            args.extend(["--ip", ip.as_str()]);
        }
        args.extend([self.net.as_str(), ctr.as_str()]);
        must(&args).await;
        self.say(&format!("pod {o} reconnected to the cluster network"));
    }

    /// A cluster-network address for pod `o`'s new container that no other pod holds, and
    /// not the one its earlier container had.
    fn fresh_cluster_ip(&mut self, o: u32) -> Ipv4Addr {
        let held: BTreeSet<Ipv4Addr> = self.cluster_ips.values().copied().collect();
        loop {
            let ip = Ipv4Addr::new(10, 213, self.net_octet, self.next_host);
            self.next_host = if self.next_host >= 249 {
                10
            } else {
                self.next_host + 1
            };
            if !held.contains(&ip) {
                self.cluster_ips.insert(o, ip);
                return ip;
            }
        }
    }

    /// The paths under `dir` of pod `o`'s volume (relative to the data directory, as
    /// `tar -t` lists them: `dir/`, `dir/a/`, `dir/a/f`), copied out of its etcd container
    /// (running or not); empty when `dir` does not exist.
    pub async fn volume_paths(&self, o: u32, dir: &str) -> Vec<String> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "docker cp '{}:/var/lib/etcd/{dir}' - | tar -t",
                self.etcd_ctr(o)
            ))
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run docker cp | tar -t: {e}"));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Whether a container runs.
    pub async fn running(&self, container: &str) -> bool {
        docker(&["inspect", "-f", "{{.State.Running}}", container])
            .await
            .map(|s| s == "true")
            .unwrap_or(false)
    }

    // ---- backups -----------------------------------------------------------------------

    /// Gives every pod created from now on a `file://` backup store, as
    /// manifests/overlays/backup-file does: a volume of the run's (`<run>-backups`) mounted at
    /// [`BACKUP_MOUNT`], writable by the sidecar and read-only for init.
    pub async fn enable_backups(&mut self) {
        let vol = format!("{}-backups", self.run);
        let mut args = vec!["volume".to_string(), "create".to_string()];
        args.extend(labels(&self.run));
        args.push(vol.clone());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        must(&refs).await;
        // A new volume is empty and root's. Mounted once where the image has a directory of
        // the agent's user (/var/lib/etcd), Docker gives it that directory's owner.
        let mut args: Vec<String> = vec![
            "run".into(),
            "--rm".into(),
            "--network".into(),
            "none".into(),
        ];
        args.extend(self.security_args());
        args.extend(["-v".into(), format!("{vol}:/var/lib/etcd"), image()]);
        args.extend(["etcd-steward".into(), "--version".into()]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        must(&refs).await;
        self.backups = Some(vol.clone());
        self.say(&format!(
            "backup store: volume {vol} at file://{BACKUP_MOUNT}"
        ));
    }

    /// Gives every pod created from now on peer TLS (`--peer-cert-file`, … with mutual TLS),
    /// as a StatefulSet rolled with the peer certificates mounted does: certificates for
    /// `*.etcd.default.svc.cluster.local` from a new peer CA, in a host directory mounted
    /// read-only at [`PEER_TLS_MOUNT`]. Pods created before keep talking plain HTTP.
    pub fn enable_peer_tls(&mut self) {
        let dir = std::env::temp_dir().join(format!("{}-peer-tls", self.run));
        crate::pki::Pki::generate(&dir, "etcd", "default", "cluster.local")
            .unwrap_or_else(|e| panic!("peer certificates in {}: {e}", dir.display()));
        self.say(&format!(
            "peer TLS for pods created from now on ({})",
            dir.display()
        ));
        self.peer_tls = Some(dir);
    }

    /// `etcd-steward backup` in pod `o`'s sidecar container: one snapshot now through its
    /// member, uploaded and checked; the manifest it printed.
    pub async fn backup_now(&self, o: u32) -> serde_json::Value {
        let ctr = self.steward_ctr(o);
        let mut args: Vec<String> =
            vec!["exec".into(), ctr, "etcd-steward".into(), "backup".into()];
        args.extend(self.common_args(o));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = must(&refs).await;
        let manifest: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("`backup` printed no JSON manifest ({e}): {out}"));
        self.say(&format!("backup through pod {o}: {out}"));
        manifest
    }

    /// `etcd-steward backup --list` in a throw-away container on the store's volume (no
    /// pod needed, so it works with every pod gone): one object per snapshot, newest first.
    pub async fn backup_list(&self) -> Vec<serde_json::Value> {
        assert!(self.backups.is_some(), "backup_list before enable_backups");
        let mut args: Vec<String> = vec![
            "run".into(),
            "--rm".into(),
            "--network".into(),
            "none".into(),
        ];
        args.extend(self.backup_args(false));
        args.extend(self.control_args());
        args.extend(self.security_args());
        args.extend([
            image(),
            "etcd-steward".into(),
            "backup".into(),
            "--list".into(),
        ]);
        args.extend(self.common_args(0));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = must(&refs).await;
        out.lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| {
                    panic!("`backup --list` printed a line that is not JSON ({e}): {l}")
                })
            })
            .collect()
    }

    // ---- talking to pods ---------------------------------------------------------------

    /// A client to pod `o`'s etcd (kept while it works).
    pub async fn client(&self, o: u32) -> Client {
        let url = self.client_url(o);
        match self.clients.get(&url).await {
            Ok(c) => c,
            Err(e) => panic!("a client of pod {o}: {e}"),
        }
    }

    /// GET from a pod's sidecar: (status, body), None when it does not answer.
    pub async fn http(&self, o: u32, path: &str) -> HttpAnswer {
        let addr = SocketAddr::new(IpAddr::V4(self.ip(o)), 8080);
        http_get(addr, path, Duration::from_secs(2), 1 << 20).await
    }

    /// Whether pod `o`'s sidecar says ready.
    pub async fn ready(&self, o: u32) -> bool {
        matches!(self.http(o, "/ready").await, Some((200, _)))
    }

    /// Pod `o`'s status, `None` when it does not answer.
    pub async fn status(&self, o: u32) -> Option<etcd_client::StatusResponse> {
        self.clients.status(&self.client_url(o)).await.ok()
    }

    /// Pod `o`'s member ID, 0 when it does not answer.
    pub async fn member_id(&self, o: u32) -> u64 {
        self.clients
            .member_id(&self.client_url(o))
            .await
            .unwrap_or_default()
    }

    /// The ID of pod `o`'s cluster, 0 when it does not answer.
    pub async fn cluster_id(&self, o: u32) -> u64 {
        self.clients
            .cluster_id(&self.client_url(o))
            .await
            .unwrap_or_default()
    }

    /// The member list as pod `o` sees it, `None` when it does not answer.
    pub async fn members(&self, o: u32) -> Option<Vec<etcd_client::Member>> {
        self.clients.members(&self.client_url(o)).await.ok()
    }

    /// The ordinal of the pod whose etcd leads, as every answering pod sees it.
    pub async fn leader(&self) -> Option<u32> {
        for o in self.ordinals() {
            if let Some(s) = self.status(o).await {
                let me = s.header().map(|h| h.member_id()).unwrap_or_default();
                if s.leader() != 0 && s.leader() == me {
                    return Some(o);
                }
            }
        }
        None
    }

    /// Waits until some pod leads; its ordinal.
    pub async fn wait_leader(&self, timeout: Duration) -> u32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(o) = self.leader().await {
                return o;
            }
            if Instant::now() > deadline {
                panic!("no leader within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Waits until every listed pod is ready and the cluster has exactly these voters.
    pub async fn wait_ready(&self, pods: &[u32], timeout: Duration) {
        let what = format!("pods {pods:?} ready, the only members, all voters");
        let deadline = Instant::now() + timeout;
        loop {
            // The sidecar's verdict, and etcd itself: it answers and sees a leader.
            let mut ok = true;
            for o in pods {
                let leader = self.status(*o).await.map(|s| s.leader()).unwrap_or(0);
                if leader == 0 || !self.ready(*o).await {
                    ok = false;
                    break;
                }
            }
            if ok {
                ok = match self.members(pods[0]).await {
                    Some(ms) => {
                        let names: BTreeSet<String> =
                            ms.iter().map(|m| m.name().to_string()).collect();
                        let want: BTreeSet<String> =
                            pods.iter().map(|o| format!("etcd-{o}")).collect();
                        ms.len() == pods.len()
                            && names == want
                            && ms.iter().all(|m| !m.is_learner())
                    }
                    None => false,
                };
            }
            if ok {
                self.say(&format!("{what}: yes"));
                return;
            }
            if Instant::now() > deadline {
                panic!("timed out after {timeout:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// A container's whole log (stdout then stderr; etcd-steward and etcd log to stderr).
    pub async fn logs(&self, container: &str) -> String {
        let out = Command::new("docker")
            .args(["logs", container])
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run docker logs {container}: {e}"));
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// The `action` of every init round the pod's current etcd container logged.
    pub async fn decisions(&self, o: u32) -> Vec<String> {
        logs::decisions(&self.logs(&self.etcd_ctr(o)).await)
    }

    /// Asserts that the init rounds pod `o` logged after the first `before` only restarted
    /// it on its own data (possibly after waiting for its peers): no new cluster, no
    /// membership change.
    pub async fn assert_restarted_on_its_data(&self, o: u32, before: usize) {
        let all = self.decisions(o).await;
        let since = &all[before.min(all.len())..];
        assert!(
            since.last().map(String::as_str) == Some("restart")
                && since.iter().all(|d| d == "restart" || d == "wait"),
            "pod {o} should have restarted on its data, decided {since:?} (all: {all:?})"
        );
    }

    // ---- the checks after every scenario -----------------------------------------------

    /// After a scenario: `pods` are the only members, all voters and ready; one leader;
    /// exactly one cluster ID (`cluster_id`, when given, the one it had at the start);
    /// every acknowledged write readable, and on every member.
    pub async fn check(&self, pods: &[u32], cluster_id: Option<u64>, acked: u64) {
        self.wait_ready(pods, Duration::from_secs(120)).await;
        // Exactly one cluster ID, one membership, one leader.
        let mut cids = BTreeSet::new();
        let mut leaders = BTreeSet::new();
        let mut memberships = BTreeSet::new();
        for o in pods {
            let s = self
                .status(*o)
                .await
                .unwrap_or_else(|| panic!("pod {o} answers status"));
            let h = s
                .header()
                .unwrap_or_else(|| panic!("pod {o} answered a status without header"));
            cids.insert(h.cluster_id());
            leaders.insert(s.leader());
            let ms = self
                .members(*o)
                .await
                .unwrap_or_else(|| panic!("pod {o} answers its member list"));
            assert!(
                ms.iter().all(|m| !m.is_learner()),
                "pod {o} sees a learner: {ms:?}"
            );
            assert_eq!(
                ms.len(),
                pods.len(),
                "pod {o}: pods {pods:?} are the only members: {ms:?}"
            );
            let ids: Vec<u64> = ms.iter().map(|m| m.id()).collect();
            memberships.insert(format!("{ids:?}"));
        }
        assert_eq!(cids.len(), 1, "exactly one cluster ID: {cids:x?}");
        if let Some(cid) = cluster_id {
            assert!(
                cids.contains(&cid),
                "the cluster kept its ID {cid:x}: {cids:x?}"
            );
        }
        assert_eq!(memberships.len(), 1, "one membership: {memberships:?}");
        assert_eq!(leaders.len(), 1, "one leader as seen by all: {leaders:x?}");
        assert!(!leaders.contains(&0), "a leader exists");
        // Every acknowledged write, linearizably, then on every member's own copy.
        self.check_writes(pods, acked).await;
        self.say(&format!(
            "checked: pods {pods:?} ready voters, one cluster {:x}, {acked} acknowledged writes on every member",
            cids.first().copied().unwrap_or_default()
        ));
    }

    /// Every acknowledged write `0..acked` is readable, and on every pod's own copy.
    pub async fn check_writes(&self, pods: &[u32], acked: u64) {
        let mut c = self.client(pods[0]).await;
        let got = c
            .get("w/", Some(GetOptions::new().with_prefix().with_keys_only()))
            .await
            .unwrap_or_else(|e| panic!("linearizable read of every write: {e}"));
        let present: BTreeSet<String> = got
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        let lost: Vec<u64> = (0..acked)
            .filter(|i| !present.contains(&write_key(*i)))
            .collect();
        assert!(
            lost.is_empty(),
            "{} of {acked} acknowledged writes lost, first: {:?}",
            lost.len(),
            &lost[..lost.len().min(20)]
        );
        for o in pods {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let mut c = self.client(*o).await;
                let n = c
                    .get(
                        "w/",
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_count_only()
                                .with_serializable(),
                        ),
                    )
                    .await
                    .map(|r| r.count())
                    .unwrap_or(-1);
                if n >= acked as i64 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "pod {o} holds {n} of {acked} acknowledged writes after 30 s"
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }

    /// The initial formation: `n` pods on `etcd`, all started together, ready as voters.
    pub async fn form(&mut self, n: u32, etcd: Etcd) -> u64 {
        for o in 0..n {
            self.create_pod(o, etcd).await;
        }
        let pods: Vec<u32> = (0..n).collect();
        self.wait_ready(&pods, Duration::from_secs(120)).await;
        let cid = self.cluster_id(0).await;
        assert_ne!(cid, 0);
        for o in 0..n {
            assert!(
                self.decisions(o).await.contains(&"bootstrap".to_string()),
                "pod {o} bootstrapped"
            );
        }
        self.say(&format!("cluster {cid:x} formed by {n} pods"));
        cid
    }

    /// Everything each container logged, for a failure report.
    pub fn dump_sync(&self) -> String {
        let mut out = String::new();
        let names = docker_sync(&[
            "ps",
            "-a",
            "--filter",
            &format!("label=esf.run={}", self.run),
            "--format",
            "{{.Names}}\t{{.Status}}",
        ]);
        out.push_str(&format!(
            "\n===== containers of {} =====\n{names}",
            self.run
        ));
        let mut names: Vec<&str> = names.lines().filter_map(|l| l.split('\t').next()).collect();
        names.sort();
        for name in names {
            let logs = docker_sync(&["logs", name]);
            // etcd-steward's own lines in full (they are few), etcd's last lines.
            let (steward, etcd): (Vec<&str>, Vec<&str>) =
                logs.lines().partition(|l| logs::is_steward_line(l));
            out.push_str(&format!(
                "\n----- {name}: etcd-steward ({} lines, last 60) -----\n",
                steward.len()
            ));
            for l in logs::last(&steward, 60) {
                out.push_str(l);
                out.push('\n');
            }
            if !etcd.is_empty() {
                out.push_str(&format!(
                    "----- {name}: etcd ({} lines, last 40) -----\n",
                    etcd.len()
                ));
                for l in logs::last(&etcd, 40) {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out
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

/// The labels on everything a run creates: the run, and the host whose process made it.
fn labels(run: &str) -> Vec<String> {
    vec![
        "--label".into(),
        format!("esf.run={run}"),
        "--label".into(),
        host_label(),
    ]
}

fn host_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("esf.host={}", host.trim())
}

/// Removes what earlier runs on this host left behind when their process was killed
/// before `Drop` could run (a CI time-out): runs `esf-<pid>-…` whose pid is gone.
fn sweep_dead_runs() {
    let filter = format!("label={}", host_label());
    let mut runs = BTreeSet::new();
    for list in [
        vec!["ps", "-a"],
        vec!["network", "ls"],
        vec!["volume", "ls"],
    ] {
        let mut args = list;
        args.extend(["--filter", &filter, "--format", "{{.Label \"esf.run\"}}"]);
        for run in docker_sync(&args).lines() {
            runs.insert(run.trim().to_string());
        }
    }
    for run in runs {
        let pid = run
            .strip_prefix("esf-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != std::process::id() && !alive(pid) {
                log(&run, "left behind by a dead test process: removing it");
                cleanup_sync(&run);
            }
        }
    }
}

/// Whether a process exists on this host (a zombie does not count).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S …": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Removes every container, network and volume labelled `esf.run=<run>`.
fn cleanup_sync(run: &str) {
    let label = format!("label=esf.run={run}");
    let ids = docker_sync(&["ps", "-aq", "--filter", &label]);
    let ids: Vec<&str> = ids.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f", "-v"];
        args.extend(ids);
        docker_sync(&args);
    }
    for kind in ["network", "volume"] {
        let names = docker_sync(&[kind, "ls", "-q", "--filter", &label]);
        let names: Vec<&str> = names.split_whitespace().collect();
        if !names.is_empty() {
            let mut args = vec![kind, "rm"];
            args.extend(names);
            docker_sync(&args);
        }
    }
}

fn log(run: &str, what: &str) {
    let _ = writeln!(std::io::stderr(), "[{run}] {what}");
}
