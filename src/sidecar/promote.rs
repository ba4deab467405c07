//! Pure promotion and stall logic. The sidecar's loop observes, asks these functions
//! what to do, and does it.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::MemberStatus;

/// What this pod's sidecar should do about its own member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A voter: nothing to promote.
    Voter,
    /// A learner that sees no leader: nothing can be done yet.
    NoLeader,
    /// A learner still catching up.
    CatchingUp { index: u64, leader_index: u64 },
    /// A learner close enough to the leader: ask a voter to promote it.
    Promote { id: u64 },
}

/// etcd promotes a learner whose match index is at least 90% of the leader's
/// (`isLearnerReady` in etcdserver); ask at that point and let etcd judge exactly.
pub fn caught_up(index: u64, leader_index: u64) -> bool {
    leader_index > 0 && u128::from(index) * 10 >= u128::from(leader_index) * 9
}

pub fn next_step(status: &MemberStatus, leader_index: Option<u64>) -> Step {
    if !status.is_learner {
        return Step::Voter;
    }
    match leader_index {
        None => Step::NoLeader,
        Some(_) if status.leader == 0 => Step::NoLeader,
        Some(li) if caught_up(status.raft_index, li) => Step::Promote {
            id: status.member_id,
        },
        Some(li) => Step::CatchingUp {
            index: status.raft_index,
            leader_index: li,
        },
    }
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    last_index: Option<u64>,
    last_progress: Instant,
}

/// Tracks the learners the leader sees, to find those that never started or stopped
/// making progress for longer than the stall timeout.
#[derive(Debug, Default)]
pub struct StallTracker {
    seen: BTreeMap<u64, Seen>,
}

impl StallTracker {
    /// Forget everything (this pod is no longer the leader: a new leader times afresh).
    pub fn reset(&mut self) {
        self.seen.clear();
    }

    /// Records one observation of the learners (id, raft index if it answered) and returns
    /// those stalled for at least `timeout`.
    pub fn observe(
        &mut self,
        now: Instant,
        learners: &[(u64, Option<u64>)],
        leader_index: u64,
        timeout: Duration,
    ) -> Vec<u64> {
        self.seen
            .retain(|id, _| learners.iter().any(|(l, _)| l == id));
        let mut stalled = Vec::new();
        for (id, index) in learners {
            let seen = self.seen.entry(*id).or_insert(Seen {
                last_index: None,
                last_progress: now,
            });
            let progressed = match (index, seen.last_index) {
                (Some(i), Some(last)) => *i > last,
                (Some(_), None) => true,
                (None, _) => false,
            };
            let in_sync = index.is_some_and(|i| caught_up(i, leader_index));
            if progressed || in_sync {
                seen.last_progress = now;
            }
            if index.is_some() {
                seen.last_index = *index;
            }
            if now.duration_since(seen.last_progress) >= timeout {
                stalled.push(*id);
            }
        }
        stalled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(is_learner: bool, index: u64) -> MemberStatus {
        MemberStatus {
            member_id: 7,
            cluster_id: 1,
            leader: 3,
            raft_index: index,
            raft_term: 2,
            is_learner,
            errors: vec![],
        }
    }

    #[test]
    fn a_voter_has_nothing_to_promote() {
        assert_eq!(next_step(&status(false, 5), Some(100)), Step::Voter);
    }

    #[test]
    fn a_learner_is_promoted_once_within_ninety_percent_of_the_leader() {
        assert_eq!(
            next_step(&status(true, 89), Some(100)),
            Step::CatchingUp {
                index: 89,
                leader_index: 100
            }
        );
        assert_eq!(
            next_step(&status(true, 90), Some(100)),
            Step::Promote { id: 7 }
        );
        assert_eq!(next_step(&status(true, 90), None), Step::NoLeader);
    }

    #[tokio::test(start_paused = true)]
    async fn a_learner_that_never_starts_is_stalled_after_the_timeout() {
        let mut t = StallTracker::default();
        let timeout = Duration::from_secs(30);
        assert!(t
            .observe(Instant::now(), &[(9, None)], 100, timeout)
            .is_empty());
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(t
            .observe(Instant::now(), &[(9, None)], 100, timeout)
            .is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            t.observe(Instant::now(), &[(9, None)], 100, timeout),
            vec![9]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_learner_making_progress_is_never_stalled() {
        let mut t = StallTracker::default();
        let timeout = Duration::from_secs(10);
        for i in 0..10u64 {
            assert!(t
                .observe(Instant::now(), &[(9, Some(i * 10))], 1_000_000, timeout)
                .is_empty());
            tokio::time::advance(Duration::from_secs(5)).await;
        }
        // Progress stops: stalled one timeout after the last progress.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            t.observe(Instant::now(), &[(9, Some(90))], 1_000_000, timeout),
            vec![9]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_learner_in_sync_but_idle_is_not_stalled() {
        let mut t = StallTracker::default();
        let timeout = Duration::from_secs(10);
        for _ in 0..5 {
            assert!(t
                .observe(Instant::now(), &[(9, Some(100))], 100, timeout)
                .is_empty());
            tokio::time::advance(Duration::from_secs(10)).await;
        }
    }
}
