//! `etcd-steward leave [--yes]` and `etcd-steward rejoin`, run in a pod's etcd container:
//! a planned departure (what `etcdadm reset` does on a host). `leave` checks that removing
//! this member keeps quorum and is not the last voter, records the leave in the volume
//! (`steward-left.json`, outside `member/`), removes the member, and stops etcd; `init`
//! then sets the data aside (renamed, never deleted) and waits until `rejoin` (or a new
//! volume). [`check`] is the pure rule.
//!
//! `leave --if-scaled-in` is the etcd container's preStop hook: it asks the Kubernetes API
//! whether the StatefulSet's spec.replicas still covers this pod's ordinal. A pod merely
//! restarted or rescheduled keeps its member (exit 0, nothing done); a pod scaled away
//! removes its member without the marker, so that a later scale-up on the retained volume
//! sets the old data aside and joins as a new member.

use std::time::Duration;

use serde_json::json;

use crate::clock::unix_now;
use crate::config::Config;
use crate::dns::Dns;
use crate::etcd::{Connector, Etcd};
use crate::facts::LeftMarker;
use crate::volume::marker;

/// What the leave would do to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    pub is_learner: bool,
    /// Voters the cluster lists, this member included (when it is one).
    pub voters: usize,
    /// Other voters that answered and see a leader.
    pub healthy_others: usize,
}

/// Pure: why this member may not leave, if it may not.
pub fn check(c: &Counts) -> Result<(), String> {
    if c.is_learner {
        return Ok(());
    }
    let after = c.voters.saturating_sub(1);
    if after == 0 {
        return Err("this is the cluster's last voter: removing it would end the cluster".into());
    }
    let quorum = after / 2 + 1;
    if c.healthy_others < quorum {
        return Err(format!(
            "after it, {after} voters would remain, of which {} answer: fewer than their quorum of {quorum}",
            c.healthy_others
        ));
    }
    Ok(())
}

/// How long `leave` retries a removal etcd refuses for now.
const REMOVE_PATIENCE: Duration = Duration::from_secs(30);

/// How `leave` ended.
pub enum Left {
    Planned,
    Done,
    Refused(String),
    /// `--if-scaled-in`, and spec.replicas still covers this ordinal: nothing done.
    NotScaledIn,
}

/// Pure: whether a pod of `ordinal` is being scaled away when the set wants `replicas`.
/// `replicas: 0` stops the whole set (maintenance) rather than shrinking it: no pod leaves.
pub fn scaled_in(ordinal: u32, replicas: u32) -> bool {
    replicas > 0 && ordinal >= replicas
}

