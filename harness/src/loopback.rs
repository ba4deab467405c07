//! A loopback "StatefulSet": a dnsmasq serving the pods' stable names on 127.0.N.1 (a name
//! resolves only while it is published), and per pod either the agent (a `sidecar`
//! process, and `init`, which execs real etcd) or a plain etcd started by hand with a
//! static command line (the benchmark's baseline). etcd of both kinds runs in a private
//! mount namespace whose /etc/resolv.conf names that dnsmasq, so both resolve the same
//! names through the same server. Each set has its own 127.0.N.0/24; pod `o` is 127.0.N.(10+o).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, Member, StatusResponse};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::client::{http_get, Clients};
use crate::dns::{Answer, Dnsmasq, DOMAIN};
use crate::pki::Pki;
use crate::{logs, procs, Error, Etcd, Result};

/// The headless service (and the prefix of every pod's name).
pub const SERVICE: &str = "etcd";

static NEXT_NET: AtomicU32 = AtomicU32::new(0);

/// The next third octet of `count` starting at `base` (127.0.N.0/24), in turn.
pub fn next_net(base: u8, count: u8) -> u8 {
    let n = NEXT_NET.fetch_add(1, Ordering::SeqCst) % u32::from(count.max(1));
    base.saturating_add(n as u8)
}

/// The first network's third octet: `STEWARD_TEST_NET` (20 to 200), 20 by default.
fn test_net_base() -> u8 {
    std::env::var("STEWARD_TEST_NET")
        .ok()
        .and_then(|n| n.parse::<u8>().ok())
        .filter(|n| (20..=200).contains(n))
        .unwrap_or(20)
}

/// What a pod runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// etcd-steward `init` + `sidecar` per pod.
    Agent,
    /// etcd started by hand with a static command line.
    Plain,
}

/// How a plain etcd starts.
pub enum PlainStart {
    /// A new cluster from the full static `--initial-cluster` (also used to restart: etcd
    /// ignores the initial-cluster flags when its data directory holds a WAL).
    New,
    /// Joining a running cluster (after MemberAdd) with this `--initial-cluster`.
    Existing(String),
}

/// When a set's directory (logs and data) outlives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// When the scenario failed: the thread panics (a test).
    OnPanic,
    /// When [`Set::shutdown`] was not reached (a benchmark scenario that returned an error).
    UnlessShutDown,
    /// Always.
    Always,
}

/// How to build a [`Set`].
#[derive(Debug, Clone)]
pub struct Setup {
    /// The `etcd-steward` binary.
    pub steward: PathBuf,
    /// The etcd binary.
    pub etcd: PathBuf,
    /// TLS for clients and peers (a [`Pki`] is generated).
    pub tls: bool,
    /// `--replicas`: the initial size; pods can be added beyond it.
    pub replicas: u32,
    /// The third octet of the set's network.
    pub net: u8,
    /// Prefix of the set's temporary directory.
    pub dir_prefix: String,
    /// `ETCD_STEWARD_LOG` of the agent's processes.
    pub log_filter: String,
    /// `--learner-stall-timeout`, when given.
    pub stall_timeout: Option<String>,
    /// When the set's directory is kept.
    pub keep: Keep,
    /// Connect time-out of the etcd clients.
    pub connect_timeout: Duration,
    /// Call time-out of the etcd clients.
    pub timeout: Duration,
    /// Time-out of a GET from a sidecar.
    pub http_timeout: Duration,
    /// Keep one etcd client per pod (see [`Clients`]).
    pub reuse_clients: bool,
}

impl Setup {
    /// What the integration tests use: `etcd`'s binary, a fresh network from 127.0.20.0
    /// on (from 127.0.`STEWARD_TEST_NET`.0, to keep apart from runs that share the machine
    /// without `flock /tmp/steward-it.lock`), logs at `STEWARD_TEST_LOG` (default info), the directory kept when a test fails.
    pub fn for_tests(steward: impl Into<PathBuf>, etcd: Etcd, replicas: u32) -> Setup {
        Setup {
            steward: steward.into(),
            etcd: etcd.bin(),
            tls: etcd.tls(),
            replicas,
            net: next_net(test_net_base(), 180),
            dir_prefix: "steward-it-".into(),
            log_filter: std::env::var("STEWARD_TEST_LOG").unwrap_or_else(|_| "info".into()),
            stall_timeout: Some("5m".into()),
            keep: Keep::OnPanic,
            connect_timeout: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
            http_timeout: Duration::from_secs(2),
            reuse_clients: false,
        }
    }
}

/// One pod: its address, its volume and its processes.
pub struct Pod {
    /// The pod's ordinal.
    pub ordinal: u32,
    /// Where its etcd and sidecar listen.
    pub ip: Ipv4Addr,
    /// Its volume.
    pub data_dir: PathBuf,
    /// `init` (which becomes etcd) or the plain etcd.
    etcd: Option<Child>,
    sidecar: Option<Child>,
    /// Counts the pod's starts: each start logs to files of its own.
    incarnation: u32,
    /// The etcd binary this pod's init starts, when not the set's (an upgrade, a downgrade).
    etcd_bin: Option<PathBuf>,
}

/// A loopback StatefulSet (see the module's documentation).
pub struct Set {
    /// What each pod runs.
    pub kind: Kind,
    /// The etcd binary.
    etcd: PathBuf,
    steward: PathBuf,
    /// `--replicas`.
    pub replicas: u32,
    /// The third octet of the set's network.
    pub net: u8,
    /// `--learner-stall-timeout` for every pod started from now on.
    pub stall_timeout: Option<String>,
    /// More etcd-steward options for every pod started from now on.
    pub extra_args: Vec<String>,
    /// The control token file every pod's sidecar and commands are given
    /// (`--control-token-file`), as the chart and the manifests mount one Secret into both
    /// containers; `None` for a set without it.
    pub control_token: Option<PathBuf>,
    /// The certificates, when the set talks TLS.
    pub pki: Option<Pki>,
    /// Every pod the set has, started or not.
    pub pods: Vec<Pod>,
    root: Option<tempfile::TempDir>,
    root_path: PathBuf,
    dns: Dnsmasq,
    published: BTreeSet<u32>,
    /// Names published at another pod's address than their own (DNS answering wrong).
    wrong_addresses: BTreeMap<u32, Ipv4Addr>,
    clients: Clients,
    token: String,
    log_filter: String,
    http_timeout: Duration,
    keep: Keep,
    finished: bool,
    last_change: Option<Instant>,
    /// Network partitions between the pods, once [`Set::enable_partitions`] was called.
    partitions: Option<Partitions>,
    /// Size-limited volumes, once [`Set::limit_volumes`] was called.
    volumes: Option<LimitedVolumes>,
}

