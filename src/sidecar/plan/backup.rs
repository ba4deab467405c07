//! The backup schedule, by the leader's sidecar only: when a backup round (take → prune →
//! drill, `Backups::tick`) is due. Whether a snapshot
//! is actually taken is the store's to say (the round compares its newest snapshot's time
//! with the interval), so a change of leader causes neither a duplicate nor a gap; this
//! planner only decides when to look: while this member leads, one round at a time, and
//! not more often than [`round_every`] (each round lists the store). Never through a
//! member the newest corruption check found diverged: a snapshot carries its data.

use std::time::Duration;

use tokio::time::Instant;

pub use super::observation::RoundEnd;
use super::{Observation, Outcome, Planner, Step};

/// The longest pause between two rounds: a snapshot comes at most this late after it is due.
pub const ROUND_EVERY: Duration = Duration::from_secs(15);

/// How long after a round started the next may start: [`ROUND_EVERY`], or a quarter of a
/// shorter interval (at least a second), so a snapshot is never late by much of one.
pub fn round_every(interval: Duration) -> Duration {
    (interval / 4).clamp(Duration::from_secs(1), ROUND_EVERY)
}

/// Plans backup rounds while this member leads (what they report is exported by the
/// executor's side, `sidecar::execute::backup`).
#[derive(Debug)]
pub struct Backup {
    every: Duration,
    in_flight: bool,
    last_start: Option<Instant>,
}

impl Backup {
    /// For snapshots every `interval`.
    pub fn new(interval: Duration) -> Self {
        Backup {
            every: round_every(interval),
            in_flight: false,
            last_start: None,
        }
    }

    /// Whether a round runs now (started and not reported yet).
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }
}

impl Planner for Backup {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        // A snapshot asked for before a risky act is not a round, and a round whose
        // snapshot step is done still drills.
        if seen
            .backup_rounds
            .iter()
            .any(|r| matches!(r, RoundEnd::Ran { .. } | RoundEnd::Failed { .. }))
        {
            self.in_flight = false;
        }
        let leads = seen
            .local
            .status
            .as_ref()
            .is_ok_and(|s| s.leader != 0 && s.leader == s.member_id && !s.is_learner);
        let recent = self
            .last_start
            .is_some_and(|t| seen.now.duration_since(t) < self.every);
        if !leads || self.in_flight || recent {
            return Vec::new();
        }
        self.last_start = Some(seen.now);
        if seen.diverged {
            tracing::warn!("no backup round: this member's data diverged from the majority's (a snapshot through it would carry the minority's data); it is rebuilt first");
            return Vec::new();
        }
        vec![Step::BackupRound]
    }

    fn learn(&mut self, outcome: &Outcome) {
        if let Outcome::Done(Step::BackupRound) = outcome {
            self.in_flight = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_whose_data_diverged_takes_no_snapshot() {
        use crate::facts::MemberStatus;
        let t0 = Instant::now();
        let leading = |at: Instant, diverged: bool| {
            let mut o = Observation::serving(
                at,
                MemberStatus {
                    member_id: 1,
                    leader: 1,
                    ..Default::default()
                },
            );
            o.diverged = diverged;
            o
        };
        let mut p = Backup::new(Duration::from_secs(60));
        assert!(p.plan(&leading(t0, true)).is_empty());
        assert!(p.plan(&leading(t0 + ROUND_EVERY, true)).is_empty());
        // Rebuilt (or found agreeing): rounds again.
        assert_eq!(
            p.plan(&leading(t0 + ROUND_EVERY * 2, false)),
            vec![Step::BackupRound]
        );
    }

    #[test]
    fn rounds_come_every_15_s_or_a_quarter_of_a_shorter_interval() {
        assert_eq!(round_every(Duration::from_secs(1800)), ROUND_EVERY);
        assert_eq!(round_every(Duration::from_secs(20)), Duration::from_secs(5));
        assert_eq!(round_every(Duration::from_secs(1)), Duration::from_secs(1));
    }
}