/// `leave [--yes]`, or with `if_scaled_in` the preStop hook (see the module).
pub async fn leave<D, C>(
    cfg: Config,
    yes: bool,
    if_scaled_in: bool,
    dns: D,
    connector: C,
) -> anyhow::Result<Left>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    let id = &cfg.identity;
    if if_scaled_in {
        let Some(access) = &cfg.kube else {
            anyhow::bail!("--if-scaled-in needs the Kubernetes API: run in a cluster (KUBERNETES_SERVICE_HOST) or give --kube-api-url; nothing was done");
        };
        let api = crate::kube_api::ApiWorkload::new(access)?;
        let replicas = crate::kube_api::Workload::desired_replicas(&api)
            .await
            .map_err(|e| anyhow::anyhow!("{e}; nothing was done"))?;
        if !scaled_in(id.ordinal, replicas) {
            println!(
                "{}",
                json!({"state": "not scaled in", "pod": id.name(), "replicas": replicas, "next": "nothing: this pod keeps its member"})
            );
            return Ok(Left::NotScaledIn);
        }
        tracing::warn!(pod = %id.name(), replicas, "leave --if-scaled-in: this ordinal is scaled away; removing its member");
    }
    let yes = yes || if_scaled_in;
    let me = connector
        .connect(&id.host(id.ordinal), cfg.local_ip(), id.client_port)
        .await?;
    let status = me.status().await?;
    let recorded = marker::left(&cfg.data_dir)
        .map_err(|e| anyhow::anyhow!("the leave marker {e}; nothing was done"))?;
    if let Some(m) = recorded {
        // A leave recorded earlier: done only if the cluster says the member is gone. A
        // member list that fails is no such answer: the error, never "left".
        let (_, members) = me.members().await?;
        if m.member_id == status.member_id && !members.iter().any(|x| x.id == m.member_id) {
            println!(
                "{}",
                json!({"state": "left", "member_id": format!("{:x}", m.member_id)})
            );
            return Ok(Left::Done);
        }
    }
    let (_, members) = me.members().await?;
    let voters = members.iter().filter(|m| !m.is_learner).count();
    let mut healthy_others = 0;
    // Another voter that answered: it says whether a removal whose answer was lost (the
    // local etcd stops as soon as it is removed, sometimes before it answers) took effect.
    let mut witness = None;
    for m in members
        .iter()
        .filter(|m| !m.is_learner && m.id != status.member_id)
    {
        let Some(o) = m.peer_urls.iter().find_map(|u| id.ordinal_of_peer_url(u)) else {
            continue;
        };
        let Ok(lookup) =
            tokio::time::timeout(Duration::from_secs(2), dns.lookup(&id.host(o))).await
        else {
            continue;
        };
        let Some(ip) = lookup.first() else { continue };
        let answered = tokio::time::timeout(Duration::from_secs(3), async {
            let peer = connector.connect(&id.host(o), ip, id.client_port).await?;
            let s = peer.status().await?;
            Ok::<_, crate::etcd::EtcdError>((peer, s))
        })
        .await;
        if let Ok(Ok((peer, s))) = answered {
            if s.leader != 0 {
                healthy_others += 1;
                witness.get_or_insert(peer);
            }
        }
    }
    let counts = Counts {
        is_learner: status.is_learner,
        voters,
        healthy_others,
    };
    if let Err(why) = check(&counts) {
        return Ok(Left::Refused(why));
    }
    let plan = json!({
        "pod": id.name(),
        "member_id": format!("{:x}", status.member_id),
        "role": if status.is_learner { "learner" } else { "voter" },
        "voters_before": voters,
        "voters_after": if status.is_learner { voters } else { voters - 1 },
        "other_voters_answering": healthy_others,
        "steps": if if_scaled_in {
            json!(["remove the member", "stop etcd; a later scale-up on this volume sets the data aside and joins as a new member"])
        } else {
            json!(["record the leave in the volume", "remove the member", "stop etcd; init sets the data aside and waits for etcd-steward rejoin"])
        },
        "state": if yes { "leaving" } else { "planned" },
    });
    println!("{plan}");
    if !yes {
        return Ok(Left::Planned);
    }
    if !if_scaled_in {
        marker::write_left(
            &cfg.data_dir,
            &LeftMarker {
                ts: unix_now(),
                member_id: status.member_id,
            },
        )?;
        tracing::warn!(member_id = %format!("{:x}", status.member_id), "leave: recorded in the volume; removing this member");
    }
    // etcd refuses membership changes for a few seconds after a member (re)connects
    // ("unhealthy cluster"): retried for a while, as init retries its own.
    let deadline = tokio::time::Instant::now() + REMOVE_PATIENCE;
    loop {
        match me.remove(status.member_id).await {
            Ok(()) | Err(crate::etcd::EtcdError::MemberNotFound { .. }) => break,
            Err(crate::etcd::EtcdError::UnhealthyCluster | crate::etcd::EtcdError::NoLeader)
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                let removed = match &witness {
                    Some(w) => w
                        .members()
                        .await
                        .is_ok_and(|(_, ms)| !ms.iter().any(|m| m.id == status.member_id)),
                    None => false,
                };
                if removed {
                    break;
                }
                let recorded = if if_scaled_in {
                    ""
                } else {
                    "the leave is recorded, but "
                };
                anyhow::bail!(
                    "{recorded}removing member {:x} failed: {e}; run leave again",
                    status.member_id
                )
            }
        }
    }
    tracing::warn!(member_id = %format!("{:x}", status.member_id), "leave: member removed; stopping etcd");
    match crate::exec::find_etcd(&cfg.data_dir) {
        Some(pid) => {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
            }
        }
        None => eprintln!("etcd-steward: no etcd process for {} is visible here: restart the pod so that init sets the data aside", cfg.data_dir.display()),
    }
    let next = if if_scaled_in {
        "nothing: a scale-up on this volume joins as a new member"
    } else {
        "etcd-steward rejoin, when this pod should join again"
    };
    println!(
        "{}",
        json!({"state": "left", "member_id": format!("{:x}", status.member_id), "next": next})
    );
    Ok(Left::Done)
}

