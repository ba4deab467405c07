//! A loopback "StatefulSet": a dnsmasq serving the pods' stable names on 127.0.N.1 (a name
//! resolves only while it is published), and per pod either the agent (a `sidecar`
//! process, and `init`, which execs real etcd) or a plain etcd started by hand with a
//! static command line (the benchmark's baseline). etcd of both kinds runs in a private
//! mount namespace whose /etc/resolv.conf names that dnsmasq, so both resolve the same
//! names through the same server. Each set has its own 127.0.N.0/24; pod `o` is 127.0.N.(10+o).

mod backed;
mod cluster;
mod faults;
mod names;
mod pods;

pub use backed::{first_snapshot, BackedSet, Backups, DrillReaper};
pub use faults::{LimitedVolumes, Partitions, FILL_FILE};

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::process::Child;
use tokio::time::Instant;

use crate::client::Clients;
use crate::dns::{Dnsmasq, DOMAIN};
use crate::pki::Pki;
use crate::{Error, Etcd, Result};

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

/// Replaces every `from` in the database file of `data_dir` (its etcd stopped) by `to`, as
/// long; how many were replaced. bbolt keeps no page checksums: etcd serves the changed bytes.
pub fn replace_in_db(data_dir: &Path, from: &[u8], to: &[u8]) -> std::io::Result<usize> {
    assert_eq!(
        from.len(),
        to.len(),
        "a replacement as long as what it replaces"
    );
    let path = data_dir.join("member/snap/db");
    let mut bytes = std::fs::read(&path)?;
    let mut n = 0;
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
            n += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    std::fs::write(&path, bytes)?;
    Ok(n)
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
