//! Talking to the pods and checking them: clients, readiness, leaders, logs, acknowledged
//! writes.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use tokio::process::Command;
use tokio::time::Instant;

use super::cli::docker_sync;
use super::{Cluster, HttpAnswer};
use crate::client::http_get;
use crate::writer::write_key;
use crate::{logs, Etcd};

impl Cluster {
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

    /// GETs a path from pod `o`'s sidecar on its peer-facing port (8443, plain HTTP without
    /// peer TLS), where `/peer/report` is served.
    pub async fn peer_http(&self, o: u32, path: &str) -> HttpAnswer {
        let addr = SocketAddr::new(IpAddr::V4(self.ip(o)), 8443);
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
