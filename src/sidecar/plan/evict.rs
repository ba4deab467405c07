//! Removal of stalled learners, by the leader's sidecar only: a learner that never started
//! or stopped progressing for `--learner-stall-timeout` would block the next join (etcd
//! allows one learner at a time). A learner in sync but idle is not stalled.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::promote::caught_up;
use super::{Observation, Outcome, Planner, Step};

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

/// Removes stalled learners while this pod's member leads; counts the removals.
#[derive(Debug)]
pub struct Evict {
    timeout: Duration,
    tracker: StallTracker,
    removed: Counter,
}

impl Evict {
    pub fn new(timeout: Duration, registry: &mut Registry) -> Self {
        let removed = Counter::default();
        registry.register(
            "etcd_steward_learners_removed",
            "Stalled learners this sidecar removed as leader",
            removed.clone(),
        );
        Evict {
            timeout,
            tracker: StallTracker::default(),
            removed,
        }
    }
}

impl Planner for Evict {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        let leads = seen
            .local
            .status
            .as_ref()
            .is_ok_and(|s| s.leader != 0 && s.leader == s.member_id);
        let (Ok(status), true) = (&seen.local.status, leads) else {
            self.tracker.reset();
            return Vec::new();
        };
        self.tracker
            .observe(seen.now, &seen.learners, status.raft_index, self.timeout)
            .into_iter()
            .map(|id| Step::RemoveLearner { id })
            .collect()
    }

    fn learn(&mut self, outcome: &Outcome) {
        if let Outcome::Done(Step::RemoveLearner { .. }) = outcome {
            self.removed.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

#[cfg(test)]
mod planner_tests {
    use super::*;
    use crate::facts::MemberStatus;

    fn seen(now: Instant, leader: u64) -> Observation {
        Observation {
            learners: vec![(7, None)],
            ..Observation::serving(
                now,
                MemberStatus {
                    member_id: 1,
                    cluster_id: 9,
                    leader,
                    raft_index: 100,
                    raft_term: 2,
                    is_learner: false,
                    errors: vec![],
                    ..Default::default()
                },
            )
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_leader_plans_a_removal_and_a_follower_forgets_its_timing() {
        let mut evict = Evict::new(Duration::from_secs(10), &mut Registry::default());
        let start = Instant::now();
        assert!(evict.plan(&seen(start, 1)).is_empty());
        let later = start + Duration::from_secs(10);
        assert!(
            evict.plan(&seen(later, 2)).is_empty(),
            "a follower never removes, even a learner it sees stalled"
        );
        assert!(
            evict.plan(&seen(later, 1)).is_empty(),
            "leading again: timed afresh"
        );
        assert_eq!(
            evict.plan(&seen(later + Duration::from_secs(10), 1)),
            vec![Step::RemoveLearner { id: 7 }]
        );
    }
}
