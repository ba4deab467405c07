//! Pure: which surviving volume a cluster that lost its majority is recovered from, what
//! each pod does, or why nothing may be done. `etcd-steward recover` prints this plan;
//! the survivor's `init` computes it again from its own observations and acts only when
//! it comes to the same survivor.
//!
//! The evidence is each volume's WAL tail ([`WalTail`]), ordered by raft's up-to-date
//! rule: the last entry's term, then its index. The survivor keeps its whole log: before
//! the forced start its commit index is moved to the last entry (etcd's commit index on
//! disk may lag what was acknowledged, and `--force-new-cluster` discards the entries after
//! it); only a tail that cannot be read cleanly keeps just its committed part, and the plan
//! says how many entries that discards. Every pod that might hold fresher data must have
//! answered with that evidence, unless the operator names it lost for good.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::facts::{ClusterFacts, Facts, Lookup, PeerReport, WalTail};

/// What one pod is known to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    Empty,
    /// Data, and how far its log goes (`None`: the tail could not be read).
    Data {
        cluster_id: Option<u64>,
        log: Option<WalTail>,
    },
    /// No answer: it could hold anything.
    Unknown(String),
}

/// One pod, as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    pub ordinal: u32,
    pub holding: Holding,
}

/// What a pod does in the recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// Its etcd starts once with `--force-new-cluster`, as a one-member cluster on its data.
    ForceNewCluster,
    /// Its data is set aside (renamed, not deleted) and it joins as a new learner.
    SetAsideAndJoin,
    /// Its volume is empty: it joins as a new learner.
    Join,
    /// Named lost for good (`--force-lost`): its member is dropped; if it comes back it
    /// joins anew.
    Lost,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodPlan {
    pub pod: String,
    pub holds: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<WalTail>,
    pub step: Step,
}

/// The plan: recover from `survivor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub id: String,
    pub survivor: String,
    pub why: String,
    /// How many entries after the survivor's commit index on disk the recovery keeps
    /// (written, maybe acknowledged, but not yet marked committed on its disk).
    pub keeps_entries_beyond_commit: u64,
    /// How many it discards (its WAL's tail cannot be read cleanly).
    pub discards_entries_beyond_commit: u64,
    pub pods: Vec<PodPlan>,
}

/// Why no recovery may be done. `Display` is the one line the command prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Quorum {
        via: String,
        leader: u64,
        voters: usize,
    },
    NoData,
    Silent {
        pods: Vec<String>,
    },
    NoEvidence {
        pods: Vec<String>,
    },
    MixedClusters {
        clusters: Vec<String>,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Quorum { via, leader, voters } => write!(f, "the cluster has quorum ({via} answered a linearizable read; leader {leader:x}, {voters} members): nothing to recover"),
            Refusal::NoData => write!(f, "no volume holds data: there is nothing to recover from (a new cluster forms, or is restored from a backup, by itself)"),
            Refusal::Silent { pods } => write!(f, "{} did not answer and could hold fresher data: bring them back, or name each one lost for good with --force-lost", pods.join(", ")),
            Refusal::NoEvidence { pods } => write!(f, "{} hold data but did not say how far their log goes (a sidecar older than this one, or an unreadable WAL): upgrade it, or name it with --force-lost", pods.join(", ")),
            Refusal::MixedClusters { clusters } => write!(f, "the surviving volumes belong to different clusters ({}): choose by hand which to keep", clusters.join("; ")),
        }
    }
}

/// The pods of `f` as the plan sees them: this pod (its own volume) and every peer that
/// belongs to the set (an initial ordinal, or a higher one whose name exists).
pub fn pods_of(f: &Facts) -> Vec<Pod> {
    let own = if f.data.has_data() {
        Holding::Data {
            cluster_id: f.data.wal_identity().map(|w| w.cluster_id),
            log: f.data.tail,
        }
    } else {
        Holding::Empty
    };
    let mut pods = vec![Pod {
        name: f.name.clone(),
        ordinal: f.ordinal,
        holding: own,
    }];
    for p in &f.peers {
        let holding = match (&p.dns, &p.report) {
            (Lookup::NotFound, _) if p.ordinal >= f.replicas => continue,
            (_, Some(Ok(r))) => holding_of(r),
            (_, Some(Err(e))) => Holding::Unknown(format!("sidecar did not answer: {e}")),
            (Lookup::NotFound, None) => Holding::Unknown("DNS name not published".into()),
            (Lookup::Failed(e), None) => Holding::Unknown(format!("DNS lookup failed: {e}")),
            (Lookup::Found(_), None) => Holding::Unknown("not asked".into()),
        };
        pods.push(Pod {
            name: p.name.clone(),
            ordinal: p.ordinal,
            holding,
        });
    }
    pods.sort_by_key(|p| p.ordinal);
    pods
}

