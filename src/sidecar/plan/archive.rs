//! The continuous archive's schedule, by the leader's sidecar only (issue 26): while this
//! member leads and `--archive-interval` is set, one archive round every interval, never
//! two at a time. Where a round continues from is the executor's to find (its own memory
//! of the last archived revision, or the store's segments and snapshots), so a change of
//! leader leaves no gap: the first round of each term reads the store (`from_store`).
//!
//! The first round of a term waits for this leader's first backup round to store its
//! snapshot: on a new cluster that round takes the first snapshot, which the archive then
//! continues, instead of both rounds taking one at once. Not for the round's drills (a
//! throw-away etcd, minutes on a large database): a new leader's archive would fall that
//! far behind, and every volume lost meanwhile would lose those writes.

use std::time::Duration;

use tokio::time::Instant;

use super::{Observation, Outcome, Planner, Step};

/// Plans archive rounds while this member leads.
#[derive(Debug)]
pub struct Archive {
    every: Duration,
    in_flight: bool,
    last_start: Option<Instant>,
    /// A backup round stored its snapshot (or ended) since this member leads.
    backup_ended: bool,
    /// The next round is the first of this term: it reads the store.
    from_store: bool,
}

impl Archive {
    /// For a segment every `interval`.
    pub fn new(interval: Duration) -> Self {
        Archive {
            every: interval,
            in_flight: false,
            last_start: None,
            backup_ended: false,
            from_store: true,
        }
    }

    /// Whether a round runs now (started and not reported yet).
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }
}