impl Set {
    /// A set for an integration test ([`Setup::for_tests`]) with `replicas` initial pods.
    pub async fn new(steward: impl Into<PathBuf>, etcd: Etcd, replicas: u32) -> Result<Set> {
        Set::with(Setup::for_tests(steward, etcd, replicas), Kind::Agent).await
    }

    /// A set of `setup.replicas` pods of `kind`, none started; its DNS server answers.
    pub async fn with(setup: Setup, kind: Kind) -> Result<Set> {
        let net = setup.net;
        let root = tempfile::Builder::new()
            .prefix(&setup.dir_prefix)
            .tempdir()
            .map_err(Error::io("creating the set's directory"))?;
        let root_path = root.path().to_path_buf();
        let dns_ip = Ipv4Addr::new(127, 0, net, 1);
        let resolv = root_path.join("resolv.conf");
        std::fs::write(&resolv, format!("nameserver {dns_ip}\n"))
            .map_err(Error::io(format!("writing {}", resolv.display())))?;
        let dns = Dnsmasq::start(dns_ip, &root_path).await?;
        let control_token = root_path.join("control-token");
        std::fs::write(
            &control_token,
            format!("control-{net}-{}\n", std::process::id()),
        )
        .map_err(Error::io(format!("writing {}", control_token.display())))?;
        let pki = match setup.tls {
            true => Some(Pki::generate(
                &root_path.join("pki"),
                SERVICE,
                "default",
                DOMAIN,
            )?),
            false => None,
        };
        // Every pod's certificate is the same wildcard, so one name verifies them all.
        let tls = match &pki {
            Some(pki) => Some(pki.client_tls(&host(0))?),
            None => None,
        };
        let mut set = Set {
            kind,
            etcd: setup.etcd,
            steward: setup.steward,
            replicas: setup.replicas,
            net,
            stall_timeout: setup.stall_timeout,
            extra_args: Vec::new(),
            control_token: Some(control_token),
            pki,
            pods: Vec::new(),
            root: Some(root),
            root_path,
            dns,
            published: BTreeSet::new(),
            wrong_addresses: BTreeMap::new(),
            clients: Clients::new(
                setup.connect_timeout,
                setup.timeout,
                tls,
                setup.reuse_clients,
            ),
            token: format!("harness-{net}-{}", std::process::id()),
            log_filter: setup.log_filter,
            http_timeout: setup.http_timeout,
            keep: setup.keep,
            finished: false,
            last_change: None,
            partitions: None,
            volumes: None,
        };
        for o in 0..setup.replicas {
            set.add_pod(o)?;
        }
        Ok(set)
    }

    // ---- names and places ----------------------------------------------------------------

    /// The set's directory: logs, volumes, resolv.conf, certificates.
    pub fn root(&self) -> &Path {
        &self.root_path
    }

    /// The etcd binary pods run.
    pub fn etcd_bin(&self) -> &Path {
        &self.etcd
    }

    /// The etcd-steward binary pods run.
    pub fn steward_bin(&self) -> &Path {
        &self.steward
    }