fn holding_of(r: &PeerReport) -> Holding {
    if r.has_data {
        Holding::Data {
            cluster_id: r.wal.map(|w| w.cluster_id),
            log: r.log,
        }
    } else {
        Holding::Empty
    }
}

/// Plans the recovery of `f`'s cluster. `force_lost` names pods the operator declared
/// lost for good; `pending` is the ID of a recovery already under way on the survivor (its
/// marker), kept so that running the command again continues it.
pub fn plan(f: &Facts, force_lost: &[String], pending: Option<&str>) -> Result<Plan, Refusal> {
    if let ClusterFacts::Healthy(view) = &f.cluster {
        return Err(Refusal::Quorum {
            via: view.source.host.clone(),
            leader: view.leader,
            voters: view.members.iter().filter(|m| !m.is_learner).count(),
        });
    }
    plan_pods(&pods_of(f), force_lost, pending)
}

/// [`plan`] once it is known that no cluster has quorum.
pub fn plan_pods(
    pods: &[Pod],
    force_lost: &[String],
    pending: Option<&str>,
) -> Result<Plan, Refusal> {
    let lost: BTreeSet<&str> = force_lost.iter().map(String::as_str).collect();
    let silent: Vec<String> = pods
        .iter()
        .filter(|p| matches!(p.holding, Holding::Unknown(_)) && !lost.contains(p.name.as_str()))
        .map(|p| p.name.clone())
        .collect();
    if !silent.is_empty() {
        return Err(Refusal::Silent { pods: silent });
    }
    let holders: Vec<(&Pod, Option<WalTail>, Option<u64>)> = pods
        .iter()
        .filter(|p| !lost.contains(p.name.as_str()))
        .filter_map(|p| match &p.holding {
            Holding::Data { cluster_id, log } => Some((p, *log, *cluster_id)),
            _ => None,
        })
        .collect();
    if holders.is_empty() {
        return Err(Refusal::NoData);
    }
    let no_evidence: Vec<String> = holders
        .iter()
        .filter(|(_, log, _)| log.is_none())
        .map(|(p, _, _)| p.name.clone())
        .collect();
    if !no_evidence.is_empty() {
        return Err(Refusal::NoEvidence { pods: no_evidence });
    }
    let clusters: BTreeSet<Option<u64>> = holders.iter().map(|(_, _, c)| *c).collect();
    if clusters.len() > 1 {
        return Err(Refusal::MixedClusters {
            clusters: holders
                .iter()
                .map(|(p, _, c)| match c {
                    Some(c) => format!("{}: cluster {c:x}", p.name),
                    None => format!("{}: cluster unreadable", p.name),
                })
                .collect(),
        });
    }
    // The freshest log; on a tie, the lowest ordinal.
    let (survivor, best) = holders
        .iter()
        .filter_map(|(p, log, _)| Some((*p, (*log)?)))
        .max_by(|(a, la), (b, lb)| {
            la.freshness()
                .cmp(&lb.freshness())
                .then(b.ordinal.cmp(&a.ordinal))
        })
        .ok_or(Refusal::NoData)?;
    let (keeps, discards) = (best.keeps_beyond_commit(), best.discards_beyond_commit());
    let mut why = format!(
        "{} holds the freshest log: last entry {} of term {} (commit index {} on disk); it keeps {keeps} entries beyond the commit index",
        survivor.name, best.last_index, best.last_term, best.commit
    );
    if discards > 0 {
        why.push_str(&format!(
            " and discards {discards} (its WAL's tail cannot be read cleanly: --force-new-cluster drops them)"
        ));
    }
    let others: Vec<String> = holders
        .iter()
        .filter(|(p, _, _)| p.name != survivor.name)
        .filter_map(|(p, log, _)| {
            let l = (*log)?;
            Some(format!(
                "{} last entry {} of term {}",
                p.name, l.last_index, l.last_term
            ))
        })
        .collect();
    if !others.is_empty() {
        why.push_str(&format!("; older: {}", others.join(", ")));
    }
    let pods = pods
        .iter()
        .map(|p| {
            let (holds, log) = match &p.holding {
                Holding::Empty => ("empty".to_string(), None),
                Holding::Data { log, .. } => ("data".to_string(), *log),
                Holding::Unknown(e) => (format!("unknown ({e})"), None),
            };
            let step = if p.name == survivor.name {
                Step::ForceNewCluster
            } else if lost.contains(p.name.as_str()) {
                Step::Lost
            } else if matches!(p.holding, Holding::Data { .. }) {
                Step::SetAsideAndJoin
            } else {
                Step::Join
            };
            PodPlan {
                pod: p.name.clone(),
                holds,
                log,
                step,
            }
        })
        .collect();
    let id = pending
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}-{}-{}", survivor.name, best.last_term, best.last_index));
    Ok(Plan {
        id,
        survivor: survivor.name.clone(),
        why,
        keeps_entries_beyond_commit: keeps,
        discards_entries_beyond_commit: discards,
        pods,
    })
}

