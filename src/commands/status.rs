//! `etcd-steward status`: one screen for an incident, run in any pod (`kubectl exec`).
//! [`gather`] asks every pod's etcd for its status and every pod's sidecar for its report
//! (I/O); [`render`] turns that into the screen (pure); `-o json` prints the same data.

use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;

use crate::backup::Backups;
use crate::config::Config;
use crate::dns::Dns;
use crate::etcd::{Connector, Etcd};
use crate::facts::{LastDecision, MemberInfo, PeerReport, Waiting};
use crate::units::{mib_or_gib, moment};

const CALL: Duration = Duration::from_secs(2);

/// One pod: its member's view of itself and its sidecar's report.
#[derive(Debug, Clone, Serialize)]
pub struct PodStatus {
    pub pod: String,
    /// The member ID (hex) when etcd answered.
    pub member_id: Option<String>,
    /// `leader`, `follower`, `learner`, or why etcd did not answer.
    pub role: String,
    /// The leader's raft index minus this member's.
    pub raft_index_lag: Option<u64>,
    pub raft_index: Option<u64>,
    pub db_size: Option<i64>,
    pub db_size_in_use: Option<i64>,
    pub alarms: Vec<String>,
    pub version: Option<String>,
    /// `data`, `empty`, or why the sidecar did not answer.
    pub volume: String,
    pub last_decision: Option<LastDecision>,
    /// A recovery or restore this pod's sidecar holds or its volume records.
    pub requests: Vec<String>,
    /// What init waits for, while etcd does not answer there (the pod's peer report).
    pub waiting: Option<Waiting>,
}

/// The newest snapshot in the store, when backups are configured.
#[derive(Debug, Clone, Serialize)]
pub struct BackupStatus {
    pub url: String,
    pub stored: usize,
    pub newest: Option<String>,
    pub newest_age_seconds: Option<u64>,
    pub newest_verified: Option<bool>,
    pub error: Option<String>,
    /// What a restore would run, and whether it moves the revision forward (a sentence).
    pub restore_tool: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// When the pods were asked (Unix seconds): the times the screen shows are said
    /// relative to it.
    pub at: u64,
    pub cluster_id: Option<String>,
    /// The leader's pod (or member ID when no pod claims it).
    pub leader: Option<String>,
    pub voters: usize,
    pub learners: usize,
    /// Members the cluster lists that no pod of the set answered for.
    pub other_members: Vec<String>,
    pub pods: Vec<PodStatus>,
    pub backups: Option<BackupStatus>,
    /// The newest corruption check any pod's sidecar knows (the leader's sidecar runs it):
    /// when, by whom, every voter's answer and the verdict.
    pub corruption_check: Option<crate::facts::hashes::HashCheck>,
}

fn member_name(m: &MemberInfo) -> String {
    if m.name.is_empty() {
        format!("{:x} (not started)", m.id)
    } else {
        m.name.clone()
    }
}

/// A pod asked: (ordinal, name, address, its sidecar's report).
type Asked = (u32, String, Option<IpAddr>, Result<PeerReport, String>);

