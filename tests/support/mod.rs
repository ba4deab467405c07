//! A loopback "StatefulSet" for integration tests: a dnsmasq serving the pods' stable
//! names (a name resolves only while its pod exists), and per pod an `init` process
//! (which execs real etcd) in a private mount namespace whose resolv.conf names that
//! dnsmasq, plus a `sidecar` process. Each test gets its own 127.0.N.0/24.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};

pub mod pki;
use tokio::process::{Child, Command};
use tokio::time::Instant;

pub const DOMAIN: &str = "cluster.local";
static NEXT_NET: AtomicU8 = AtomicU8::new(0);

/// Which etcd the suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Etcd {
    V3_5,
    V3_4,
    /// etcd 3.5.1 with TLS for clients and peers.
    V3_5Tls,
}

impl Etcd {
    pub fn tls(self) -> bool {
        self == Etcd::V3_5Tls
    }

    /// `ETCD_3_5_BIN` / `ETCD_3_4_BIN`, or where `.ci/run` installs them.
    pub fn bin(self) -> PathBuf {
        let (var, default) = match self {
            Etcd::V3_5 | Etcd::V3_5Tls => (
                "ETCD_3_5_BIN",
                concat!(env!("CARGO_MANIFEST_DIR"), "/.tools/etcd-v3.5.1/etcd"),
            ),
            Etcd::V3_4 => ("ETCD_3_4_BIN", "/usr/bin/etcd"),
        };
        let path = std::env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(default));
        assert!(path.exists(), "etcd for {self:?} not found at {path:?}: run .ci/run (or scripts/install-test-deps.sh) or set {var}");
        path
    }
}

pub fn steward_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_etcd-steward"))
}

pub struct Pod {
    pub ordinal: u32,
    pub ip: Ipv4Addr,
    pub data_dir: PathBuf,
    init: Option<Child>,
    sidecar: Option<Child>,
    incarnation: u32,
}

pub struct Set {
    pub etcd: Etcd,
    pub name: String,
    pub replicas: u32,
    pub net: u8,
    pub root: tempfile::TempDir,

    pub pods: Vec<Pod>,
    pub stall_timeout: String,
    pub pki: Option<pki::Pki>,
    /// More etcd-steward options for every pod started from now on.
    pub extra_args: Vec<String>,
    dns: Option<Child>,
    /// Names published at another pod's address than their own (DNS answering wrong).
    wrong_addresses: std::collections::BTreeMap<u32, Ipv4Addr>,
    published: BTreeSet<u32>,
}