/// Pure: whether automatic recovery (`--auto-recover-after`) may act on `f` now — the plan
/// `recover --yes` would carry out with no pod named lost (so every pod answered and no
/// cluster has quorum), with this pod as the survivor, and a majority of the initial pods
/// answering that their volumes are empty: proof of loss. Silence, an unreachable pod or a
/// partition give no plan; pods merely down give none either.
pub fn automatic(f: &Facts) -> Result<Plan, String> {
    if let ClusterFacts::Healthy(_) = &f.cluster {
        return plan(f, &[], None).map_err(|r| r.to_string());
    }
    automatic_pods(&pods_of(f), f.replicas, &f.name)
}

/// [`automatic`] once it is known that no cluster has quorum: `me` is this pod.
pub fn automatic_pods(pods: &[Pod], replicas: u32, me: &str) -> Result<Plan, String> {
    let p = plan_pods(pods, &[], None).map_err(|r| r.to_string())?;
    if p.survivor != me {
        return Err(format!(
            "{} holds the freshest volume, not this pod",
            p.survivor
        ));
    }
    let empty = pods
        .iter()
        .filter(|p| p.ordinal < replicas && p.holding == Holding::Empty)
        .count();
    let majority = replicas as usize / 2 + 1;
    if empty < majority {
        return Err(format!(
            "{empty} of the {replicas} initial pods answered with an empty volume; only a majority ({majority}) proves the loss"
        ));
    }
    Ok(p)
}

