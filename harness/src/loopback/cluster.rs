//! Talking to the pods: etcd clients, the sidecars' HTTP, readiness, leaders, logs.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, Member, StatusResponse};
use tokio::process::Command;
use tokio::time::Instant;

use super::{Kind, Set};
use crate::client::http_get;
use crate::{logs, Error, Result};

impl Set {
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

    /// GETs a path from a pod's sidecar on its peer-facing port (plain HTTP: sets without
    /// peer TLS), where `/peer/report` and `/peer/history` are served: (status, body).
    pub async fn peer_http(&self, o: u32, path: &str) -> Option<(u16, String)> {
        let addr = SocketAddr::new(IpAddr::V4(self.pod(o).ip), 8443);
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
}