impl Set {
    /// A set of `replicas` initial pods (pods can be added beyond that for scale-up).
    pub async fn new(etcd: Etcd, replicas: u32) -> Set {
        let net = 20 + NEXT_NET.fetch_add(1, Ordering::SeqCst);
        let root = tempfile::Builder::new()
            .prefix("steward-it-")
            .tempdir()
            .unwrap();
        let mut set = Set {
            etcd,
            name: "etcd".into(),
            replicas,
            net,
            root,
            pods: Vec::new(),
            stall_timeout: "5m".into(),
            pki: None,
            extra_args: Vec::new(),
            dns: None,
            wrong_addresses: Default::default(),
            published: BTreeSet::new(),
        };
        std::fs::write(
            set.root.path().join("resolv.conf"),
            format!("nameserver {}\n", set.dns_ip()),
        )
        .unwrap();
        std::fs::write(set.hosts_file(), "").unwrap();
        let dns = Command::new("dnsmasq")
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--port=53",
                "--user=root",
                "--local-ttl=0",
                "--no-negcache",
                "--log-facility=-",
            ])
            .arg(format!("--listen-address={}", set.dns_ip()))
            .arg(format!("--addn-hosts={}", set.hosts_file().display()))
            .arg(format!("--local=/{DOMAIN}/"))
            .arg(format!(
                "--pid-file={}",
                set.root.path().join("dnsmasq.pid").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("dnsmasq must be installed (Debian package dnsmasq-base)");
        if etcd.tls() {
            let dir = set.root.path().join("pki");
            set.pki = Some(pki::Pki::generate(&dir, &set.name, "default", DOMAIN));
        }
        set.dns = Some(dns);
        for o in 0..replicas {
            set.add_pod(o);
        }
        // dnsmasq is ready when it answers.
        wait_for(Duration::from_secs(10), "dnsmasq to listen", || async {
            tokio::net::UdpSocket::bind((set.dns_ip(), 0)).await.is_ok()
                && std::process::Command::new("true").status().is_ok()
                && std::fs::read_to_string(set.root.path().join("dnsmasq.pid")).is_ok()
        })
        .await;
        set
    }

    pub fn dns_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, self.net, 1)
    }

    fn hosts_file(&self) -> PathBuf {
        self.root.path().join("hosts")
    }

    pub fn host(&self, o: u32) -> String {
        format!("{}-{o}.{}.default.svc.{DOMAIN}", self.name, self.name)
    }

    pub fn add_pod(&mut self, o: u32) {
        let data_dir = self.root.path().join(format!("pod-{o}/data"));
        std::fs::create_dir_all(data_dir.parent().unwrap()).unwrap();
        self.pods.push(Pod {
            ordinal: o,
            ip: Ipv4Addr::new(127, 0, self.net, 10 + o as u8),
            data_dir,
            init: None,
            sidecar: None,
            incarnation: 0,
        });
    }

    pub fn pod(&self, o: u32) -> &Pod {
        self.pods.iter().find(|p| p.ordinal == o).unwrap()
    }

    fn pod_mut(&mut self, o: u32) -> &mut Pod {
        self.pods.iter_mut().find(|p| p.ordinal == o).unwrap()
    }

    fn write_hosts(&self) {
        let lines: String = self
            .published
            .iter()
            .map(|o| {
                let ip = self.wrong_addresses.get(o).unwrap_or(&self.pod(*o).ip);
                format!("{ip} {}\n", self.host(*o))
            })
            .collect();
        std::fs::write(self.hosts_file(), lines).unwrap();
        let pid = std::fs::read_to_string(self.root.path().join("dnsmasq.pid")).unwrap_or_default();
        if let Ok(pid) = pid.trim().parse::<i32>() {
            let _ = std::process::Command::new("kill")
                .args(["-HUP", &pid.to_string()])
                .status();
        }
    }

    /// Publishes (or withdraws) a pod's DNS name, as a headless service does while it exists.
    pub fn set_dns(&mut self, o: u32, published: bool) {
        if published {
            self.published.insert(o);
        } else {
            self.published.remove(&o);
        }
        self.write_hosts();
    }

    /// Publishes pod `o`'s name at `ip` (another pod's address: DNS answering wrong), or
    /// at its own address again with `None`.
    pub fn set_dns_address(&mut self, o: u32, ip: Option<Ipv4Addr>) {
        match ip {
            Some(ip) => self.wrong_addresses.insert(o, ip),
            None => self.wrong_addresses.remove(&o),
        };
        self.set_dns(o, true);
    }

    fn common_args(&self, o: u32) -> Vec<String> {
        let pod = self.pod(o);
        vec![
            format!("--name={}-{o}", self.name),
            format!("--replicas={}", self.replicas),
            format!("--data-dir={}", pod.data_dir.display()),
            format!("--listen-ip={}", pod.ip),
            format!("--dns-server={}:53", self.dns_ip()),
            format!("--learner-stall-timeout={}", self.stall_timeout),
            format!("--cluster-domain={DOMAIN}"),
        ]
        .into_iter()
        .chain(self.pki.iter().flat_map(|p| p.args()))
        .chain(self.extra_args.iter().cloned())
        .collect()
    }

    fn log(&self, o: u32, what: &str, incarnation: u32) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(
                self.root
                    .path()
                    .join(format!("pod-{o}/{what}-{incarnation}.log")),
            )
            .unwrap()
    }

    /// Starts a pod: publishes its name, starts its sidecar and its init (→ etcd).
    pub fn start(&mut self, o: u32) {
        self.set_dns(o, true);
        self.start_sidecar(o);
        self.start_init(o);
    }

    pub fn start_sidecar(&mut self, o: u32) {
        let inc = self.pod(o).incarnation + 1;
        let child = Command::new(steward_bin())
            .arg("sidecar")
            .args(self.common_args(o))
            .env(
                "ETCD_STEWARD_LOG",
                std::env::var("STEWARD_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env_remove("HOSTNAME")
            .stdout(self.log(o, "sidecar", inc))
            .stderr(self.log(o, "sidecar", inc))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pod = self.pod_mut(o);
        pod.incarnation = inc;
        pod.sidecar = Some(child);
    }

    pub fn start_init(&mut self, o: u32) {
        self.start_init_with(o, &[]);
    }

    pub fn start_init_with(&mut self, o: u32, extra_etcd_args: &[&str]) {
        let inc = self.pod(o).incarnation.max(1);
        let resolv = self.root.path().join("resolv.conf");
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
            ])
            .arg(&resolv)
            .arg(steward_bin())
            .arg("init")
            .args(self.common_args(o))
            .arg(format!("--etcd-bin={}", self.etcd.bin().display()))
            .arg("--")
            .args(extra_etcd_args)
            .env(
                "ETCD_STEWARD_LOG",
                std::env::var("STEWARD_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env_remove("HOSTNAME")
            .stdout(self.log(o, "init", inc))
            .stderr(self.log(o, "init", inc))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.pod_mut(o).init = Some(child);
    }

    /// SIGKILLs the pod's etcd (or waiting init) and sidecar; withdraws its DNS name.
    pub async fn kill(&mut self, o: u32) {
        self.kill_etcd(o).await;
        if let Some(mut c) = self.pod_mut(o).sidecar.take() {
            let _ = c.kill().await;
        }
        self.set_dns(o, false);
    }

    /// SIGKILLs only the sidecar.
    pub async fn kill_sidecar(&mut self, o: u32) {
        if let Some(mut c) = self.pod_mut(o).sidecar.take() {
            let _ = c.kill().await;
        }
    }

    /// SIGKILLs only the etcd container's process (init or etcd).
    pub async fn kill_etcd(&mut self, o: u32) {
        if let Some(mut c) = self.pod_mut(o).init.take() {
            let _ = c.kill().await;
        }
    }

    /// The volume is lost: a fresh, empty data directory.
    pub fn wipe(&mut self, o: u32) {
        let dir = self.pod(o).data_dir.clone();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    /// Whether the etcd container's process (init or etcd) is still running.
    pub fn init_running(&mut self, o: u32) -> bool {
        match self.pod_mut(o).init.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn client_addr(&self, o: u32) -> String {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:2379", self.pod(o).ip)
    }

    pub fn client_options(&self, timeout: Duration) -> ConnectOptions {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(timeout);
        match &self.pki {
            // Every pod's certificate is the same wildcard, so one name verifies them all.
            Some(pki) => opts.with_tls(pki.client_tls(&self.host(0))),
            None => opts,
        }
    }

    pub async fn client(&self, o: u32) -> Client {
        let opts = self.client_options(Duration::from_secs(2));
        Client::connect([self.client_addr(o)], Some(opts))
            .await
            .unwrap()
    }

    /// A client balanced over every running pod.
    pub async fn any_client(&self) -> Client {
        let eps: Vec<String> = self
            .pods
            .iter()
            .filter(|p| p.init.is_some())
            .map(|p| self.client_addr(p.ordinal))
            .collect();
        let opts = self.client_options(Duration::from_secs(3));
        Client::connect(eps, Some(opts)).await.unwrap()
    }

    /// GETs a path from a pod's sidecar: (status, body).
    pub async fn http(&self, o: u32, path: &str) -> Option<(u16, String)> {
        let addr = SocketAddr::new(IpAddr::V4(self.pod(o).ip), 8080);
        etcd_steward::http_get::get(addr, "x", path, Duration::from_secs(2), 1 << 20)
            .await
            .ok()
            .map(|(s, b)| (s, String::from_utf8_lossy(&b).into_owned()))
    }

    pub async fn ready(&self, o: u32) -> bool {
        matches!(self.http(o, "/ready").await, Some((200, _)))
    }

    /// Waits until every listed pod is a ready voter of one cluster with `voters` voters.
    pub async fn wait_ready(&self, pods: &[u32], voters: usize, timeout: Duration) {
        let what = format!("pods {pods:?} ready as {voters} voters");
        wait_for_or(
            timeout,
            &what,
            || async {
                for o in pods {
                    if !self.ready(*o).await {
                        return false;
                    }
                }
                match self.members(pods[0]).await {
                    Some(ms) => {
                        ms.len() == voters
                            && ms.iter().all(|m| !m.is_learner() && !m.name().is_empty())
                    }
                    None => false,
                }
            },
            || self.dump(),
        )
        .await;
    }

    pub async fn members(&self, o: u32) -> Option<Vec<etcd_client::Member>> {
        let mut c = self.client(o).await;
        c.member_list().await.ok().map(|r| r.members().to_vec())
    }

    pub async fn status(&self, o: u32) -> Option<etcd_client::StatusResponse> {
        self.client(o).await.status().await.ok()
    }

    pub async fn member_id(&self, o: u32) -> u64 {
        self.status(o)
            .await
            .and_then(|s| s.header().map(|h| h.member_id()))
            .unwrap_or_default()
    }

    pub async fn cluster_id(&self, o: u32) -> u64 {
        self.status(o)
            .await
            .and_then(|s| s.header().map(|h| h.cluster_id()))
            .unwrap_or_default()
    }

    pub async fn put_keys(&self, prefix: &str, n: usize) {
        let mut c = self.any_client().await;
        for i in 0..n {
            c.put(format!("{prefix}/{i:05}"), format!("v{i}"), None)
                .await
                .unwrap();
        }
    }

    /// Counts keys under `prefix`, read through pod `o` (serializable: its own copy).
    pub async fn count_keys_on(&self, o: u32, prefix: &str) -> i64 {
        let mut c = self.client(o).await;
        let opts = GetOptions::new()
            .with_prefix()
            .with_count_only()
            .with_serializable();
        c.get(prefix, Some(opts))
            .await
            .map(|r| r.count())
            .unwrap_or(-1)
    }

    /// Every log line the pod's processes wrote, for assertions and failure reports.
    pub fn logs(&self, o: u32) -> String {
        let dir = self.root.path().join(format!("pod-{o}"));
        let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(Result::ok)
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

    /// The init decisions logged for a pod, in order (the `action` of each "decision" line).
    pub fn decisions(&self, o: u32) -> Vec<String> {
        self.logs(o)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == "decision" || v["message"] == "waiting")
            .filter_map(|v| v["action"].as_str().map(String::from))
            .collect()
    }

    pub fn dump(&self) -> String {
        let mut out = String::new();
        for p in &self.pods {
            let logs = self.logs(p.ordinal);
            let tail: Vec<&str> = logs
                .lines()
                .filter(|l| l.contains("\"message\":\"") && !l.contains("\"level\":\"DEBUG\""))
                .rev()
                .take(25)
                .collect();
            out.push_str(&format!("\n----- pod {} (last lines) -----\n", p.ordinal));
            for l in tail.iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Runs `etcd-steward init --dry-run` for a pod and returns its decision.
    pub async fn dry_run(&self, o: u32) -> serde_json::Value {
        let out = Command::new(steward_bin())
            .arg("init")
            .args(self.common_args(o))
            .arg("--dry-run")
            .env("ETCD_STEWARD_LOG", "off")
            .env_remove("HOSTNAME")
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "dry run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Adds a learner entry for pod `o` by hand (as if an earlier init died after MemberAdd).
    pub async fn add_learner_entry(&self, via: u32, o: u32) -> u64 {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}:2380", self.host(o));
        let mut c = self.client(via).await;
        let mut last = String::new();
        for _ in 0..60 {
            match c
                .member_add(
                    [url.as_str()],
                    Some(etcd_client::MemberAddOptions::new().with_is_learner()),
                )
                .await
            {
                Ok(r) => return r.member().unwrap().id(),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("could not add learner entry: {last}");
    }

    /// Kills everything (Drop does too, but this waits for the processes).
    pub async fn shutdown(&mut self) {
        let ordinals: Vec<u32> = self.pods.iter().map(|p| p.ordinal).collect();
        for o in ordinals {
            self.kill(o).await;
        }
        if let Some(mut d) = self.dns.take() {
            let _ = d.kill().await;
        }
    }
}

impl Drop for Set {
    /// A failed scenario keeps its logs and data for a post-mortem.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let kept = self.root.path().to_path_buf();
            let placeholder = tempfile::tempdir().unwrap();
            let root = std::mem::replace(&mut self.root, placeholder);
            let _ = root.keep();
            eprintln!("scenario failed: logs and data kept in {}", kept.display());
        }
    }
}

/// Polls `check` until it holds; panics naming `what` after `timeout`.
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for_or(timeout, what, check, String::new).await
}

pub async fn wait_for_or<F, Fut, D>(timeout: Duration, what: &str, mut check: F, diagnostics: D)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
    D: FnOnce() -> String,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}{}",
                diagnostics()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn has_wal(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("member/wal"))
        .map(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.path().extension().is_some_and(|x| x == "wal"))
        })
        .unwrap_or(false)
}

/// The report a sidecar gives for an empty volume.
pub fn empty_report(name: &str) -> String {
    serde_json::json!({"name": name, "has_data": false, "wal": null, "wal_error": null, "formation": null}).to_string()
}

/// Serves `body` for /peer/report on pod `o`'s plain sidecar port, in place of its sidecar.
pub async fn fake_sidecar(set: &Set, o: u32, body: String) {
    let addr = SocketAddr::new(IpAddr::V4(set.pod(o).ip), 8080);
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let app = axum::Router::new().route(
        "/peer/report",
        axum::routing::get(move || async move { body }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
}