/// A recovery under way or done: a volume's marker, with whether its forced start
/// happened, and whether a sidecar still holds that request.
pub fn recorded(f: &Facts) -> Option<(String, bool, bool)> {
    let held = |id: &str| f.recovery_request.as_ref().is_some_and(|r| r.id == id);
    if let Some(m) = &f.data.recovery {
        return Some((m.id.clone(), m.applied(f.data.tail.as_ref()), held(&m.id)));
    }
    f.peers.iter().find_map(|p| {
        let r = p.report.as_ref()?.as_ref().ok()?;
        let m = r.recovery.as_ref()?;
        Some((m.id.clone(), m.applied(r.log.as_ref()), held(&m.id)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(commit: u64, last_term: u64, last_index: u64) -> Holding {
        Holding::Data {
            cluster_id: Some(7),
            log: Some(WalTail {
                last_index,
                last_term,
                commit,
                term: last_term,
                clean_end: true,
            }),
        }
    }

    fn pod(o: u32, holding: Holding) -> Pod {
        Pod {
            name: format!("etcd-{o}"),
            ordinal: o,
            holding,
        }
    }

    #[test]
    fn the_volume_with_the_most_up_to_date_log_is_the_survivor_not_the_highest_commit(
    ) -> Result<(), Refusal> {
        // etcd-0 committed more on disk, but etcd-2's log goes further in the same term:
        // raft would elect etcd-2, and a recovery from it keeps every entry etcd-0 has.
        let pods = [
            pod(0, log(118, 3, 119)),
            pod(1, Holding::Empty),
            pod(2, log(90, 3, 120)),
            pod(3, Holding::Empty),
            pod(4, Holding::Empty),
        ];
        let p = plan_pods(&pods, &[], None)?;
        assert_eq!(p.survivor, "etcd-2");
        assert_eq!(p.keeps_entries_beyond_commit, 30);
        assert_eq!(p.discards_entries_beyond_commit, 0);
        assert!(
            p.why.contains("keeps 30 entries beyond the commit index"),
            "{}",
            p.why
        );
        let steps: Vec<Step> = p.pods.iter().map(|p| p.step).collect();
        assert_eq!(
            steps,
            [
                Step::SetAsideAndJoin,
                Step::Join,
                Step::ForceNewCluster,
                Step::Join,
                Step::Join
            ]
        );
        Ok(())
    }

    #[test]
    fn a_newer_last_term_beats_a_longer_log_then_the_index_then_the_lowest_ordinal(
    ) -> Result<(), Refusal> {
        let pods = [
            pod(0, log(60, 2, 60)),
            pod(1, log(50, 3, 51)),
            pod(2, Holding::Empty),
        ];
        assert_eq!(plan_pods(&pods, &[], None)?.survivor, "etcd-1");
        let pods = [
            pod(0, log(50, 3, 51)),
            pod(1, log(50, 3, 52)),
            pod(2, Holding::Empty),
        ];
        assert_eq!(plan_pods(&pods, &[], None)?.survivor, "etcd-1");
        let pods = [
            pod(0, log(50, 3, 51)),
            pod(1, log(50, 3, 51)),
            pod(2, Holding::Empty),
        ];
        assert_eq!(plan_pods(&pods, &[], None)?.survivor, "etcd-0");
        Ok(())
    }

    #[test]
    fn a_survivor_whose_tail_is_torn_says_how_many_entries_it_discards() -> Result<(), Refusal> {
        let torn = Holding::Data {
            cluster_id: Some(7),
            log: Some(WalTail {
                last_index: 120,
                last_term: 3,
                commit: 112,
                term: 3,
                clean_end: false,
            }),
        };
        let p = plan_pods(&[pod(0, torn), pod(1, Holding::Empty)], &[], None)?;
        assert_eq!(
            (
                p.keeps_entries_beyond_commit,
                p.discards_entries_beyond_commit
            ),
            (0, 8)
        );
        assert!(p.why.contains("discards 8"), "{}", p.why);
        Ok(())
    }

    #[test]
    fn a_silent_pod_refuses_the_plan_until_it_is_named_lost() -> Result<(), Refusal> {
        let pods = [
            pod(0, log(10, 1, 10)),
            pod(1, Holding::Empty),
            pod(2, Holding::Unknown("no answer".into())),
        ];
        assert_eq!(
            plan_pods(&pods, &[], None),
            Err(Refusal::Silent {
                pods: vec!["etcd-2".into()]
            })
        );
        let p = plan_pods(&pods, &["etcd-2".into()], None)?;
        assert_eq!(p.survivor, "etcd-0");
        assert_eq!(p.pods[2].step, Step::Lost);
        Ok(())
    }

    #[test]
    fn no_data_anywhere_and_data_without_evidence_are_refused() {
        let pods = [pod(0, Holding::Empty), pod(1, Holding::Empty)];
        assert_eq!(plan_pods(&pods, &[], None), Err(Refusal::NoData));
        let pods = [
            pod(0, log(10, 1, 10)),
            pod(
                1,
                Holding::Data {
                    cluster_id: Some(7),
                    log: None,
                },
            ),
        ];
        assert_eq!(
            plan_pods(&pods, &[], None),
            Err(Refusal::NoEvidence {
                pods: vec!["etcd-1".into()]
            })
        );
    }

    #[test]
    fn volumes_of_different_clusters_are_refused() {
        let other = Holding::Data {
            cluster_id: Some(8),
            log: Some(WalTail::default()),
        };
        let pods = [
            pod(0, log(10, 1, 10)),
            pod(1, other),
            pod(2, Holding::Empty),
        ];
        assert!(matches!(
            plan_pods(&pods, &[], None),
            Err(Refusal::MixedClusters { .. })
        ));
    }

    #[test]
    fn automatic_recovery_needs_a_majority_of_empty_volumes_and_this_pod_as_survivor() {
        // Five pods: the freshest volume here, two older survivors, two empty: a plan, but
        // no proof of loss (two empty of five is no majority).
        let pods = [
            pod(0, log(90, 3, 90)),
            pod(1, log(80, 3, 80)),
            pod(2, log(70, 3, 70)),
            pod(3, Holding::Empty),
            pod(4, Holding::Empty),
        ];
        assert!(plan_pods(&pods, &[], None).is_ok());
        let no_proof = automatic_pods(&pods, 5, "etcd-0");
        assert!(
            no_proof
                .as_ref()
                .is_err_and(|why| why.contains("only a majority (3)")),
            "{no_proof:?}"
        );
        // Three of five empty: the loss is proven, and only the survivor acts.
        let pods = [
            pod(0, log(90, 3, 90)),
            pod(1, log(80, 3, 80)),
            pod(2, Holding::Empty),
            pod(3, Holding::Empty),
            pod(4, Holding::Empty),
        ];
        assert!(automatic_pods(&pods, 5, "etcd-0").is_ok());
        assert!(automatic_pods(&pods, 5, "etcd-1").is_err());
        // A silent pod is never taken as lost.
        let mut silent = pods.clone();
        silent[4].holding = Holding::Unknown("no answer".into());
        assert!(automatic_pods(&silent, 5, "etcd-0").is_err());
    }

    #[test]
    fn a_recovery_under_way_keeps_its_id() -> Result<(), Refusal> {
        let pods = [pod(0, log(10, 1, 10)), pod(1, Holding::Empty)];
        assert_eq!(plan_pods(&pods, &[], None)?.id, "etcd-0-1-10");
        // The ID names the log's end, which moving the commit index does not change.
        let moved = [pod(0, log(4, 1, 10)), pod(1, Holding::Empty)];
        assert_eq!(plan_pods(&moved, &[], None)?.id, "etcd-0-1-10");
        assert_eq!(plan_pods(&pods, &[], Some("r7"))?.id, "r7");
        Ok(())
    }
}
