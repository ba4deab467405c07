//! A loopback "StatefulSet" for the benchmark, adapted from the test harness
//! (tests/support/mod.rs): a dnsmasq serving the pods' stable names on 127.0.N.1, and per
//! pod either the agent (`sidecar` + `init`, which execs etcd) or a plain etcd started by
//! hand with static flags (the baseline). etcd in both kinds runs in a private mount
//! namespace whose /etc/resolv.conf names that dnsmasq, so both resolve the same names
//! through the same server and the only difference measured is the agent.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use etcd_client::{Client, ConnectOptions, GetOptions};
use etcd_steward::dns::{Dns, HickoryDns, Lookup};
use tokio::process::{Child, Command};
use tokio::time::Instant;

pub const DOMAIN: &str = "cluster.local";
pub const SERVICE: &str = "etcd";

static NEXT_NET: AtomicU32 = AtomicU32::new(0);
/// Every process the bench started, so Ctrl-C can end them (and only them).
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn track(child: &Child) {
    if let (Some(pid), Ok(mut all)) = (child.id(), CHILDREN.lock()) {
        all.push(pid);
    }
}

/// SIGKILLs every process this bench started that may still run (on Ctrl-C).
pub fn kill_all_children() {
    if let Ok(all) = CHILDREN.lock() {
        for pid in all.iter() {
            let _ = std::process::Command::new("kill")
                .args(["-s", "KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Sends a signal (STOP, CONT, KILL, …) to one process this bench started.
pub fn signal(pid: u32, sig: &str) -> Result<()> {
    let st = std::process::Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .status()?;
    if !st.success() {
        bail!("kill -s {sig} {pid} failed");
    }
    Ok(())
}

/// What the bench runs and where.
#[derive(Debug, Clone)]
pub struct Env {
    pub steward: PathBuf,
    pub etcd: PathBuf,
    /// This benchmark's own executable: it doubles as a fake etcd for the start-up figure.
    pub me: PathBuf,
    pub net_base: u8,
    pub net_count: u8,
    pub keep: bool,
}

impl Env {
    fn next_net(&self) -> u8 {
        let n = NEXT_NET.fetch_add(1, Ordering::SeqCst) % u32::from(self.net_count.max(1));
        self.net_base + n as u8
    }
}

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

pub struct Pod {
    pub ip: Ipv4Addr,
    pub data_dir: PathBuf,
    /// `init` (which becomes etcd) or the plain etcd.
    etcd: Option<Child>,
    sidecar: Option<Child>,
    incarnation: u32,
}

pub struct Set {
    pub kind: Kind,
    pub net: u8,
    pub replicas: u32,
    pub env: Env,
    root: Option<tempfile::TempDir>,
    pub root_path: PathBuf,
    dns: Option<Child>,
    pub pods: Vec<Pod>,
    published: BTreeSet<u32>,
    resolver: HickoryDns,
    token: String,
    clients: HashMap<u32, Client>,
    finished: bool,
    last_change: Option<Instant>,
}

impl Set {
    pub async fn new(env: &Env, kind: Kind, replicas: u32) -> Result<Set> {
        let net = env.next_net();
        let root = tempfile::Builder::new()
            .prefix(&format!("steward-bench-{net}-"))
            .tempdir()?;
        let root_path = root.path().to_path_buf();
        let dns_ip = Ipv4Addr::new(127, 0, net, 1);
        std::fs::write(
            root_path.join("resolv.conf"),
            format!("nameserver {dns_ip}\n"),
        )?;
        std::fs::write(root_path.join("hosts"), "")?;
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
            .arg(format!("--listen-address={dns_ip}"))
            .arg(format!(
                "--addn-hosts={}",
                root_path.join("hosts").display()
            ))
            .arg(format!("--local=/{DOMAIN}/"))
            .arg(format!(
                "--pid-file={}",
                root_path.join("dnsmasq.pid").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("dnsmasq must be installed (scripts/install-test-deps.sh)")?;
        track(&dns);
        let resolver = HickoryDns::new(Some(SocketAddr::new(IpAddr::V4(dns_ip), 53)))?;
        let mut set = Set {
            kind,
            net,
            replicas,
            env: env.clone(),
            root: Some(root),
            root_path,
            dns: Some(dns),
            pods: Vec::new(),
            published: BTreeSet::new(),
            resolver,
            token: format!("bench-{net}-{}", std::process::id()),
            clients: HashMap::new(),
            finished: false,
            last_change: None,
        };
        for o in 0..replicas {
            let data_dir = set.root_path.join(format!("pod-{o}/data"));
            std::fs::create_dir_all(set.root_path.join(format!("pod-{o}")))?;
            set.pods.push(Pod {
                ip: Ipv4Addr::new(127, 0, net, 10 + o as u8),
                data_dir,
                etcd: None,
                sidecar: None,
                incarnation: 0,
            });
        }
        // dnsmasq answers once it has read its (empty) hosts file: NXDOMAIN, not a time-out.
        let probe = set.host(0);
        let resolver = set.resolver.clone();
        wait_until(Duration::from_secs(10), "dnsmasq to answer", || {
            let (r, h) = (resolver.clone(), probe.clone());
            async move { matches!(r.lookup(&h).await, Lookup::NotFound) }
        })
        .await?;
        Ok(set)
    }

    pub fn host(&self, o: u32) -> String {
        format!("{SERVICE}-{o}.{SERVICE}.default.svc.{DOMAIN}")
    }

    pub fn name(o: u32) -> String {
        format!("{SERVICE}-{o}")
    }

    pub fn peer_url(&self, o: u32) -> String {
        format!("http://{}:2380", self.host(o))
    }

    pub fn pod(&self, o: u32) -> &Pod {
        &self.pods[o as usize]
    }

    fn pod_mut(&mut self, o: u32) -> &mut Pod {
        &mut self.pods[o as usize]
    }

    pub fn dns_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, self.net, 1)
    }

    fn write_hosts(&self) -> Result<()> {
        let lines: String = self
            .published
            .iter()
            .map(|o| format!("{} {}\n", self.pod(*o).ip, self.host(*o)))
            .collect();
        std::fs::write(self.root_path.join("hosts"), lines)?;
        if let Some(pid) = self.dns.as_ref().and_then(Child::id) {
            signal(pid, "HUP")?;
        }
        Ok(())
    }

    /// Publishes a pod's DNS name and waits until dnsmasq answers it (dnsmasq reloads on
    /// SIGHUP asynchronously; the wait keeps that reload out of every measurement).
    pub async fn publish(&mut self, pods: &[u32]) -> Result<()> {
        for o in pods {
            self.published.insert(*o);
        }
        self.write_hosts()?;
        for o in pods {
            let (host, ip) = (self.host(*o), IpAddr::V4(self.pod(*o).ip));
            let r = self.resolver.clone();
            wait_until(
                Duration::from_secs(10),
                "a published name to resolve",
                || {
                    let (r, h) = (r.clone(), host.clone());
                    async move { r.lookup(&h).await == Lookup::Found(vec![ip]) }
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Withdraws a pod's DNS name (the pod is gone) and waits until it no longer resolves.
    pub async fn withdraw(&mut self, pods: &[u32]) -> Result<()> {
        for o in pods {
            self.published.remove(o);
        }
        self.write_hosts()?;
        for o in pods {
            let host = self.host(*o);
            let r = self.resolver.clone();
            wait_until(
                Duration::from_secs(10),
                "a withdrawn name to vanish",
                || {
                    let (r, h) = (r.clone(), host.clone());
                    async move { r.lookup(&h).await == Lookup::NotFound }
                },
            )
            .await?;
        }
        Ok(())
    }

    pub fn common_args(&self, o: u32) -> Vec<String> {
        let pod = self.pod(o);
        vec![
            format!("--name={}", Self::name(o)),
            format!("--replicas={}", self.replicas),
            format!("--data-dir={}", pod.data_dir.display()),
            format!("--listen-ip={}", pod.ip),
            format!("--dns-server={}:53", self.dns_ip()),
            format!("--cluster-domain={DOMAIN}"),
        ]
    }

    pub fn log_path(&self, o: u32, what: &str) -> PathBuf {
        let inc = self.pod(o).incarnation;
        self.root_path.join(format!("pod-{o}/{what}-{inc}.log"))
    }

    fn log(&self, o: u32, what: &str) -> Result<(std::fs::File, std::fs::File)> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(o, what))?;
        Ok((f.try_clone()?, f))
    }

    /// Starts a pod of the agent kind: its sidecar and its init (→ etcd). The name must be
    /// published already.
    pub fn start_agent(&mut self, o: u32) -> Result<()> {
        self.pod_mut(o).incarnation += 1;
        self.start_sidecar(o)?;
        self.start_init(o)
    }

    pub fn start_sidecar(&mut self, o: u32) -> Result<()> {
        let (out, err) = self.log(o, "sidecar")?;
        let child = Command::new(&self.env.steward)
            .arg("sidecar")
            .args(self.common_args(o))
            .env("ETCD_STEWARD_LOG", steward_log())
            .env_remove("HOSTNAME")
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", self.env.steward.display()))?;
        track(&child);
        self.pod_mut(o).sidecar = Some(child);
        Ok(())
    }

    /// `init` in its own mount namespace (so the etcd it execs resolves through dnsmasq).
    pub fn start_init(&mut self, o: u32) -> Result<()> {
        let (out, err) = self.log(o, "init")?;
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
            ])
            .arg(self.root_path.join("resolv.conf"))
            .arg(&self.env.steward)
            .arg("init")
            .args(self.common_args(o))
            .arg(format!("--etcd-bin={}", self.env.etcd.display()))
            .env("ETCD_STEWARD_LOG", steward_log())
            .env_remove("HOSTNAME")
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()?;
        track(&child);
        self.pod_mut(o).etcd = Some(child);
        Ok(())
    }

    /// The static command line a person would write for member `o`.
    pub fn plain_args(&self, o: u32, start: &PlainStart) -> Vec<String> {
        let pod = self.pod(o);
        let mut args = vec![
            format!("--name={}", Self::name(o)),
            format!("--data-dir={}", pod.data_dir.display()),
            format!("--listen-peer-urls=http://{}:2380", pod.ip),
            format!("--listen-client-urls=http://{}:2379", pod.ip),
            format!("--initial-advertise-peer-urls={}", self.peer_url(o)),
            format!("--advertise-client-urls=http://{}:2379", self.host(o)),
        ];
        match start {
            PlainStart::New => {
                let cluster: Vec<String> = (0..self.replicas)
                    .map(|p| format!("{}={}", Self::name(p), self.peer_url(p)))
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

    pub fn start_plain(&mut self, o: u32, start: &PlainStart) -> Result<()> {
        self.pod_mut(o).incarnation += 1;
        let (out, err) = self.log(o, "etcd")?;
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
            ])
            .arg(self.root_path.join("resolv.conf"))
            .arg(&self.env.etcd)
            .args(self.plain_args(o, start))
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()?;
        track(&child);
        self.pod_mut(o).etcd = Some(child);
        Ok(())
    }

    /// Starts pod `o` the way its kind starts (the name must be published).
    pub fn start(&mut self, o: u32) -> Result<()> {
        match self.kind {
            Kind::Agent => self.start_agent(o),
            Kind::Plain => self.start_plain(o, &PlainStart::New),
        }
    }

    /// Turns an agent set into a plain one on the same data: every pod is killed and its
    /// etcd started again by hand with the static command line (etcd ignores the
    /// initial-cluster flags on a data directory that holds its WAL).
    pub async fn become_plain(&mut self) -> Result<()> {
        for o in 0..self.replicas {
            self.kill(o).await;
        }
        self.kind = Kind::Plain;
        for o in 0..self.replicas {
            self.start_plain(o, &PlainStart::New)?;
        }
        Ok(())
    }

    /// The pid of the pod's etcd (or of init before it execs etcd).
    pub fn etcd_pid(&self, o: u32) -> Option<u32> {
        self.pod(o).etcd.as_ref().and_then(Child::id)
    }

    pub fn sidecar_pid(&self, o: u32) -> Option<u32> {
        self.pod(o).sidecar.as_ref().and_then(Child::id)
    }

    /// SIGKILLs the pod's etcd (or init) and sidecar; the name stays published.
    pub async fn kill(&mut self, o: u32) {
        self.clients.remove(&o);
        let pod = self.pod_mut(o);
        if let Some(mut c) = pod.etcd.take() {
            let _ = c.kill().await;
        }
        if let Some(mut c) = pod.sidecar.take() {
            let _ = c.kill().await;
        }
    }

    /// The volume is lost: an empty data directory.
    pub fn wipe(&mut self, o: u32) -> Result<()> {
        let dir = self.pod(o).data_dir.clone();
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        Ok(())
    }

    pub fn client_url(&self, o: u32) -> String {
        format!("http://{}:2379", self.pod(o).ip)
    }

    /// A client to one member (cached; dropped when a call fails).
    pub async fn client(&mut self, o: u32) -> Result<Client> {
        if let Some(c) = self.clients.get(&o) {
            return Ok(c.clone());
        }
        let c = connect(&self.client_url(o)).await?;
        self.clients.insert(o, c.clone());
        Ok(c)
    }

    fn forget(&mut self, o: u32) {
        self.clients.remove(&o);
    }

    pub async fn status(&mut self, o: u32) -> Result<etcd_client::StatusResponse> {
        let mut c = self.client(o).await?;
        let r = c.status().await;
        if r.is_err() {
            self.forget(o);
        }
        Ok(r?)
    }

    /// A voter that sees a leader and serves a linearizable read: what "healthy" means for
    /// plain etcd (`etcdctl endpoint health` does the same read).
    pub async fn linearizable_ok(&mut self, o: u32) -> bool {
        let Ok(s) = self.status(o).await else {
            return false;
        };
        if s.leader() == 0 || s.is_learner() {
            return false;
        }
        let Ok(mut c) = self.client(o).await else {
            return false;
        };
        let opts = GetOptions::new().with_keys_only().with_limit(1);
        match tokio::time::timeout(Duration::from_secs(2), c.get("health", Some(opts))).await {
            Ok(Ok(_)) => true,
            _ => {
                self.forget(o);
                false
            }
        }
    }

    /// Every listed pod is a healthy voter and the cluster has `voters` voters.
    pub async fn all_linearizable(&mut self, pods: &[u32], voters: usize) -> bool {
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

    pub async fn members(&mut self, o: u32) -> Result<Vec<etcd_client::Member>> {
        let mut c = self.client(o).await?;
        match c.member_list().await {
            Ok(r) => Ok(r.members().to_vec()),
            Err(e) => {
                self.forget(o);
                Err(e.into())
            }
        }
    }

    /// GETs a path from a pod's sidecar: (status, body).
    pub async fn http(&self, o: u32, path: &str) -> Option<(u16, String)> {
        let addr = SocketAddr::new(IpAddr::V4(self.pod(o).ip), 8080);
        etcd_steward::http_get::get(addr, "bench", path, Duration::from_millis(500), 1 << 20)
            .await
            .ok()
            .map(|(s, b)| (s, String::from_utf8_lossy(&b).into_owned()))
    }

    pub async fn ready(&self, o: u32) -> bool {
        matches!(self.http(o, "/ready").await, Some((200, _)))
    }

    pub async fn all_ready(&self, pods: &[u32]) -> bool {
        for o in pods {
            if !self.ready(*o).await {
                return false;
            }
        }
        true
    }

    /// Waits until the set is up: every pod ready (its kind's notion) as `n` voters.
    pub async fn wait_up(&mut self, timeout: Duration) -> Result<()> {
        let pods: Vec<u32> = (0..self.replicas).collect();
        let n = pods.len();
        let deadline = Instant::now() + timeout;
        loop {
            let ok = match self.kind {
                Kind::Agent => self.all_ready(&pods).await && self.all_linearizable(&pods, n).await,
                Kind::Plain => self.all_linearizable(&pods, n).await,
            };
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "set on 127.0.{}.0 not up after {timeout:?}; logs in {}",
                    self.net,
                    self.root_path.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

    /// The ordinal of the current leader, as pod `via` (or any pod) sees it.
    pub async fn leader(&mut self) -> Result<u32> {
        for o in 0..self.replicas {
            if self.pod(o).etcd.is_none() {
                continue;
            }
            let Ok(s) = self.status(o).await else {
                continue;
            };
            if s.leader() == 0 {
                continue;
            }
            let Ok(ms) = self.members(o).await else {
                continue;
            };
            if let Some(m) = ms.iter().find(|m| m.id() == s.leader()) {
                if let Some(l) = self.ordinal_of(m) {
                    return Ok(l);
                }
            }
        }
        Err(anyhow!("no member sees a leader"))
    }

    /// The pod a member entry belongs to, by its peer URL.
    pub fn ordinal_of(&self, m: &etcd_client::Member) -> Option<u32> {
        (0..self.replicas).find(|o| m.peer_urls().iter().any(|u| *u == self.peer_url(*o)))
    }

    pub async fn member_id(&mut self, o: u32) -> Result<u64> {
        let s = self.status(o).await?;
        s.header()
            .map(|h| h.member_id())
            .ok_or_else(|| anyhow!("status without header"))
    }

    /// Counts keys under `prefix` on pod `o`'s own copy (serializable).
    pub async fn count_keys_on(&mut self, o: u32, prefix: &str) -> Result<i64> {
        let mut c = self.client(o).await?;
        let opts = GetOptions::new()
            .with_prefix()
            .with_count_only()
            .with_serializable();
        Ok(c.get(prefix, Some(opts)).await?.count())
    }

    /// Every log line of pod `o`'s processes of one kind (`init`, `sidecar`, `etcd`).
    pub fn read_logs(&self, o: u32, what: &str) -> String {
        let inc = self.pod(o).incarnation;
        std::fs::read_to_string(self.root_path.join(format!("pod-{o}/{what}-{inc}.log")))
            .unwrap_or_default()
    }

    pub fn data_dir(&self, o: u32) -> &Path {
        &self.pod(o).data_dir
    }

    /// Kills everything and removes the data (unless `--keep`).
    pub async fn shutdown(mut self) {
        for o in 0..self.replicas {
            self.kill(o).await;
        }
        if let Some(mut d) = self.dns.take() {
            let _ = d.kill().await;
        }
        self.finished = true;
    }
}

impl Drop for Set {
    /// A set that was not shut down (a failed scenario) keeps its logs and data.
    fn drop(&mut self) {
        if !self.finished || self.env.keep {
            if let Some(root) = self.root.take() {
                let kept = root.keep();
                eprintln!("bench: logs and data kept in {}", kept.display());
            }
        }
    }
}

/// The agent's log filter: `BENCH_STEWARD_LOG` (e.g. `debug`), or `info`.
fn steward_log() -> String {
    std::env::var("BENCH_STEWARD_LOG").unwrap_or_else(|_| "info".into())
}

pub async fn connect(url: &str) -> Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(300))
        .with_timeout(Duration::from_secs(3));
    Ok(Client::connect([url], Some(opts)).await?)
}

/// Polls `check` every 20 ms until it holds; fails naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