impl Planner for Archive {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        if !seen.archive_rounds.is_empty() {
            self.in_flight = false;
        }
        let leads = seen
            .local
            .status
            .as_ref()
            .is_ok_and(|s| s.leader != 0 && s.leader == s.member_id && !s.is_learner);
        if !leads {
            // Another member may archive meanwhile: the next term starts from the store.
            self.backup_ended = false;
            self.from_store = true;
            return Vec::new();
        }
        self.backup_ended |= !seen.backup_rounds.is_empty();
        let recent = self
            .last_start
            .is_some_and(|t| seen.now.duration_since(t) < self.every);
        if !self.backup_ended || self.in_flight || recent {
            return Vec::new();
        }
        self.last_start = Some(seen.now);
        let from_store = std::mem::replace(&mut self.from_store, false);
        vec![Step::ArchiveRound { from_store }]
    }

    fn learn(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Done(Step::ArchiveRound { .. }) => self.in_flight = true,
            // Not even started: the next round reads the store again.
            Outcome::Failed(Step::ArchiveRound { .. }, _) => self.from_store = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::observation::{ArchiveEnd, RoundEnd};
    use super::*;
    use crate::facts::MemberStatus;

    const ME: u64 = 0xa0;
    const EVERY: Duration = Duration::from_secs(5);

    fn seen(at: Instant, leader: u64) -> Observation {
        Observation::serving(
            at,
            MemberStatus {
                member_id: ME,
                cluster_id: 9,
                leader,
                raft_index: 10,
                raft_term: 2,
                ..Default::default()
            },
        )
    }

    fn backup_ended(mut o: Observation) -> Observation {
        o.backup_rounds = vec![RoundEnd::Ran {
            newest_verified: Some((1, 5)),
            take_error: None,
        }];
        o
    }

    fn archive_ended(mut o: Observation) -> Observation {
        o.archive_rounds = vec![ArchiveEnd::Archived { last_revision: 9 }];
        o
    }

    /// Plans and tells the planner its steps were started, as the loop does.
    fn run(p: &mut Archive, o: &Observation) -> Vec<Step> {
        let steps = p.plan(o);
        for s in &steps {
            p.learn(&Outcome::Done(s.clone()));
        }
        steps
    }

    #[test]
    fn the_leader_archives_every_interval_after_its_first_backup_round_one_round_at_a_time() {
        let t0 = Instant::now();
        let mut p = Archive::new(EVERY);
        assert!(
            run(&mut p, &seen(t0, ME)).is_empty(),
            "waits for a backup round"
        );
        let first = run(&mut p, &backup_ended(seen(t0, ME)));
        assert_eq!(first, vec![Step::ArchiveRound { from_store: true }]);
        assert!(p.in_flight());
        // Due again, but the round still runs: nothing.
        assert!(run(&mut p, &seen(t0 + EVERY * 2, ME)).is_empty());
        // It ended: the next comes at once (it is overdue), continuing from memory.
        let next = run(&mut p, &archive_ended(seen(t0 + EVERY * 2, ME)));
        assert_eq!(next, vec![Step::ArchiveRound { from_store: false }]);
        let ended = archive_ended(seen(t0 + EVERY * 2 + Duration::from_secs(1), ME));
        assert!(run(&mut p, &ended).is_empty(), "not before one interval");
        assert_eq!(
            run(&mut p, &seen(t0 + EVERY * 3, ME)),
            vec![Step::ArchiveRound { from_store: false }]
        );
    }

    #[test]
    fn a_follower_never_archives_and_a_new_term_reads_the_store_again() {
        let t0 = Instant::now();
        let mut p = Archive::new(EVERY);
        assert!(run(&mut p, &backup_ended(seen(t0, 0xb0))).is_empty());
        assert!(run(&mut p, &backup_ended(seen(t0, 0))).is_empty());
        assert_eq!(
            run(&mut p, &backup_ended(seen(t0, ME))),
            vec![Step::ArchiveRound { from_store: true }]
        );
        let t1 = t0 + EVERY;
        assert_eq!(
            run(&mut p, &archive_ended(seen(t1, ME))),
            vec![Step::ArchiveRound { from_store: false }]
        );
        // Leadership lost, then won back: the first round of the new term reads the store,
        // after this term's first backup round.
        let t2 = t1 + EVERY;
        assert!(run(&mut p, &archive_ended(seen(t2, 0xb0))).is_empty());
        assert!(run(&mut p, &seen(t2 + EVERY, ME)).is_empty());
        assert_eq!(
            run(&mut p, &backup_ended(seen(t2 + EVERY, ME))),
            vec![Step::ArchiveRound { from_store: true }]
        );
    }

    #[test]
    fn a_new_leader_archives_once_its_backup_round_stored_its_snapshot_not_after_the_drills() {
        use super::super::backup::Backup;
        let t0 = Instant::now();
        let (mut backup, mut archive) =
            (Backup::new(Duration::from_secs(1800)), Archive::new(EVERY));
        let leads = seen(t0, ME);
        let rounds = backup.plan(&leads);
        assert_eq!(rounds, vec![Step::BackupRound]);
        backup.learn(&Outcome::Done(Step::BackupRound));
        assert!(
            run(&mut archive, &leads).is_empty(),
            "waits for the snapshot step"
        );
        // The round's snapshot step is done; its drills run on (the round is still in flight).
        let mut stored = seen(t0 + Duration::from_secs(1), ME);
        stored.backup_rounds = vec![RoundEnd::Stored {
            newest_verified: Some((1, 5)),
        }];
        assert!(backup.plan(&stored).is_empty(), "the round still drills");
        assert!(backup.in_flight());
        assert_eq!(
            run(&mut archive, &stored),
            vec![Step::ArchiveRound { from_store: true }]
        );
    }

    #[test]
    fn a_round_that_could_not_start_is_followed_by_one_that_reads_the_store() {
        let t0 = Instant::now();
        let mut p = Archive::new(EVERY);
        let steps = p.plan(&backup_ended(seen(t0, ME)));
        p.learn(&Outcome::Failed(steps[0].clone(), "no store".into()));
        assert!(!p.in_flight());
        assert_eq!(
            run(&mut p, &seen(t0 + EVERY, ME)),
            vec![Step::ArchiveRound { from_store: true }]
        );
    }
}