/// `rejoin`: the leave marker is renamed; `init` (waiting) then joins as a new member.
pub fn rejoin(cfg: &Config) -> anyhow::Result<bool> {
    let cleared = marker::clear_left(&cfg.data_dir, unix_now())?;
    println!(
        "{}",
        json!({"state": if cleared { "rejoining" } else { "not left" }})
    );
    Ok(cleared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeCluster, FakeDns, Op, Times};

    /// The configuration of pod `etcd-0` of a 3-pod set, on `data_dir`.
    fn config(data_dir: &std::path::Path) -> Config {
        use clap::Parser;
        let dir = format!("--data-dir={}", data_dir.display());
        let argv = [
            "etcd-steward",
            "leave",
            "--name=etcd-0",
            "--replicas=3",
            &dir,
        ];
        match crate::config::Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(crate::config::Command::Leave(args)) => {
                args.common.validate().unwrap_or_else(|e| panic!("{e}"))
            }
            other => panic!("{other:?}"),
        }
    }

    /// A leave recorded earlier whose removal did not happen (the member is still
    /// listed), run again while the member list fails (no leader): the command fails; it
    /// never reads the failure as an empty list and says "left".
    #[tokio::test]
    async fn a_rerun_whose_member_list_fails_is_an_error_not_left() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cfg = config(dir.path());
        let cluster = FakeCluster::new(0xc1);
        for o in 0..3u64 {
            let host = cfg.identity.host(o as u32);
            cluster.add_member(
                0xa0 + o,
                &format!("etcd-{o}"),
                &format!("http://{host}:2380"),
                &format!("http://{host}:2379"),
                false,
            );
        }
        cluster.set_leader(0xa1);
        let left = crate::facts::LeftMarker {
            ts: 1,
            member_id: 0xa0,
        };
        marker::write_left(&cfg.data_dir, &left).unwrap_or_else(|e| panic!("{e}"));
        cluster.fail_everywhere(
            Op::Members,
            crate::etcd::EtcdError::TimedOut {
                endpoint: "any".into(),
                detail: "no leader".into(),
            },
            Times::Always,
        );
        let result = leave(cfg, true, false, FakeDns::default(), cluster.clone()).await;
        assert!(
            result
                .as_ref()
                .is_err_and(|e| e.to_string().contains("no leader")),
            "{:?}",
            result.map(|_| "a result")
        );
        assert_eq!(cluster.members().len(), 3, "nothing was removed");
    }

    /// A leave marker that cannot be parsed stops the command, naming the file.
    #[tokio::test]
    async fn an_unreadable_leave_marker_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cfg = config(dir.path());
        let cluster = FakeCluster::new(0xc1);
        let host = cfg.identity.host(0);
        cluster.add_member(
            0xa0,
            "etcd-0",
            &format!("http://{host}:2380"),
            &format!("http://{host}:2379"),
            false,
        );
        std::fs::write(dir.path().join("steward-left.json"), b"{trunc")
            .unwrap_or_else(|e| panic!("{e}"));
        let result = leave(cfg, true, false, FakeDns::default(), cluster.clone()).await;
        assert!(
            result
                .as_ref()
                .is_err_and(|e| e.to_string().contains("steward-left.json")),
            "{:?}",
            result.map(|_| "a result")
        );
        assert_eq!(cluster.members().len(), 1, "nothing was removed");
    }

    fn counts(voters: usize, healthy_others: usize) -> Counts {
        Counts {
            is_learner: false,
            voters,
            healthy_others,
        }
    }

    #[test]
    fn a_voter_leaves_only_when_the_rest_keep_their_quorum() {
        assert_eq!(check(&counts(3, 2)), Ok(()));
        assert!(
            check(&counts(3, 1)).is_err(),
            "two remain, one answers: their quorum is 2"
        );
        assert!(check(&counts(5, 2)).is_err());
        assert!(check(&counts(5, 3)).is_ok());
    }

    #[test]
    fn only_an_ordinal_at_or_beyond_spec_replicas_is_scaled_in() {
        assert!(scaled_in(4, 3));
        assert!(scaled_in(3, 3));
        assert!(
            !scaled_in(2, 3),
            "a restarted or rescheduled pod keeps its member"
        );
        assert!(
            !scaled_in(0, 0) && !scaled_in(2, 0),
            "replicas 0 stops the set, it does not shrink it"
        );
    }

    #[test]
    fn the_last_voter_never_leaves_and_a_learner_always_may() {
        assert!(check(&counts(1, 0)).is_err_and(|e| e.contains("last voter")));
        assert_eq!(
            check(&Counts {
                is_learner: true,
                voters: 1,
                healthy_others: 0
            }),
            Ok(())
        );
    }
}
