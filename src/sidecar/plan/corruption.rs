//! The corruption check's schedule (issue 27), by the leader's sidecar only, as backups
//! are: while this member leads and `--corruption-check-interval` is set, one check every
//! interval (the first one interval after it began to lead), never two at a time; and at
//! once while a `CORRUPT` alarm stands and no check has run since it was raised (etcd's own
//! check found a mismatch, or a member started after refusing to for one). The check
//! itself (asking every voter's `HashKV`) runs in the background (`execute::corruption`);
//! its verdict is `facts::hashes::judge`'s.

use std::time::Duration;

use tokio::time::Instant;

use super::{Observation, Outcome, Planner, Step};

/// Plans corruption checks while this member leads.
#[derive(Debug)]
pub struct CorruptionCheck {
    every: Duration,
    in_flight: bool,
    /// When the last check started, or (none yet this term) when this member began to lead.
    last: Option<Instant>,
    /// A check ran (or started) while the `CORRUPT` alarm stood.
    alarm_checked: bool,
}

impl CorruptionCheck {
    /// For a check every `interval`.
    pub fn new(interval: Duration) -> Self {
        CorruptionCheck {
            every: interval,
            in_flight: false,
            last: None,
            alarm_checked: false,
        }
    }
}

impl Planner for CorruptionCheck {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        if !seen.hash_checks.is_empty() {
            self.in_flight = false;
        }
        let Ok(status) = &seen.local.status else {
            return Vec::new();
        };
        let leads = status.leader != 0 && status.leader == status.member_id && !status.is_learner;
        let alarm = status.errors.iter().any(|e| e.contains("CORRUPT"));
        if !alarm {
            self.alarm_checked = false;
        }
        if !leads {
            self.last = None;
            return Vec::new();
        }
        let since = *self.last.get_or_insert(seen.now);
        let due = seen.now.duration_since(since) >= self.every || (alarm && !self.alarm_checked);
        if self.in_flight || !due {
            return Vec::new();
        }
        let voters: Vec<_> = seen
            .members
            .iter()
            .flatten()
            .filter(|m| !m.is_learner)
            .cloned()
            .collect();
        if voters.is_empty() {
            return Vec::new();
        }
        self.last = Some(seen.now);
        self.alarm_checked |= alarm;
        vec![Step::CheckHashes {
            voters,
            checker: status.member_id,
        }]
    }

    fn learn(&mut self, outcome: &Outcome) {
        if let Outcome::Done(Step::CheckHashes { .. }) = outcome {
            self.in_flight = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::hashes::{HashCheck, Verdict};
    use crate::facts::{MemberInfo, MemberStatus};

    const ME: u64 = 0xa0;
    const EVERY: Duration = Duration::from_secs(10);

    fn member(id: u64, is_learner: bool) -> MemberInfo {
        MemberInfo {
            id,
            name: format!("etcd-{id:x}"),
            peer_urls: vec![],
            client_urls: vec![format!("http://m{id:x}:2379")],
            is_learner,
        }
    }

    fn seen(at: Instant, leader: u64, errors: &[&str]) -> Observation {
        let mut o = Observation::serving(
            at,
            MemberStatus {
                member_id: ME,
                cluster_id: 9,
                leader,
                errors: errors.iter().map(|e| e.to_string()).collect(),
                ..Default::default()
            },
        );
        o.members = Some(vec![
            member(ME, false),
            member(0xb0, false),
            member(0xc0, true),
        ]);
        o
    }

    fn ended(mut o: Observation) -> Observation {
        o.hash_checks = vec![HashCheck {
            at: 1,
            checker: ME,
            answers: vec![],
            verdict: Verdict::Undecided {
                revision: 1,
                why: crate::facts::hashes::NoProof::NoVoters,
            },
        }];
        o
    }

    /// Plans and tells the planner its steps were started, as the loop does.
    fn run(p: &mut CorruptionCheck, o: &Observation) -> Vec<Step> {
        let steps = p.plan(o);
        for s in &steps {
            p.learn(&Outcome::Done(s.clone()));
        }
        steps
    }

    #[test]
    fn the_leader_checks_its_voters_every_interval_one_check_at_a_time() {
        let t0 = Instant::now();
        let mut p = CorruptionCheck::new(EVERY);
        assert!(run(&mut p, &seen(t0, ME, &[])).is_empty(), "not at once");
        let steps = run(&mut p, &seen(t0 + EVERY, ME, &[]));
        assert_eq!(
            steps,
            vec![Step::CheckHashes {
                voters: vec![member(ME, false), member(0xb0, false)],
                checker: ME,
            }],
            "voters only, not the learner"
        );
        // Due again, but the check still runs: nothing.
        assert!(run(&mut p, &seen(t0 + EVERY * 3, ME, &[])).is_empty());
        // It ended: the next one at once (overdue), then one interval later.
        assert_eq!(run(&mut p, &ended(seen(t0 + EVERY * 3, ME, &[]))).len(), 1);
        assert!(run(&mut p, &ended(seen(t0 + EVERY * 3 + EVERY / 2, ME, &[]))).is_empty());
        assert_eq!(run(&mut p, &seen(t0 + EVERY * 4, ME, &[])).len(), 1);
    }

    #[test]
    fn a_follower_never_checks() {
        let t0 = Instant::now();
        let mut p = CorruptionCheck::new(EVERY);
        for k in 0..5 {
            assert!(run(
                &mut p,
                &seen(t0 + EVERY * k, 0xb0, &["memberID:b0 alarm:CORRUPT"])
            )
            .is_empty());
            assert!(run(&mut p, &seen(t0 + EVERY * k, 0, &[])).is_empty());
        }
    }

    #[test]
    fn a_standing_corrupt_alarm_is_checked_at_once_and_once() {
        let t0 = Instant::now();
        let mut p = CorruptionCheck::new(EVERY);
        let alarm = ["memberID:b0 alarm:CORRUPT"];
        assert_eq!(run(&mut p, &seen(t0, ME, &alarm)).len(), 1, "at once");
        let t1 = t0 + Duration::from_secs(1);
        assert!(run(&mut p, &ended(seen(t1, ME, &alarm))).is_empty(), "once");
        // Cleared, then raised again: checked at once again.
        assert!(run(&mut p, &seen(t1, ME, &[])).is_empty());
        assert_eq!(run(&mut p, &seen(t1, ME, &alarm)).len(), 1);
    }

    #[test]
    fn a_new_term_waits_one_interval_from_when_it_began() {
        let t0 = Instant::now();
        let mut p = CorruptionCheck::new(EVERY);
        assert!(run(&mut p, &seen(t0, ME, &[])).is_empty());
        assert!(run(&mut p, &seen(t0 + EVERY / 2, 0xb0, &[])).is_empty());
        // Leads again: the interval counts from now.
        assert!(run(&mut p, &seen(t0 + EVERY, ME, &[])).is_empty());
        assert_eq!(run(&mut p, &seen(t0 + EVERY * 2, ME, &[])).len(), 1);
    }
}