/// Asks every pod of the set (the initial ones, and higher ordinals whose names exist).
pub async fn gather<D, C>(cfg: Config, dns: D, connector: C) -> anyhow::Result<ClusterStatus>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    let obs = cfg.observer(dns, connector.clone());
    let f = obs.observe(String::new()).await?;
    let id = &cfg.identity;
    let mut pods: Vec<Asked> = Vec::new();
    let own_report = match f.own_dns.first() {
        Some(ip) => {
            use crate::observe::PeerReports;
            obs.reports
                .report(&f.name, &id.host(f.ordinal), ip, CALL)
                .await
        }
        None => Err("name does not resolve".into()),
    };
    pods.push((f.ordinal, f.name.clone(), f.own_dns.first(), own_report));
    for p in &f.peers {
        let report = match &p.report {
            Some(r) => r.clone(),
            None if p.ordinal >= f.replicas => continue,
            None => Err("name does not resolve".into()),
        };
        pods.push((p.ordinal, p.name.clone(), p.dns.first(), report));
    }
    pods.sort_by_key(|p| p.0);

    let mut statuses = Vec::new();
    let mut members: Option<(u64, Vec<MemberInfo>)> = None;
    for (o, name, ip, _) in &pods {
        let Some(ip) = ip else {
            statuses.push(None);
            continue;
        };
        let got = async {
            let m = connector.connect(&id.host(*o), *ip, id.client_port).await?;
            let s = m.status().await?;
            if members.is_none() && !s.is_learner {
                members = m.members().await.ok();
            }
            Ok::<_, crate::etcd::EtcdError>(s)
        };
        let r = tokio::time::timeout(CALL * 2, got)
            .await
            .unwrap_or_else(|_| {
                Err(crate::etcd::EtcdError::Unreachable {
                    endpoint: name.clone(),
                    detail: "no answer".into(),
                })
            });
        statuses.push(Some(r.map_err(|e| e.to_string())));
    }
    let leader_index = statuses
        .iter()
        .flatten()
        .filter_map(|s| s.as_ref().ok())
        .find(|s| s.leader != 0 && s.leader == s.member_id)
        .map(|s| s.raft_index);
    let mut out = Vec::new();
    for ((_, name, _, report), status) in pods.iter().zip(&statuses) {
        let answered = match status {
            Some(Ok(s)) => Ok(s),
            Some(Err(e)) => Err(format!("etcd: {e}")),
            None => Err("name does not resolve".to_string()),
        };
        let role = match &answered {
            Ok(s) if s.is_learner => "learner".to_string(),
            Ok(s) if s.leader == s.member_id => "leader".to_string(),
            Ok(s) if s.leader == 0 => "no leader".to_string(),
            Ok(_) => "follower".to_string(),
            Err(why) => why.clone(),
        };
        let s = answered.as_ref().ok();
        let waiting = report.as_ref().ok().and_then(|r| r.waiting.clone());
        let (volume, last_decision, requests) = match report {
            Ok(r) => {
                let mut requests = Vec::new();
                if let Some(q) = &r.recovery_request {
                    requests.push(format!("recovery {} from {} requested", q.id, q.survivor));
                }
                if let Some(m) = &r.recovery {
                    let applied = if m.applied(r.log.as_ref()) {
                        "done"
                    } else {
                        "pending"
                    };
                    requests.push(format!("recovered from this volume: {} ({applied})", m.id));
                }
                if let Some(q) = &r.restore_request {
                    requests.push(format!("restore {} to {} requested", q.id, q.snapshot));
                }
                if let Some(q) = &r.rebuild_request {
                    requests.push(format!(
                        "rebuild of member {:x} under way (its data diverged: {})",
                        q.member, q.check.verdict
                    ));
                }
                let volume = if r.has_data { "data" } else { "empty" };
                (volume.to_string(), r.last_decision.clone(), requests)
            }
            Err(e) => (format!("sidecar: {e}"), None, vec![]),
        };
        out.push(PodStatus {
            pod: name.clone(),
            member_id: s.map(|s| format!("{:x}", s.member_id)),
            role,
            raft_index_lag: s.and_then(|s| leader_index.map(|l| l.saturating_sub(s.raft_index))),
            raft_index: s.map(|s| s.raft_index),
            db_size: s.map(|s| s.db_size),
            db_size_in_use: s.map(|s| s.db_size_in_use),
            alarms: s.map(|s| s.errors.clone()).unwrap_or_default(),
            version: s.map(|s| s.version.clone()),
            volume,
            last_decision,
            requests,
            waiting,
        });
    }
    let answered: Vec<&String> = out.iter().filter_map(|p| p.member_id.as_ref()).collect();
    let (cluster_id, voters, learners, other_members, leader) = match &members {
        Some((cid, list)) => {
            let leader_id = statuses
                .iter()
                .flatten()
                .filter_map(|s| s.as_ref().ok())
                .map(|s| s.leader)
                .find(|l| *l != 0);
            let leader = leader_id.map(|l| {
                list.iter()
                    .find(|m| m.id == l)
                    .map(member_name)
                    .unwrap_or_else(|| format!("{l:x}"))
            });
            (
                Some(format!("{cid:x}")),
                list.iter().filter(|m| !m.is_learner).count(),
                list.iter().filter(|m| m.is_learner).count(),
                list.iter()
                    .filter(|m| !answered.contains(&&format!("{:x}", m.id)))
                    .map(|m| format!("{} ({:x})", member_name(m), m.id))
                    .collect(),
                leader,
            )
        }
        None => (None, 0, 0, vec![], None),
    };
    let backups = match &cfg.backup {
        None => None,
        Some(b) => Some(backup_status(&cfg, b).await),
    };
    let corruption_check = pods
        .iter()
        .filter_map(|(_, _, _, r)| r.as_ref().ok()?.hash_check.clone())
        .max_by_key(|c| c.at);
    Ok(ClusterStatus {
        at: crate::clock::unix_now(),
        corruption_check,
        cluster_id,
        leader,
        voters,
        learners,
        other_members,
        pods: out,
        backups,
    })
}

