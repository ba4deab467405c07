//! Scale-in, by the leader's sidecar only: the StatefulSet's `spec.replicas` is the desired
//! size. A member whose ordinal is at or beyond it and whose pod is gone is removed, one
//! at a time, highest ordinal first, never the leader, never below
//! `min(initial size, spec.replicas)` voters, and only while every remaining voter answers:
//! silence (an API that does not answer, a voter that does not) never removes anything.
//! [`decide`] is the pure rule; the loop feeds it the API's view and the voters' answers.
//! With `--backup-url`, a removal also waits for a snapshot taken after it was decided
//! ([`super::snapshot_guard`]): never a removal without one.

use std::fmt;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

pub use super::observation::{ScaleInSeen, WorkloadSeen, WorkloadState};
use super::snapshot_guard::{SnapshotGuard, Verdict, Waiting};
use super::{Observation, Outcome, Planner, Step};
use crate::facts::MemberInfo;
use crate::identity::Identity;

/// The member to remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removal {
    pub id: u64,
    pub ordinal: u32,
}

/// Why nothing is removed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Only the leader's sidecar removes.
    NotLeader,
    /// The API has not answered (or not recently enough): no view, no removal.
    NoWorkload,
    /// No member of an ordinal >= spec.replicas whose pod is gone.
    Nothing,
    /// Removing this voter would leave fewer voters than `floor`.
    AtFloor {
        ordinal: u32,
        voters: usize,
        floor: u32,
    },
    /// These voters (by ID) did not answer: nothing is removed while one is silent (the
    /// voters of scaled-away ordinals whose pods are gone are not waited for). Empty when
    /// they were not asked yet.
    VotersSilent { ordinal: u32, silent: Vec<u64> },
    /// After the removal, fewer voters would answer than the remaining voters' quorum.
    NoQuorumAfter {
        ordinal: u32,
        remaining: usize,
        answering: usize,
    },
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hold::NotLeader => f.write_str("this member does not lead"),
            Hold::NoWorkload => f.write_str("no recent answer from the Kubernetes API"),
            Hold::Nothing => f.write_str("every member has a pod or an ordinal below spec.replicas"),
            Hold::AtFloor { ordinal, voters, floor } => write!(
                f,
                "removing ordinal {ordinal} would leave {} voters, fewer than min(initial size, spec.replicas) = {floor}",
                voters.saturating_sub(1)
            ),
            Hold::NoQuorumAfter {
                ordinal,
                remaining,
                answering,
            } => write!(
                f,
                "removing ordinal {ordinal} would leave {remaining} voters of which {answering} answer: fewer than their quorum"
            ),
            Hold::VotersSilent { ordinal, silent } => write!(
                f,
                "ordinal {ordinal} waits: voter(s) {} did not answer",
                silent
                    .iter()
                    .map(|id| format!("{id:x}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// Members of scaled-away ordinals whose pods are gone: the removal candidates, and the
/// voters whose silence is expected.
fn doomed<'a>(
    identity: &Identity,
    state: &WorkloadState,
    members: &'a [MemberInfo],
) -> Vec<(&'a MemberInfo, u32)> {
    members
        .iter()
        .filter_map(|m| identity.ordinal_of_peer_urls(&m.peer_urls).map(|o| (m, o)))
        .filter(|(_, o)| *o >= state.replicas && !state.pods.contains(o))
        .collect()
}

/// Pure: the one member to remove now, or why none. `initial` is `--replicas` (the initial
/// size); a workload view older than `max_age` counts as none.
pub fn decide(
    identity: &Identity,
    initial: u32,
    max_age: Duration,
    seen: &Observation,
) -> Result<Removal, Hold> {
    let leader = match &seen.local.status {
        Ok(s) if s.leader != 0 && s.leader == s.member_id && !s.is_learner => s.member_id,
        _ => return Err(Hold::NotLeader),
    };
    let state = match &seen.scale_in.workload {
        Some(w) if seen.now.saturating_duration_since(w.at) <= max_age => &w.state,
        _ => return Err(Hold::NoWorkload),
    };
    // `replicas: 0` stops the whole set (maintenance); it does not shrink the cluster.
    if state.replicas == 0 {
        return Err(Hold::Nothing);
    }
    let members = seen.members.as_deref().ok_or(Hold::Nothing)?;
    let doomed = doomed(identity, state, members);
    let (member, ordinal) = doomed
        .iter()
        .filter(|(m, _)| m.id != leader)
        .max_by_key(|(_, o)| *o)
        .copied()
        .ok_or(Hold::Nothing)?;
    let voters: Vec<u64> = members
        .iter()
        .filter(|m| !m.is_learner)
        .map(|m| m.id)
        .collect();
    if !member.is_learner {
        let floor = initial.min(state.replicas);
        if voters.len().saturating_sub(1) < floor as usize {
            return Err(Hold::AtFloor {
                ordinal,
                voters: voters.len(),
                floor,
            });
        }
    }
    let Some(answering) = seen.scale_in.voters_answering.as_ref() else {
        return Err(Hold::VotersSilent {
            ordinal,
            silent: Vec::new(),
        });
    };
    let is_doomed = |id: &u64| doomed.iter().any(|(m, _)| m.id == *id);
    let silent: Vec<u64> = voters
        .iter()
        .filter(|id| **id != leader && !is_doomed(id) && !answering.contains(id))
        .copied()
        .collect();
    if !silent.is_empty() {
        return Err(Hold::VotersSilent { ordinal, silent });
    }
    // The voters that remain must keep their quorum with those that answer.
    let remaining: Vec<&u64> = voters.iter().filter(|id| **id != member.id).collect();
    let up = remaining
        .iter()
        .filter(|id| ***id == leader || answering.contains(id))
        .count();
    let quorum = remaining.len() / 2 + 1;
    if up < quorum {
        return Err(Hold::NoQuorumAfter {
            ordinal,
            remaining: remaining.len(),
            answering: up,
        });
    }
    Ok(Removal {
        id: member.id,
        ordinal,
    })
}

/// How old the API's answer may be: three intervals.
pub fn max_age(interval: Duration) -> Duration {
    interval * 3
}

/// The voters to probe: when a removal waits only on their answers and they were not
/// asked this tick.
pub fn voters_to_ask(
    identity: &Identity,
    initial: u32,
    interval: Duration,
    seen: &Observation,
) -> Option<Vec<u64>> {
    if seen.scale_in.voters_answering.is_some() {
        return None;
    }
    match decide(identity, initial, max_age(interval), seen) {
        Err(Hold::VotersSilent { .. }) => {
            let leader = seen.local.status.as_ref().map(|s| s.leader).unwrap_or(0);
            let members = seen.members.as_deref().unwrap_or_default();
            let gone: Vec<u64> = match &seen.scale_in.workload {
                Some(w) => doomed(identity, &w.state, members)
                    .iter()
                    .map(|(m, _)| m.id)
                    .collect(),
                None => Vec::new(),
            };
            Some(
                members
                    .iter()
                    .filter(|m| !m.is_learner && m.id != leader && !gone.contains(&m.id))
                    .map(|m| m.id)
                    .collect(),
            )
        }
        _ => None,
    }
}

/// Removes members of scaled-away ordinals while this pod's member leads; counts them.
#[derive(Debug)]
pub struct ScaleIn {
    identity: Identity,
    initial: u32,
    max_age: Duration,
    removals: Counter,
    /// With `--backup-url`: the snapshot each removal waits for, and the wait last logged.
    guard: Option<(SnapshotGuard<Removal>, Option<Waiting>)>,
}

impl ScaleIn {
    /// `interval` is how often the API is asked; a view three intervals old is stale.
    pub fn new(
        identity: Identity,
        initial: u32,
        interval: Duration,
        registry: &mut Registry,
    ) -> Self {
        let removals = Counter::default();
        registry.register(
            "etcd_steward_scale_in_removals",
            "Members of scaled-away ordinals this sidecar removed as leader",
            removals.clone(),
        );
        ScaleIn {
            identity,
            initial,
            max_age: max_age(interval),
            removals,
            guard: None,
        }
    }

    /// With `backups` (`--backup-url`), every removal waits for a fresh snapshot taken after
    /// it was decided.
    pub fn guarded(mut self, backups: bool) -> Self {
        self.guard = backups.then(|| (SnapshotGuard::default(), None));
        self
    }

    /// What [`decide`] says for this observation (the loop asks, to know whether the
    /// voters must be asked too).
    pub fn decide(&self, seen: &Observation) -> Result<Removal, Hold> {
        decide(&self.identity, self.initial, self.max_age, seen)
    }
}

impl Planner for ScaleIn {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        if let Some((guard, _)) = &mut self.guard {
            guard.absorb(&seen.backup_rounds, seen.now);
        }
        let Ok(r) = self.decide(seen) else {
            return Vec::new();
        };
        let remove = vec![Step::RemoveMember {
            id: r.id,
            ordinal: r.ordinal,
        }];
        let Some((guard, said)) = &mut self.guard else {
            return remove;
        };
        match guard.verdict(&r, seen.now, seen.unix) {
            Verdict::Go {
                revision,
                taken_unix,
            } => {
                *said = None;
                tracing::info!(ordinal = r.ordinal, snapshot_revision = revision, snapshot_unix = taken_unix, "scale-in: a snapshot taken after the removal was decided is in the store; removing");
                remove
            }
            Verdict::Ask { request } => vec![Step::SnapshotNow {
                request,
                ordinal: r.ordinal,
            }],
            Verdict::Wait(w) => {
                if !said.as_ref().is_some_and(|s| s.same_as(&w)) {
                    tracing::warn!(ordinal = r.ordinal, member_id = %format!("{:x}", r.id), reason = %w, "scale-in: the member is not removed yet: with --backup-url set, a removal waits for a fresh snapshot");
                    *said = Some(w);
                }
                Vec::new()
            }
        }
    }

    fn learn(&mut self, outcome: &Outcome) {
        if let Outcome::Done(Step::RemoveMember { .. }) = outcome {
            self.removals.inc();
        }
    }

    fn learned(&mut self, outcome: &Outcome, at: tokio::time::Instant) {
        self.learn(outcome);
        let Some((guard, _)) = &mut self.guard else {
            return;
        };
        match outcome {
            Outcome::Done(Step::RemoveMember { .. }) | Outcome::Moot(Step::RemoveMember { .. }) => {
                guard.acted()
            }
            Outcome::Failed(Step::SnapshotNow { request, .. }, error) => {
                guard.not_started(*request, at, error)
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{MemberInfo, MemberStatus};
    use std::collections::BTreeSet;
    use tokio::time::Instant;

    const MAX_AGE: Duration = Duration::from_secs(30);

    fn identity() -> Identity {
        Identity {
            set_name: "etcd".into(),
            ordinal: 0,
            service: "etcd".into(),
            namespace: "default".into(),
            cluster_domain: "cluster.local".into(),
            client_port: 2379,
            peer_port: 2380,
            client_scheme: "http",
            peer_scheme: "http",
        }
    }

    fn member(o: u32, learner: bool) -> MemberInfo {
        let id = identity();
        MemberInfo {
            id: 100 + u64::from(o),
            name: format!("etcd-{o}"),
            peer_urls: vec![id.peer_url(o)],
            client_urls: vec![id.client_url(o)],
            is_learner: learner,
        }
    }

    /// Members 0..n (the first `voters` voters), leader `leader`, API says `replicas` with
    /// `pods`, every other voter answering.
    fn seen(n: u32, leader: u32, replicas: u32, pods: &[u32]) -> Observation {
        let now = Instant::now();
        let members: Vec<MemberInfo> = (0..n).map(|o| member(o, false)).collect();
        Observation {
            scale_in: ScaleInSeen {
                voters_answering: Some(members.iter().map(|m| m.id).collect()),
                workload: Some(WorkloadSeen {
                    at: now,
                    state: WorkloadState {
                        replicas,
                        pods: pods.iter().copied().collect(),
                    },
                }),
            },
            members: Some(members),
            own_peer_url: identity().peer_url(leader),
            ..Observation::serving(
                now,
                MemberStatus {
                    member_id: 100 + u64::from(leader),
                    leader: 100 + u64::from(leader),
                    ..MemberStatus::default()
                },
            )
        }
    }

    fn run(s: &Observation, initial: u32) -> Result<Removal, Hold> {
        decide(&identity(), initial, MAX_AGE, s)
    }

    #[test]
    fn scaled_from_5_to_3_removes_the_highest_gone_ordinal_first() {
        let s = seen(5, 0, 3, &[0, 1, 2]);
        assert_eq!(
            run(&s, 3),
            Ok(Removal {
                id: 104,
                ordinal: 4
            })
        );
        assert_eq!(
            run(&without(s.clone(), &[4]), 3),
            Ok(Removal {
                id: 103,
                ordinal: 3
            })
        );
        assert_eq!(run(&without(s, &[3, 4]), 3), Err(Hold::Nothing));
    }

    #[test]
    fn a_pod_still_present_is_not_removed_its_prestop_leaves() {
        let s = seen(5, 0, 3, &[0, 1, 2, 3, 4]);
        assert_eq!(run(&s, 3), Err(Hold::Nothing));
        let s = seen(5, 0, 3, &[0, 1, 2, 4]);
        assert_eq!(
            run(&s, 3),
            Ok(Removal {
                id: 103,
                ordinal: 3
            })
        );
    }

    #[test]
    fn pods_gone_but_replicas_unchanged_is_a_restart_not_a_scale_in() {
        assert_eq!(run(&seen(5, 0, 5, &[0, 1, 2]), 3), Err(Hold::Nothing));
    }

    #[test]
    fn replicas_zero_stops_the_set_and_removes_nobody() {
        // Pod 0 (the leader) still terminating, the others gone: a stop, not a shrink.
        assert_eq!(run(&seen(5, 0, 0, &[0]), 3), Err(Hold::Nothing));
    }

    #[test]
    fn only_the_leader_removes_and_never_itself() {
        assert_eq!(run(&seen(5, 1, 3, &[0, 1, 2]), 3).map(|r| r.ordinal), Ok(4));
        // The leader is pod 4 itself (its pod still runs this sidecar, but say the API
        // lost it): pod 3 is removed, never the leader.
        assert_eq!(run(&seen(5, 4, 3, &[0, 1, 2]), 3).map(|r| r.ordinal), Ok(3));
        let mut follower = seen(5, 0, 3, &[0, 1, 2]);
        if let Ok(s) = follower.local.status.as_mut() {
            s.member_id = 101;
        }
        assert_eq!(run(&follower, 3), Err(Hold::NotLeader));
    }

    fn without(mut s: Observation, ordinals: &[u32]) -> Observation {
        if let Some(m) = s.members.as_mut() {
            m.retain(|m| !ordinals.iter().any(|o| m.id == 100 + u64::from(*o)));
        }
        s
    }

    #[test]
    fn never_fewer_voters_than_the_initial_size_unless_replicas_says_so() {
        // Initial size 5, spec.replicas 3: the floor is 3.
        let s = seen(5, 0, 3, &[0, 1, 2]);
        assert_eq!(run(&s, 5).map(|r| r.ordinal), Ok(4));
        assert_eq!(run(&without(s.clone(), &[4]), 5).map(|r| r.ordinal), Ok(3));
        assert_eq!(run(&without(s, &[3, 4]), 5), Err(Hold::Nothing));
        // Initial 3, spec.replicas 1: the user asked for one member; the floor is 1.
        let s = seen(3, 0, 1, &[0]);
        assert_eq!(run(&s, 3).map(|r| r.ordinal), Ok(2));
        assert_eq!(run(&without(s, &[2]), 3).map(|r| r.ordinal), Ok(1));
        // Voters 0, 1 and 3 (ordinal 2 was removed by hand), spec.replicas 3, initial 3:
        // ordinal 3 is scaled away and gone, but removing it would leave 2 voters < 3.
        let s = without(seen(4, 0, 3, &[0, 1]), &[2]);
        assert_eq!(
            run(&s, 3),
            Err(Hold::AtFloor {
                ordinal: 3,
                voters: 3,
                floor: 3
            })
        );
    }

    #[test]
    fn a_removal_that_would_leave_the_rest_without_quorum_waits() {
        // spec.replicas 1: ordinals 1..4 are all scaled away and gone. Removing 4 leaves
        // four voters of which only the leader answers.
        let mut s = seen(5, 0, 1, &[0]);
        s.scale_in.voters_answering = Some(BTreeSet::new());
        assert_eq!(
            run(&s, 3),
            Err(Hold::NoQuorumAfter {
                ordinal: 4,
                remaining: 4,
                answering: 1
            })
        );
    }

    #[test]
    fn a_learner_of_a_scaled_away_ordinal_goes_first_and_costs_no_voter() {
        let mut s = without(seen(4, 0, 3, &[0, 1, 2]), &[3]);
        if let Some(m) = s.members.as_mut() {
            m.push(member(3, true));
        }
        assert_eq!(
            run(&s, 3),
            Ok(Removal {
                id: 103,
                ordinal: 3
            })
        );
    }

    #[test]
    fn a_silent_voter_or_a_silent_api_removes_nothing() {
        let mut s = seen(5, 0, 3, &[0, 1, 2]);
        // Ordinals 3 and 4 are scaled away and gone: their silence is expected; 2's is not.
        s.scale_in.voters_answering = Some(BTreeSet::from([101]));
        assert_eq!(
            run(&s, 3),
            Err(Hold::VotersSilent {
                ordinal: 4,
                silent: vec![102]
            })
        );
        s.scale_in.voters_answering = Some(BTreeSet::from([101, 102]));
        assert_eq!(run(&s, 3).map(|r| r.ordinal), Ok(4));
        s.scale_in.voters_answering = None;
        assert!(matches!(run(&s, 3), Err(Hold::VotersSilent { .. })));
        let mut s = seen(5, 0, 3, &[0, 1, 2]);
        s.scale_in.workload = None;
        assert_eq!(run(&s, 3), Err(Hold::NoWorkload));
        let mut stale = seen(5, 0, 3, &[0, 1, 2]);
        stale.now += MAX_AGE + Duration::from_secs(1);
        assert_eq!(run(&stale, 3), Err(Hold::NoWorkload));
    }

    #[test]
    fn only_the_voters_expected_to_answer_are_asked() {
        let mut s = seen(5, 0, 3, &[0, 1, 2]);
        s.scale_in.voters_answering = None;
        assert_eq!(
            voters_to_ask(&identity(), 3, MAX_AGE / 3, &s),
            Some(vec![101, 102])
        );
        s.scale_in.voters_answering = Some(BTreeSet::new());
        assert_eq!(voters_to_ask(&identity(), 3, MAX_AGE / 3, &s), None);
    }

    #[test]
    fn the_planner_intends_one_removal_and_counts_it() {
        let mut registry = Registry::default();
        let mut p = ScaleIn::new(identity(), 3, Duration::from_secs(10), &mut registry);
        let steps = p.plan(&seen(5, 0, 3, &[0, 1, 2]));
        assert_eq!(
            steps,
            vec![Step::RemoveMember {
                id: 104,
                ordinal: 4
            }]
        );
        p.learn(&Outcome::Done(steps[0].clone()));
        assert_eq!(p.removals.get(), 1);
    }

    #[test]
    fn with_backups_a_removal_comes_only_after_a_snapshot_asked_once_it_was_decided() {
        use super::super::observation::RoundEnd;
        let mut registry = Registry::default();
        let mut p =
            ScaleIn::new(identity(), 3, Duration::from_secs(10), &mut registry).guarded(true);
        let mut s = seen(5, 0, 3, &[0, 1, 2]);
        s.unix = 1_700_000_000;
        let ask = p.plan(&s);
        assert_eq!(
            ask,
            vec![Step::SnapshotNow {
                request: 1,
                ordinal: 4
            }]
        );
        p.learned(&Outcome::Done(ask[0].clone()), s.now);
        // The store does not answer: nothing is removed, tick after tick.
        s.backup_rounds = vec![RoundEnd::Requested {
            request: 1,
            taken: Err("store unreachable".into()),
        }];
        assert_eq!(p.plan(&s), vec![]);
        s.backup_rounds.clear();
        s.now += Duration::from_secs(1);
        assert_eq!(p.plan(&s), vec![]);
        // Asked again; this time it is taken: the removal follows.
        s.now += super::super::snapshot_guard::RETRY_AFTER;
        s.unix += 16;
        assert_eq!(
            p.plan(&s),
            vec![Step::SnapshotNow {
                request: 2,
                ordinal: 4
            }]
        );
        s.backup_rounds = vec![RoundEnd::Requested {
            request: 2,
            taken: Ok((s.unix, 99)),
        }];
        assert_eq!(
            p.plan(&s),
            vec![Step::RemoveMember {
                id: 104,
                ordinal: 4
            }]
        );
    }
}