    /// The DNS server's address.
    pub fn dns_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, self.net, 1)
    }

    /// Pod `o`'s stable name.
    pub fn host(&self, o: u32) -> String {
        host(o)
    }

    /// Pod `o`'s member name.
    pub fn member_name(&self, o: u32) -> String {
        format!("{SERVICE}-{o}")
    }

    fn scheme(&self) -> &'static str {
        if self.pki.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// Pod `o`'s peer URL, by name.
    pub fn peer_url(&self, o: u32) -> String {
        format!("{}://{}:2380", self.scheme(), self.host(o))
    }

    /// Pod `o`'s client URL, by address.
    pub fn client_url(&self, o: u32) -> String {
        format!("{}://{}:2379", self.scheme(), self.pod(o).ip)
    }

    /// Adds pod `o` (beyond the initial ones, for a scale-up); not started.
    pub fn add_pod(&mut self, o: u32) -> Result<()> {
        let dir = self.root_path.join(format!("pod-{o}"));
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        self.pods.push(Pod {
            ordinal: o,
            ip: Ipv4Addr::new(127, 0, self.net, 10 + o as u8),
            data_dir: dir.join("data"),
            etcd: None,
            sidecar: None,
            incarnation: 0,
            etcd_bin: None,
        });
        Ok(())
    }

    /// From its next start on, pod `o`'s init starts `etcd`'s binary instead of the set's:
    /// the image of a rolling upgrade (or of a downgrade).
    pub fn set_pod_etcd(&mut self, o: u32, etcd: Etcd) {
        self.pod_mut(o).etcd_bin = Some(etcd.bin());
    }

    /// Pod `o`; panics when the set has no such pod (a mistake in the scenario).
    pub fn pod(&self, o: u32) -> &Pod {
        match self.pods.iter().find(|p| p.ordinal == o) {
            Some(p) => p,
            None => panic!("the set has no pod {o}"),
        }
    }

    fn pod_mut(&mut self, o: u32) -> &mut Pod {
        match self.pods.iter_mut().find(|p| p.ordinal == o) {
            Some(p) => p,
            None => panic!("the set has no pod {o}"),
        }
    }

    /// Pod `o`'s volume.
    pub fn data_dir(&self, o: u32) -> &Path {
        &self.pod(o).data_dir
    }

    // ---- DNS -------------------------------------------------------------------------------

    fn write_hosts(&mut self) -> Result<()> {
        let records: Vec<(Ipv4Addr, String)> = self
            .published
            .iter()
            .map(|o| {
                let ip = self
                    .wrong_addresses
                    .get(o)
                    .copied()
                    .unwrap_or(self.pod(*o).ip);
                (ip, self.host(*o))
            })
            .collect();
        self.dns.serve(&records)
    }

    /// Publishes (or withdraws) a pod's DNS name, as a headless service does while the pod
    /// exists; dnsmasq reloads asynchronously.
    pub fn set_dns(&mut self, o: u32, published: bool) -> Result<()> {
        if published {
            self.published.insert(o);
        } else {
            self.published.remove(&o);
        }
        self.write_hosts()
    }

    /// Publishes pod `o`'s name at `ip` (another pod's address: DNS answering wrong), or
    /// at its own address again with `None`.
    pub fn set_dns_address(&mut self, o: u32, ip: Option<Ipv4Addr>) -> Result<()> {
        match ip {
            Some(ip) => self.wrong_addresses.insert(o, ip),
            None => self.wrong_addresses.remove(&o),
        };
        self.set_dns(o, true)
    }

    /// Publishes pods' names and waits until dnsmasq answers them (keeping its reload out
    /// of whatever is measured next).
    pub async fn publish(&mut self, pods: &[u32]) -> Result<()> {
        self.published.extend(pods);
        self.write_hosts()?;
        for o in pods {
            let want = Answer::Found(vec![IpAddr::V4(self.pod(*o).ip)]);
            self.dns
                .wait_answer(&self.host(*o), want, Duration::from_secs(10))
                .await?;
        }
        Ok(())
    }

    /// Withdraws pods' names (the pods are gone) and waits until they no longer resolve.
    pub async fn withdraw(&mut self, pods: &[u32]) -> Result<()> {
        for o in pods {
            self.published.remove(o);
        }
        self.write_hosts()?;
        for o in pods {
            self.dns
                .wait_answer(&self.host(*o), Answer::NotFound, Duration::from_secs(10))
                .await?;
        }
        Ok(())
    }

    // ---- processes -------------------------------------------------------------------------

    /// The etcd-steward options of pod `o` (both commands take them).
    pub fn common_args(&self, o: u32) -> Vec<String> {
        let pod = self.pod(o);
        let mut args = vec![
            format!("--name={}", self.member_name(o)),
            format!("--replicas={}", self.replicas),
            format!("--data-dir={}", pod.data_dir.display()),
            format!("--listen-ip={}", pod.ip),
            format!("--dns-server={}", self.dns.addr()),
        ];
        if let Some(t) = &self.stall_timeout {
            args.push(format!("--learner-stall-timeout={t}"));
        }
        args.push(format!("--cluster-domain={DOMAIN}"));
        args.extend(self.pki.iter().flat_map(Pki::args));
        args.extend(
            self.control_token
                .iter()
                .map(|t| format!("--control-token-file={}", t.display())),
        );
        // `{ordinal}` in an extra option becomes the pod's ordinal (per-pod paths, as a pod's
        // own emptyDir would be).
        args.extend(
            self.extra_args
                .iter()
                .map(|a| a.replace("{ordinal}", &o.to_string())),
        );
        args
    }

    /// Where the current start of pod `o` logs the output of `what` (`init`, `sidecar`,
    /// `etcd`).
    pub fn log_path(&self, o: u32, what: &str) -> PathBuf {
        let inc = self.pod(o).incarnation.max(1);
        self.root_path.join(format!("pod-{o}/{what}-{inc}.log"))
    }

    fn log_files(&self, o: u32, what: &str) -> Result<(std::fs::File, std::fs::File)> {
        let path = self.log_path(o, what);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(Error::io(format!("opening {}", path.display())))?;
        let g = f
            .try_clone()
            .map_err(Error::io(format!("opening {}", path.display())))?;
        Ok((f, g))
    }

    fn steward_command(&self, mut cmd: Command, o: u32, what: &str) -> Result<Command> {
        let (out, err) = self.log_files(o, what)?;
        cmd.env("ETCD_STEWARD_LOG", &self.log_filter)
            .env_remove("HOSTNAME")
            .stdout(out)
            .stderr(err);
        Ok(cmd)
    }

    /// Starts pod `o` the way its kind starts: publishes its name, then the agent's
    /// sidecar and init (→ etcd), or a plain etcd forming a new cluster.
    pub fn start(&mut self, o: u32) -> Result<()> {
        self.set_dns(o, true)?;
        match self.kind {
            Kind::Agent => {
                self.start_sidecar(o)?;
                self.start_init(o)
            }
            Kind::Plain => self.start_plain(o, &PlainStart::New),
        }
    }

    /// Starts pod `o`'s sidecar (a new start of the pod: new log files).
    pub fn start_sidecar(&mut self, o: u32) -> Result<()> {
        self.pod_mut(o).incarnation += 1;
        let mut cmd = Command::new(&self.steward);
        let args = self.common_args(o);
        // The pod's etcd, as its container has it (the drill runs it, and the restore tool
        // is looked for beside it), unless the scenario gives its own.
        let etcd_bin = (!args.iter().any(|a| a.starts_with("--etcd-bin"))).then(|| {
            let bin = self.pod(o).etcd_bin.as_ref().unwrap_or(&self.etcd);
            format!("--etcd-bin={}", bin.display())
        });
        cmd.arg("sidecar").args(args).args(etcd_bin);
        let cmd = self.steward_command(cmd, o, "sidecar")?;
        let child = procs::spawn(cmd, &self.steward)?;
        self.join_partitions(o, child.id())?;
        self.pod_mut(o).sidecar = Some(child);
        Ok(())
    }

    /// Starts pod `o`'s init (→ etcd) in the pod's mount namespace.
    pub fn start_init(&mut self, o: u32) -> Result<()> {
        self.start_init_with(o, &[])
    }

    /// As [`Self::start_init`], passing `extra_etcd_args` to etcd (`init -- ARGS`).
    pub fn start_init_with(&mut self, o: u32, extra_etcd_args: &[&str]) -> Result<()> {
        let mut cmd = procs::in_pod_namespace(&self.root_path.join("resolv.conf"), &self.steward);
        cmd.arg("init")
            .args(self.common_args(o))
            .arg(format!(
                "--etcd-bin={}",
                self.pod(o)
                    .etcd_bin
                    .as_ref()
                    .unwrap_or(&self.etcd)
                    .display()
            ))
            .arg("--")
            .args(extra_etcd_args);
        let cmd = self.steward_command(cmd, o, "init")?;
        let child = procs::spawn(cmd, &self.steward)?;
        self.join_partitions(o, child.id())?;
        self.pod_mut(o).etcd = Some(child);
        Ok(())
    }

    /// The static command line a person would write for member `o`.
    pub fn plain_args(&self, o: u32, start: &PlainStart) -> Vec<String> {
        let pod = self.pod(o);
        let mut args = vec![
            format!("--name={}", self.member_name(o)),
            format!("--data-dir={}", pod.data_dir.display()),
            format!("--listen-peer-urls=http://{}:2380", pod.ip),
            format!("--listen-client-urls=http://{}:2379", pod.ip),
            format!("--initial-advertise-peer-urls={}", self.peer_url(o)),
            format!("--advertise-client-urls=http://{}:2379", self.host(o)),
        ];
        match start {
            PlainStart::New => {
                let cluster: Vec<String> = (0..self.replicas)
                    .map(|p| format!("{}={}", self.member_name(p), self.peer_url(p)))
                    .collect();
                args.push(format!("--initial-cluster={}", cluster.join(",")));
                args.push("--initial-cluster-state=new".into());
                args.push(format!("--initial-cluster-token={}", self.token));
            }
            PlainStart::Existing(cluster) => {
                args.push(format!("--initial-cluster={cluster}"));
                args.push("--initial-cluster-state=existing".into());
            }
        }
        args
    }

    /// Starts a plain etcd for pod `o` (a new start of the pod).
    pub fn start_plain(&mut self, o: u32, start: &PlainStart) -> Result<()> {
        self.start_plain_with(o, start, &[])
    }

    /// As [`Self::start_plain`], with more etcd flags (e.g. `--force-new-cluster`).
    pub fn start_plain_with(&mut self, o: u32, start: &PlainStart, extra: &[&str]) -> Result<()> {
        self.pod_mut(o).incarnation += 1;
        let mut cmd = procs::in_pod_namespace(&self.root_path.join("resolv.conf"), &self.etcd);
        cmd.args(self.plain_args(o, start)).args(extra);
        let (out, err) = self.log_files(o, "etcd")?;
        cmd.stdout(out).stderr(err);
        let child = procs::spawn(cmd, &self.etcd)?;
        self.join_partitions(o, child.id())?;
        self.pod_mut(o).etcd = Some(child);
        Ok(())
    }

    /// Turns an agent set into a plain one on the same data: every pod is killed and its
    /// etcd started again by hand with the static command line (etcd ignores the
    /// initial-cluster flags on a data directory that holds its WAL).
    pub async fn become_plain(&mut self) -> Result<()> {
        for o in 0..self.replicas {
            self.kill_processes(o).await;
        }
        self.kind = Kind::Plain;
        for o in 0..self.replicas {
            self.start_plain(o, &PlainStart::New)?;
        }
        Ok(())
    }

    /// Turns a plain set back into an agent one on the same data: every pod is killed and
    /// started again with the agent (sidecar + init, which finds its data and execs etcd).
    pub async fn become_agent(&mut self) -> Result<()> {
        for o in 0..self.replicas {
            self.kill_processes(o).await;
        }
        self.kind = Kind::Agent;
        for o in 0..self.replicas {
            self.start(o)?;
        }
        Ok(())
    }

    /// The pid of the pod's etcd (or of init before it execs etcd).
    pub fn etcd_pid(&self, o: u32) -> Option<u32> {
        self.pod(o).etcd.as_ref().and_then(Child::id)
    }

    /// The pid of the pod's sidecar.
    pub fn sidecar_pid(&self, o: u32) -> Option<u32> {
        self.pod(o).sidecar.as_ref().and_then(Child::id)
    }

    /// SIGKILLs the pod's etcd (or waiting init) and sidecar and withdraws its DNS name:
    /// the pod is gone.
    pub async fn kill(&mut self, o: u32) -> Result<()> {
        self.kill_processes(o).await;
        self.set_dns(o, false)
    }

    /// SIGKILLs the pod's etcd (or init) and sidecar; its name stays published.
    pub async fn kill_processes(&mut self, o: u32) {
        self.kill_etcd(o).await;
        self.kill_sidecar(o).await;
    }

    /// SIGKILLs only the sidecar.
    pub async fn kill_sidecar(&mut self, o: u32) {
        if let Some(mut c) = self.pod_mut(o).sidecar.take() {
            let _ = c.kill().await;
        }
    }

    /// SIGKILLs only the etcd container's process (init or etcd).
    pub async fn kill_etcd(&mut self, o: u32) {
        let url = self.client_url(o);
        self.clients.forget(&url);
        if let Some(mut c) = self.pod_mut(o).etcd.take() {
            let _ = c.kill().await;
        }
    }

    /// The volume is lost: the data directory emptied, as a new volume is mounted empty
    /// (the directory itself stays: it may be a mount point, see [`Set::limit_volumes`]).
    pub fn wipe(&mut self, o: u32) -> Result<()> {
        let dir = self.pod(o).data_dir.clone();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("reading {}", dir.display()))(e)),
        };
        for e in entries.filter_map(std::result::Result::ok) {
            let path = e.path();
            let r = match e.file_type().map(|t| t.is_dir()) {
                Ok(true) => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
            r.map_err(Error::io(format!("removing {}", path.display())))?;
        }
        Ok(())
    }

    /// What kubelet does for a container whose process exited: starts it again. For every
    /// pod whose etcd container (init → etcd) was started and has exited since, starts
    /// init again; returns those pods. Tests that need restarts (a recovery stops etcd so
    /// that it starts again forced) call this in their wait loops.
    pub fn restart_exited(&mut self) -> Result<Vec<u32>> {
        let mut restarted = Vec::new();
        if !matches!(self.kind, Kind::Agent) {
            return Ok(restarted);
        }
        for o in 0..self.pods.len() as u32 {
            let exited = match self.pod_mut(o).etcd.as_mut() {
                Some(c) => !matches!(c.try_wait(), Ok(None)),
                None => false,
            };
            if exited {
                let url = self.client_url(o);
                self.clients.forget(&url);
                self.pod_mut(o).etcd = None;
                self.start_init(o)?;
                restarted.push(o);
            }
        }
        Ok(restarted)
    }

    /// `etcd-steward ARGS` with pod `o`'s options, as `kubectl exec` runs it in that pod.
    pub async fn steward(&self, o: u32, args: &[&str]) -> std::process::Output {
        self.steward_in(o, args)
            .output()
            .await
            .unwrap_or_else(|e| panic!("running {}: {e}", self.steward.display()))
    }

    /// The command [`Self::steward`] runs, to start it in the background.
    pub fn steward_in(&self, o: u32, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.steward);
        cmd.args(args)
            .args(self.common_args(o))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        cmd
    }

    /// Runs `cmd` to its end while restarting exited etcd containers, as kubelet would
    /// meanwhile (a recovery or restore stops etcd so that it starts again).
    pub async fn run_restarting(&mut self, mut cmd: Command) -> std::process::Output {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let run = tokio::spawn(child.wait_with_output());
        while !run.is_finished() {
            if let Err(e) = self.restart_exited() {
                panic!("restarting an exited etcd container: {e}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match run.await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => panic!("waiting for {cmd:?}: {e}"),
            Err(e) => panic!("waiting for {cmd:?}: {e}"),
        }
    }

    /// Whether pod `o`'s sidecar process is still running.
    pub fn sidecar_running(&mut self, o: u32) -> bool {
        match self.pod_mut(o).sidecar.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// A new set of certificates for this set's names from new CAs, valid until `until`
    /// (year, month, day), in `<root>/<name>` (install its files with [`Pki::replace_from`]).
    pub fn renewed_pki(&self, name: &str, until: (i32, u8, u8)) -> Result<Pki> {
        Pki::generate_until(
            &self.root_path.join(name),
            SERVICE,
            "default",
            DOMAIN,
            Some(until),
        )
    }

    /// The harness's own etcd clients connect with the certificates the set's files hold now
    /// (after they were replaced).
    pub fn reload_client_tls(&mut self) -> Result<()> {
        let tls = match &self.pki {
            Some(pki) => Some(pki.client_tls(&host(0))?),
            None => None,
        };
        self.clients.set_tls(tls);
        Ok(())
    }

    /// Whether the etcd container's process (init or etcd) is still running.
    pub fn init_running(&mut self, o: u32) -> bool {
        match self.pod_mut(o).etcd.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    // ---- talking to pods -------------------------------------------------------------------

    /// Connection options (TLS when the set has it) with a call time-out of `timeout`.
    pub fn client_options(&self, timeout: Duration) -> ConnectOptions {
        self.clients.options(timeout)
    }

    /// A client to pod `o`'s etcd (kept while it works).
    pub async fn client(&self, o: u32) -> Result<Client> {
        self.clients.get(&self.client_url(o)).await
    }

    /// A client balanced over every pod whose etcd runs.
    pub async fn any_client(&self) -> Result<Client> {
        let urls: Vec<String> = self
            .pods
            .iter()
            .filter(|p| p.etcd.is_some())
            .map(|p| self.client_url(p.ordinal))
            .collect();
        self.clients.connect(&urls, Duration::from_secs(3)).await
    }

    /// Pod `o`'s status.
    pub async fn status(&self, o: u32) -> Result<StatusResponse> {
        self.clients.status(&self.client_url(o)).await
    }

    /// Pod `o`'s current revision (its status header's).
    pub async fn revision(&self, o: u32) -> Result<i64> {
        let s = self.status(o).await?;
        Ok(s.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// What a client resuming at `revision` through pod `o` meets: whether a read at it
    /// fails as compacted, and whether a watch from it is cancelled as compacted (each
    /// answer awaited at most 5 s).
    pub async fn compacted_at(&self, o: u32, revision: i64) -> Result<(bool, bool)> {
        const ANSWER: Duration = Duration::from_secs(5);
        let url = self.client_url(o);
        let failed = |source| Error::Etcd {
            url: url.clone(),
            source,
        };
        let mut c = self.client(o).await?;
        let read = c
            .get(
                "",
                Some(GetOptions::new().with_all_keys().with_revision(revision)),
            )
            .await;
        let read_compacted = match read {
            Err(etcd_client::Error::GRpcStatus(s)) => s.message().contains("compacted"),
            Err(e) => return Err(failed(e)),
            Ok(_) => false,
        };
        let options = etcd_client::WatchOptions::new()
            .with_all_keys()
            .with_start_revision(revision);
        let mut stream = tokio::time::timeout(ANSWER, c.watch("", Some(options)))
            .await
            .map_err(|_| Error::Failed(format!("no watch created at {url} within {ANSWER:?}")))?
            .map_err(failed)?;
        let mut watch_compacted = false;
        while let Ok(Ok(Some(r))) = tokio::time::timeout(ANSWER, stream.message()).await {
            if r.compact_revision() > 0 || r.canceled() {
                watch_compacted = r.compact_revision() > 0;
                break;
            }
            if !r.events().is_empty() {
                break;
            }
        }
        Ok((read_compacted, watch_compacted))
    }

    /// The member list as pod `o` sees it.
    pub async fn members(&self, o: u32) -> Result<Vec<Member>> {
        self.clients.members(&self.client_url(o)).await
    }

    /// Pod `o`'s member ID.
    pub async fn member_id(&self, o: u32) -> Result<u64> {
        self.clients.member_id(&self.client_url(o)).await
    }

    /// The ID of pod `o`'s cluster.
    pub async fn cluster_id(&self, o: u32) -> Result<u64> {
        self.clients.cluster_id(&self.client_url(o)).await
    }

    /// Counts keys under `prefix`, read through pod `o` (serializable: its own copy).
    pub async fn count_keys_on(&self, o: u32, prefix: &str) -> Result<i64> {
        self.clients.count_keys(&self.client_url(o), prefix).await
    }

    /// Writes `n` keys `<prefix>/<i>` through any running pod.
    pub async fn put_keys(&self, prefix: &str, n: usize) -> Result<()> {
        let mut c = self.any_client().await?;
        for i in 0..n {
            c.put(format!("{prefix}/{i:05}"), format!("v{i}"), None)
                .await
                .map_err(|source| Error::Etcd {
                    url: "any pod".into(),
                    source,
                })?;
        }
        Ok(())
    }

    /// Adds a learner entry for pod `o` through pod `via` by hand (as if an earlier init
    /// died after MemberAdd); its member ID. Retries for 30 s while etcd refuses.
    pub async fn add_learner_entry(&self, via: u32, o: u32) -> Result<u64> {
        let url = self.peer_url(o);
        let mut c = self.client(via).await?;
        let mut last = String::new();
        for _ in 0..60 {
            let opts = etcd_client::MemberAddOptions::new().with_is_learner();
            match c.member_add([url.as_str()], Some(opts)).await {
                Ok(r) => match r.member() {
                    Some(m) => return Ok(m.id()),
                    None => last = "MemberAdd answered without the member".into(),
                },
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(Error::Failed(format!(
            "could not add a learner entry for pod {o}: {last}"
        )))
    }

    /// GETs a path from a pod's sidecar: (status, body).
    pub async fn http(&self, o: u32, path: &str) -> Option<(u16, String)> {
        let addr = SocketAddr::new(IpAddr::V4(self.pod(o).ip), 8080);
        http_get(addr, path, self.http_timeout, 1 << 20).await
    }

    /// Whether pod `o`'s sidecar says ready.
    pub async fn ready(&self, o: u32) -> bool {
        matches!(self.http(o, "/ready").await, Some((200, _)))
    }

    /// Whether every listed pod's sidecar says ready.
    pub async fn all_ready(&self, pods: &[u32]) -> bool {
        for o in pods {
            if !self.ready(*o).await {
                return false;
            }
        }
        true
    }

    /// Waits until every listed pod is ready and a voter of one cluster with `voters`
    /// voters, all named (started); the error carries the pods' last log lines.
    pub async fn wait_ready(&self, pods: &[u32], voters: usize, timeout: Duration) -> Result<()> {
        let what = format!("pods {pods:?} ready as {voters} voters");
        let r = crate::wait::poll(timeout, Duration::from_millis(200), &what, || async {
            if !self.all_ready(pods).await {
                return false;
            }
            match self.members(pods[0]).await {
                Ok(ms) => {
                    ms.len() == voters && ms.iter().all(|m| !m.is_learner() && !m.name().is_empty())
                }
                Err(_) => false,
            }
        })
        .await;
        r.map(|_| ()).map_err(|_| Error::TimedOut {
            what: format!("{what}{}", self.dump()),
            after: timeout,
        })
    }

    /// A voter that sees a leader and serves a linearizable read: what "healthy" means for
    /// plain etcd (`etcdctl endpoint health` does the same read).
    pub async fn linearizable_ok(&self, o: u32) -> bool {
        let Ok(s) = self.status(o).await else {
            return false;
        };
        if s.leader() == 0 || s.is_learner() {
            return false;
        }
        let url = self.client_url(o);
        let Ok(mut c) = self.clients.get(&url).await else {
            return false;
        };
        let opts = GetOptions::new().with_keys_only().with_limit(1);
        match tokio::time::timeout(Duration::from_secs(2), c.get("health", Some(opts))).await {
            Ok(Ok(_)) => true,
            _ => {
                self.clients.forget(&url);
                false
            }
        }
    }

    /// Every listed pod is a healthy voter and the cluster has `voters` voters.
    pub async fn all_linearizable(&self, pods: &[u32], voters: usize) -> bool {
        for o in pods {
            if !self.linearizable_ok(*o).await {
                return false;
            }
        }
        match self.members(pods[0]).await {
            Ok(ms) => ms.len() == voters && ms.iter().all(|m| !m.is_learner()),
            Err(_) => false,
        }
    }

    /// Publishes every initial pod's name, starts them all and waits (up to `timeout`) until
    /// the set is up.
    pub async fn start_all(&mut self, timeout: Duration) -> Result<()> {
        let pods: Vec<u32> = (0..self.replicas).collect();
        self.publish(&pods).await?;
        for o in pods {
            self.start(o)?;
        }
        self.wait_up(timeout).await
    }

    /// Waits (polling every 50 ms) until the set is up: every initial pod ready (its kind's
    /// notion) as `replicas` voters.
    pub async fn wait_up(&self, timeout: Duration) -> Result<()> {
        let pods: Vec<u32> = (0..self.replicas).collect();
        let n = pods.len();
        let what = format!("the set on 127.0.{}.0 to be up", self.net);
        let up = crate::wait::poll(timeout, Duration::from_millis(50), &what, || async {
            match self.kind {
                Kind::Agent => self.all_ready(&pods).await && self.all_linearizable(&pods, n).await,
                Kind::Plain => self.all_linearizable(&pods, n).await,
            }
        })
        .await;
        up.map(|_| ()).map_err(|_| Error::TimedOut {
            what: format!("{what} (logs in {})", self.root_path.display()),
            after: timeout,
        })
    }

    /// Notes that the membership (or the set) just changed.
    pub fn changed(&mut self) {
        self.last_change = Some(Instant::now());
    }

    /// Waits until `d` has passed since the last change.
    pub async fn settle(&self, d: Duration) {
        if let Some(t) = self.last_change {
            tokio::time::sleep_until(t + d).await;
        }
    }

    /// The ordinal of the current leader, as the first running pod that sees one says.
    pub async fn leader(&self) -> Result<u32> {
        for p in self.pods.iter().filter(|p| p.etcd.is_some()) {
            let Ok(s) = self.status(p.ordinal).await else {
                continue;
            };
            if s.leader() == 0 {
                continue;
            }
            let Ok(ms) = self.members(p.ordinal).await else {
                continue;
            };
            if let Some(l) = ms
                .iter()
                .find(|m| m.id() == s.leader())
                .and_then(|m| self.ordinal_of(m))
            {
                return Ok(l);
            }
        }
        Err(Error::Failed("no member sees a leader".into()))
    }

    /// The pod a member entry belongs to, by its peer URL.
    pub fn ordinal_of(&self, m: &Member) -> Option<u32> {
        self.pods
            .iter()
            .map(|p| p.ordinal)
            .find(|o| m.peer_urls().iter().any(|u| *u == self.peer_url(*o)))
    }

    // ---- logs ------------------------------------------------------------------------------

    /// Every log line the pod's processes wrote, all starts, for assertions and failure
    /// reports.
    pub fn logs(&self, o: u32) -> String {
        let dir = self.root_path.join(format!("pod-{o}"));
        let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(std::result::Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "log"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
            .iter()
            .map(|p| {
                format!(
                    "==> {}\n{}",
                    p.display(),
                    std::fs::read_to_string(p).unwrap_or_default()
                )
            })
            .collect()
    }

    /// What pod `o`'s current start logged from `what` (`init`, `sidecar`, `etcd`).
    pub fn read_logs(&self, o: u32, what: &str) -> String {
        std::fs::read_to_string(self.log_path(o, what)).unwrap_or_default()
    }

    /// The init decisions logged for a pod, in order (the `action` of each "decision" line).
    pub fn decisions(&self, o: u32) -> Vec<String> {
        logs::decisions(&self.logs(o))
    }

    /// The last 25 lines etcd-steward logged per pod (no DEBUG), for a failure report.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for p in &self.pods {
            let logs = self.logs(p.ordinal);
            let lines: Vec<&str> = logs
                .lines()
                .filter(|l| logs::is_steward_line(l) && !l.contains("\"level\":\"DEBUG\""))
                .collect();
            out.push_str(&format!("\n----- pod {} (last lines) -----\n", p.ordinal));
            for l in logs::last(&lines, 25) {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Runs `etcd-steward init --dry-run` for a pod and returns its decision.
    pub async fn dry_run(&self, o: u32) -> Result<serde_json::Value> {
        let out = Command::new(&self.steward)
            .arg("init")
            .args(self.common_args(o))
            .arg("--dry-run")
            .env("ETCD_STEWARD_LOG", "off")
            .env_remove("HOSTNAME")
            .output()
            .await
            .map_err(|source| Error::Spawn {
                program: self.steward.clone(),
                source,
            })?;
        logs::dry_run_decision(&out)
    }

    /// Kills everything and waits for the processes; the directory goes unless kept.
    pub async fn shutdown(&mut self) {
        let ordinals: Vec<u32> = self.pods.iter().map(|p| p.ordinal).collect();
        for o in ordinals {
            self.kill_processes(o).await;
        }
        self.dns.stop().await;
        self.finished = true;
    }
}

impl Drop for Set {
    /// A failed scenario keeps its logs and data for a post-mortem.
    fn drop(&mut self) {
        let keep = match self.keep {
            Keep::OnPanic => std::thread::panicking(),
            Keep::UnlessShutDown => !self.finished,
            Keep::Always => true,
        };
        // Rules and mounts go before the directory (a kept volume stays mounted).
        self.partitions = None;
        if let Some(v) = self.volumes.as_mut() {
            v.keep = keep;
        }
        self.volumes = None;
        if keep {
            if let Some(root) = self.root.take() {
                let kept = root.keep();
                eprintln!("logs and data kept in {}", kept.display());
            }
        }
    }
}

fn host(o: u32) -> String {
    format!("{SERVICE}-{o}.{SERVICE}.default.svc.{DOMAIN}")
}

/// Whether an etcd data directory holds a WAL file.
pub fn has_wal(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("member/wal"))
        .map(|d| {
            d.filter_map(std::result::Result::ok)
                .any(|e| e.path().extension().is_some_and(|x| x == "wal"))
        })
        .unwrap_or(false)
}

/// The report a sidecar gives for an empty volume.
pub fn empty_report(name: &str) -> String {
    serde_json::json!({"name": name, "has_data": false, "wal": null, "wal_error": null, "formation": null}).to_string()
}

/// Serves `body` for /peer/report on pod `o`'s plain sidecar port, in place of its sidecar.
pub async fn fake_sidecar(set: &Set, o: u32, body: String) -> Result<()> {
    let addr = SocketAddr::new(IpAddr::V4(set.pod(o).ip), 8080);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding {addr}")))?;
    let app = axum::Router::new().route(
        "/peer/report",
        axum::routing::get(move || async move { body }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(())
}

// ---- network partitions and full disks (randomized fault schedules) ------------------------

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` or, on a hybrid host,
/// `/sys/fs/cgroup/unified`).
fn cgroup2_root() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts")
        .map_err(Error::io("reading /proc/mounts for the cgroup2 mount"))?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
        .next()
        .ok_or_else(|| {
            Error::Failed("no cgroup2 mount in /proc/mounts (partitions need one)".into())
        })
}

fn run_tool(program: &str, args: &[&str]) -> Result<()> {
    let what = format!("{program} {}", args.join(" "));
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(Error::io(what.clone()))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(Error::Failed(format!(
            "{what}: {} ({})",
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ))),
    }
}

/// Cuts pods of one set from each other on loopback while clients still reach them.
///
/// Every packet between loopback pods leaves from 127.0.0.1, so a pod is recognised by its
/// processes instead: each pod's processes live in a cgroup of their own
/// (`<cgroup2>/steward-chaos-<net>/pod-<o>`), and a mangle rule marks every connection a
/// pod opens with the pod's mark. A cut pod's connections to another pod's address, and
/// other pods' connections to its address, are dropped (both directions, established ones
/// too); the writer's and the harness's connections carry no mark and pass. The rules live
/// in chains `STEWARD-CHAOS-<net>` (filter and mangle) jumped from OUTPUT (every loopback
/// packet passes it); they are removed when this is dropped, even when a test panics.
pub struct Partitions {
    net: u8,
    chain: String,
    cgroup: PathBuf,
    pods: Vec<(u32, Ipv4Addr)>,
    cut: BTreeSet<u32>,
}

impl Partitions {
    fn mark(&self, o: u32) -> String {
        format!(
            "0x{:x}",
            (0x5cu32 << 24) | (u32::from(self.net) << 8) | (o + 1)
        )
    }

    fn pod_cgroup(&self, o: u32) -> PathBuf {
        self.cgroup.join(format!("pod-{o}"))
    }

    /// Removes the chains (and any jump to them) of `chain` from both tables.
    fn remove_chains(chain: &str) {
        for table in ["filter", "mangle"] {
            while run_tool(
                "iptables",
                &["-w", "-t", table, "-D", "OUTPUT", "-j", chain],
            )
            .is_ok()
            {}
            let _ = run_tool("iptables", &["-w", "-t", table, "-F", chain]);
            let _ = run_tool("iptables", &["-w", "-t", table, "-X", chain]);
        }
    }

    fn new(net: u8, pods: Vec<(u32, Ipv4Addr)>) -> Result<Partitions> {
        let chain = format!("STEWARD-CHAOS-{net}");
        let p = Partitions {
            net,
            cgroup: cgroup2_root()?.join(format!("steward-chaos-{net}")),
            chain,
            pods,
            cut: BTreeSet::new(),
        };
        // Whatever an earlier run on this network left behind goes first.
        Partitions::remove_chains(&p.chain);
        for table in ["filter", "mangle"] {
            run_tool("iptables", &["-w", "-t", table, "-N", &p.chain])?;
            run_tool(
                "iptables",
                &["-w", "-t", table, "-I", "OUTPUT", "-j", &p.chain],
            )?;
        }
        for (o, _) in &p.pods {
            let dir = p.pod_cgroup(*o);
            std::fs::create_dir_all(&dir)
                .map_err(Error::io(format!("creating cgroup {}", dir.display())))?;
            let path = format!("steward-chaos-{net}/pod-{o}");
            run_tool(
                "iptables",
                &[
                    "-w",
                    "-t",
                    "mangle",
                    "-A",
                    &p.chain,
                    "-m",
                    "cgroup",
                    "--path",
                    &path,
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "NEW",
                    "-j",
                    "CONNMARK",
                    "--set-mark",
                    &p.mark(*o),
                ],
            )?;
        }
        Ok(p)
    }

    /// Puts process `pid` (of pod `o`) in the pod's cgroup.
    fn join(&self, o: u32, pid: u32) -> Result<()> {
        let procs = self.pod_cgroup(o).join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .map_err(Error::io(format!("moving {pid} into {}", procs.display())))
    }

    /// Writes the filter chain for the pods now cut.
    fn apply(&self) -> Result<()> {
        run_tool("iptables", &["-w", "-t", "filter", "-F", &self.chain])?;
        for o in &self.cut {
            let own = self.pods.iter().find(|(p, _)| p == o).map(|(_, ip)| *ip);
            for (p, ip) in self.pods.iter().filter(|(p, _)| p != o) {
                let rules = [(self.mark(*o), ip.to_string())]
                    .into_iter()
                    .chain(own.map(|own| (self.mark(*p), own.to_string())));
                for (mark, to) in rules {
                    run_tool(
                        "iptables",
                        &[
                            "-w",
                            "-t",
                            "filter",
                            "-A",
                            &self.chain,
                            "-m",
                            "connmark",
                            "--mark",
                            &mark,
                            "-m",
                            "conntrack",
                            "--ctorigdst",
                            &to,
                            "-j",
                            "DROP",
                        ],
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for Partitions {
    fn drop(&mut self) {
        Partitions::remove_chains(&self.chain);
        for (o, _) in &self.pods {
            let _ = std::fs::remove_dir(self.pod_cgroup(*o));
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// Each pod's volume on a tmpfs of its own, so that a disk can be filled (see
/// [`Set::fill_volume`]); unmounted when dropped.
pub struct LimitedVolumes {
    mounted: Vec<PathBuf>,
    keep: bool,
}

impl Drop for LimitedVolumes {
    fn drop(&mut self) {
        for dir in &self.mounted {
            match self.keep {
                true => eprintln!(
                    "volume {} left mounted (umount it when done)",
                    dir.display()
                ),
                false => {
                    let _ = run_tool("umount", &["-l", &dir.display().to_string()]);
                }
            }
        }
    }
}

/// The file [`Set::fill_volume`] fills a volume with.
pub const FILL_FILE: &str = ".harness-fill";

impl Set {
    /// Makes partitions possible ([`Partitions`]): needs root, iptables and cgroup v2.
    /// Pods already running join their cgroups; every pod started from now on too.
    pub fn enable_partitions(&mut self) -> Result<()> {
        let pods = self.pods.iter().map(|p| (p.ordinal, p.ip)).collect();
        self.partitions = Some(Partitions::new(self.net, pods)?);
        for o in self.pods.iter().map(|p| p.ordinal).collect::<Vec<_>>() {
            self.join_partitions(o, self.etcd_pid(o))?;
            self.join_partitions(o, self.sidecar_pid(o))?;
        }
        Ok(())
    }

    fn join_partitions(&self, o: u32, pid: Option<u32>) -> Result<()> {
        match (&self.partitions, pid) {
            (Some(p), Some(pid)) => p.join(o, pid),
            _ => Ok(()),
        }
    }

    /// Cuts pod `o` from the other pods (both directions; clients still reach it), or heals
    /// the cut. [`Set::enable_partitions`] must have been called.
    pub fn partition(&mut self, o: u32, cut: bool) -> Result<()> {
        let Some(p) = self.partitions.as_mut() else {
            return Err(Error::Failed(format!(
                "cutting pod {o} off: call enable_partitions first"
            )));
        };
        match cut {
            true => p.cut.insert(o),
            false => p.cut.remove(&o),
        };
        p.apply()
    }

    /// Puts every pod's volume on a tmpfs of `mib` MiB (before any pod starts: each pod's
    /// mount namespace is a copy of the host's at its start).
    pub fn limit_volumes(&mut self, mib: u32) -> Result<()> {
        let mut v = LimitedVolumes {
            mounted: Vec::new(),
            keep: false,
        };
        for dir in self
            .pods
            .iter()
            .map(|p| p.data_dir.clone())
            .collect::<Vec<_>>()
        {
            std::fs::create_dir_all(&dir)
                .map_err(Error::io(format!("creating {}", dir.display())))?;
            let opts = format!("size={mib}m,mode=0700");
            run_tool(
                "mount",
                &[
                    "-t",
                    "tmpfs",
                    "-o",
                    &opts,
                    "tmpfs",
                    &dir.display().to_string(),
                ],
            )?;
            v.mounted.push(dir);
        }
        self.volumes = Some(v);
        Ok(())
    }

    /// Fills pod `o`'s volume (see [`Set::limit_volumes`]) with [`FILL_FILE`] until no space
    /// is left: etcd's next write that needs space fails with ENOSPC. Returns the bytes
    /// written.
    pub fn fill_volume(&self, o: u32) -> Result<u64> {
        use std::io::Write as _;
        if self.volumes.is_none() {
            return Err(Error::Failed(format!(
                "filling pod {o}'s volume, which is not size-limited: call limit_volumes before the pods start"
            )));
        }
        let path = self.data_dir(o).join(FILL_FILE);
        let mut f = std::fs::File::create(&path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => return Err(Error::io(format!("filling {}", path.display()))(e)),
            }
        }
        let _ = f.sync_all();
        Ok(written)
    }

    /// Frees what [`Set::fill_volume`] took.
    pub fn free_volume(&self, o: u32) -> Result<()> {
        let path = self.data_dir(o).join(FILL_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", path.display()))(e)),
        }
    }
}