async fn backup_status(cfg: &Config, b: &crate::backup::BackupConfig) -> BackupStatus {
    let mut s = BackupStatus {
        url: b.url.clone(),
        stored: 0,
        newest: None,
        newest_age_seconds: None,
        newest_verified: None,
        error: None,
        restore_tool: restore_tool(
            &b.tool
                .clone()
                .check(crate::backup::tool::CHECK_TIMEOUT)
                .await,
        ),
    };
    let listed = match Backups::new(b, cfg.etcd_bin.clone()) {
        Ok(backups) => backups.list().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match listed {
        Ok(list) => {
            s.stored = list.len();
            if let Some(m) = list.first() {
                s.newest = Some(m.name.clone());
                s.newest_age_seconds = Some(crate::clock::unix_now().saturating_sub(m.time_unix));
                s.newest_verified = Some(m.verified);
            }
        }
        Err(e) => s.error = Some(e),
    }
    s
}

/// The restore tool as `status` reports it: which one, and what a restore does to the
/// revision with it (and which tool the jump needs when it cannot).
fn restore_tool(
    checked: &Result<crate::backup::EtcdTool, crate::backup::tool::ToolError>,
) -> String {
    use crate::backup::tool::{Jump, JUMP_NEEDS};
    match checked {
        Err(e) => {
            format!("the restore tool does not run: {e}; restores and drills fail (--etcdutl-bin)")
        }
        Ok(t) => {
            let which = format!(
                "{} ({})",
                t.bin.display(),
                t.version.as_deref().unwrap_or("version unknown")
            );
            match t.jump() {
                Jump::By(n) => format!("{which}; a restore moves the revision forward by {n} (older revisions read as compacted)"),
                Jump::Off => format!("{which}; --restore-bump-revision 0: a restore takes the revision back to the snapshot's"),
                Jump::Unsupported => format!("{which} cannot move a restore's revision forward: a restore takes it back to the snapshot's; the jump needs {JUMP_NEEDS}"),
            }
        }
    }
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// The screen: the cluster, one line per member, one per pod's volume and last decision,
/// the backups.
pub fn render(s: &ClusterStatus) -> String {
    let mut out = String::new();
    match &s.cluster_id {
        Some(id) => out.push_str(&format!(
            "cluster {id}  leader {}  {} voters, {} learners\n",
            s.leader.as_deref().unwrap_or("none"),
            s.voters,
            s.learners
        )),
        None => out.push_str(
            "no member answered with the member list (no quorum, or etcd down everywhere)\n",
        ),
    }
    out.push('\n');
    let header = [
        "POD", "MEMBER", "ROLE", "LAG", "DB", "IN USE", "ALARMS", "VERSION",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for p in &s.pods {
        rows.push(vec![
            p.pod.clone(),
            or_dash(p.member_id.as_ref()),
            p.role.clone(),
            or_dash(p.raft_index_lag),
            mib_or_gib(p.db_size),
            mib_or_gib(p.db_size_in_use),
            if p.alarms.is_empty() {
                "-".into()
            } else {
                p.alarms.join(",")
            },
            or_dash(p.version.as_ref()),
        ]);
    }
    out.push_str(&table(&rows));
    for m in &s.other_members {
        out.push_str(&format!(
            "member {m}: listed by the cluster, no pod answers for it\n"
        ));
    }
    out.push('\n');
    let mut rows: Vec<Vec<String>> =
        vec![vec!["POD".into(), "VOLUME".into(), "LAST DECISION".into()]];
    for p in &s.pods {
        let last = match &p.last_decision {
            Some(d) => {
                let reason: String = d.reason.chars().take(90).collect();
                format!("{} {}: {reason}", d.action, moment(d.ts, s.at))
            }
            None => "-".into(),
        };
        rows.push(vec![p.pod.clone(), p.volume.clone(), last]);
    }
    out.push_str(&table(&rows));
    for p in &s.pods {
        for r in &p.requests {
            out.push_str(&format!("{}: {r}\n", p.pod));
        }
        if let Some(w) = &p.waiting {
            out.push_str(&format!(
                "{}: init is waiting (since {}): {}\n",
                p.pod,
                moment(w.since, s.at),
                w.reason
            ));
        }
    }
    if let Some(c) = &s.corruption_check {
        out.push_str(&format!(
            "\ncorruption check {} by {:x}: {}\n",
            moment(c.at, s.at),
            c.checker,
            c.verdict
        ));
    }
    if let Some(b) = &s.backups {
        out.push('\n');
        match (&b.error, &b.newest) {
            (Some(e), _) => out.push_str(&format!("backups {}: cannot list: {e}\n", b.url)),
            (None, None) => out.push_str(&format!("backups {}: none stored\n", b.url)),
            (None, Some(n)) => out.push_str(&format!(
                "backups {}: {} stored; newest {n}, {} ago, {}\n",
                b.url,
                b.stored,
                humantime::format_duration(Duration::from_secs(b.newest_age_seconds.unwrap_or(0))),
                if b.newest_verified == Some(true) {
                    "verified"
                } else {
                    "NOT verified"
                }
            )),
        }
        out.push_str(&format!("restores: {}\n", b.restore_tool));
    }
    out
}

pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|v| v.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if i + 1 == r.len() {
                    v.clone()
                } else {
                    format!("{v:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::ActionKind;

    fn pod(name: &str, role: &str, lag: Option<u64>) -> PodStatus {
        PodStatus {
            pod: name.into(),
            member_id: Some("8e9e05c52164694d".into()),
            role: role.into(),
            raft_index_lag: lag,
            raft_index: Some(100),
            db_size: Some(25 << 20),
            db_size_in_use: Some(12 << 20),
            alarms: vec![],
            version: Some("3.5.1".into()),
            volume: "data".into(),
            last_decision: Some(LastDecision {
                ts: 1_700_000_000,
                action: ActionKind::Restart,
                reason: "the volume holds the data of member 8e9e".into(),
            }),
            requests: vec![],
            waiting: None,
        }
    }

    #[test]
    fn the_screen_shows_each_member_its_volume_and_the_backups() {
        let mut down = pod("etcd-2", "etcd: unreachable", None);
        down.member_id = None;
        down.db_size = None;
        down.alarms = vec!["NOSPACE".into()];
        down.requests = vec!["recovery r1 from etcd-0 requested".into()];
        down.waiting = Some(Waiting {
            since: 1_700_000_100,
            kind: "NoUsableBackup".into(),
            reason: "no backup is usable: s1 is encrypted to key sha256:aa".into(),
        });
        let s = ClusterStatus {
            at: 1_700_000_400,
            cluster_id: Some("64a97c88a32f23bf".into()),
            leader: Some("etcd-0".into()),
            voters: 3,
            learners: 0,
            other_members: vec!["etcd-9 (abc)".into()],
            pods: vec![
                pod("etcd-0", "leader", Some(0)),
                pod("etcd-1", "follower", Some(3)),
                down,
            ],
            backups: Some(BackupStatus {
                url: "s3://b/p".into(),
                stored: 4,
                newest: Some("20261124T080000.000Z-r9".into()),
                newest_age_seconds: Some(600),
                newest_verified: Some(true),
                error: None,
                restore_tool: restore_tool(&Ok(crate::backup::EtcdTool {
                    bump_revision: 1000,
                    version: Some("etcdctl version: 3.4.23".into()),
                    ..crate::backup::EtcdTool::from_bin("/usr/bin/etcdctl")
                })),
            }),
            corruption_check: Some(diverged_check()),
        };
        let text = render(&s);
        assert!(
            text.starts_with("cluster 64a97c88a32f23bf  leader etcd-0  3 voters, 0 learners\n"),
            "{text}"
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("etcd-1 "))
            .unwrap_or_default();
        for want in ["follower", " 3 ", "25.0 MiB", "12.0 MiB", "3.5.1"] {
            assert!(line.contains(want), "{want:?} in {line:?}");
        }
        assert!(text.contains("NOSPACE"), "{text}");
        assert!(
            text.contains("etcd-2: recovery r1 from etcd-0 requested"),
            "{text}"
        );
        assert!(
            text.contains("etcd-2: init is waiting (since 2023-11-14T22:15:00Z (5m ago)): no backup is usable: s1 is encrypted to key sha256:aa\n"),
            "{text}"
        );
        assert!(text.contains("member etcd-9 (abc): listed by the cluster, no pod answers for it"));
        assert!(
            text.contains("restart 2023-11-14T22:13:20Z (6m ago): the volume holds"),
            "{text}"
        );
        assert!(
            text.contains("4 stored; newest 20261124T080000.000Z-r9, 10m ago, verified"),
            "{text}"
        );
        assert!(
            text.contains("corruption check 2023-11-14T22:16:40Z (3m ago) by a: diverged at revision 9: b answered 00000009; the majority of the 3 voters (a, c) answered 00000007\n"),
            "{text}"
        );
        assert!(
            text.contains("restores: /usr/bin/etcdctl (etcdctl version: 3.4.23) cannot move a restore's revision forward")
                && text.contains("the jump needs an etcdutl 3.5.x whose snapshot restore has --bump-revision"),
            "{text}"
        );
    }

    fn diverged_check() -> crate::facts::hashes::HashCheck {
        use crate::facts::hashes::{judge, Answered, HashAnswer, HashCheck, HashRound};
        let answers: Vec<HashAnswer> = [(0xa, 7), (0xb, 9), (0xc, 7)]
            .into_iter()
            .map(|(member, hash)| HashAnswer {
                member,
                got: Answered::Hash {
                    hash,
                    compact_revision: 1,
                },
            })
            .collect();
        let verdict = judge(&HashRound {
            revision: 9,
            voters: vec![0xa, 0xb, 0xc],
            answers: answers.clone(),
        });
        HashCheck {
            at: 1_700_000_200,
            checker: 0xa,
            answers,
            verdict,
        }
    }

    #[test]
    fn the_screen_shows_no_bare_unix_seconds() {
        let mut s = ClusterStatus {
            at: 1_700_000_400,
            cluster_id: None,
            leader: None,
            voters: 0,
            learners: 0,
            other_members: vec![],
            pods: vec![pod("etcd-0", "no leader", None)],
            backups: None,
            corruption_check: Some(diverged_check()),
        };
        s.pods[0].waiting = Some(Waiting {
            since: 1_700_000_100,
            kind: "NoProofYet".into(),
            reason: "waiting".into(),
        });
        let text = render(&s);
        assert!(!text.contains('@') && !text.contains("17000"), "{text}");
    }

    #[test]
    fn without_quorum_the_screen_says_so() {
        let s = ClusterStatus {
            at: 1_700_000_400,
            cluster_id: None,
            leader: None,
            voters: 0,
            learners: 0,
            other_members: vec![],
            pods: vec![pod("etcd-0", "no leader", None)],
            backups: None,
            corruption_check: None,
        };
        assert!(render(&s).starts_with("no member answered with the member list"));
    }
}
