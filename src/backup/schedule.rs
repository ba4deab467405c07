//! When to take a snapshot and when to drill one: pure functions of facts the caller
//! gathers (no I/O, no clock). The schedule comes from the store — the newest snapshot's
//! time — so a change of leader causes neither a duplicate nor a gap longer than one
//! interval. Also the plain values the backup metrics export.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::archive::drill::{ArchiveCheck, ArchiveDrill};
use super::drill::DrillOutcome;
use super::manifest::Manifest;

/// Whether to take a snapshot now, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    Now(TakeWhy),
    Not(SkipWhy),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeWhy {
    /// The store holds no snapshot yet.
    FirstSnapshot,
    /// The newest snapshot is at least one interval old.
    Due { age: Duration },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipWhy {
    /// Only the leader's sidecar takes snapshots.
    NotLeader,
    /// The next one is due in `due_in`.
    NotDue { due_in: Duration },
}

/// The leader takes a snapshot when the store's newest one (of any member, any former
/// leader) is at least `interval` old, or there is none. A newest snapshot dated in the
/// future (a clock step) counts as just taken.
pub fn should_take(
    is_leader: bool,
    newest: Option<SystemTime>,
    now: SystemTime,
    interval: Duration,
) -> Take {
    if !is_leader {
        return Take::Not(SkipWhy::NotLeader);
    }
    let Some(newest) = newest else {
        return Take::Now(TakeWhy::FirstSnapshot);
    };
    let age = now.duration_since(newest).unwrap_or(Duration::ZERO);
    if age >= interval {
        Take::Now(TakeWhy::Due { age })
    } else {
        Take::Not(SkipWhy::NotDue {
            due_in: interval - age,
        })
    }
}

/// The snapshot to drill now, if any: the newest verified snapshot, when it has not been
/// drilled yet. Only the leader drills (it holds the live hash to compare with).
pub fn should_drill(is_leader: bool, manifests: &[Manifest]) -> Option<&Manifest> {
    if !is_leader {
        return None;
    }
    manifests
        .iter()
        .find(|m| m.verified)
        .filter(|m| m.drill.is_none())
}

/// The snapshot whose archive to drill now, if any: with archiving on, the verified
/// snapshot before the newest verified one, once drilled itself and not its archive yet.
/// The newest is drilled as soon as it is taken, before anything continues it; once a
/// newer one exists, the archive continuing the older reaches past it, to the last
/// archived revision: each stretch of the archive is drilled once, one snapshot later.
pub fn should_drill_archive(
    is_leader: bool,
    archiving: bool,
    manifests: &[Manifest],
) -> Option<&Manifest> {
    if !is_leader || !archiving {
        return None;
    }
    manifests
        .iter()
        .filter(|m| m.verified)
        .nth(1)
        .filter(|m| m.drill.as_ref().is_some_and(|d| d.archive.is_none()))
}

/// What the backup metrics export, updated after each attempt. Names (fixed):
/// `etcd_steward_backup_last_success_timestamp_seconds` ← `last_success`,
/// `etcd_steward_backup_last_revision` ← `last_revision`,
/// `etcd_steward_backup_failures_total` ← `failures`,
/// `etcd_steward_backup_duration_seconds` ← `duration`,
/// `etcd_steward_backup_size_bytes` ← `size`,
/// `etcd_steward_backup_verified_revision` ← `verified_revision`,
/// `etcd_steward_backup_drill_last_success_timestamp_seconds` ← `drill_last_success`,
/// `etcd_steward_backup_drill_failures_total` ← `drill_failures` (a failed archive drill
/// counts there too),
/// `etcd_steward_backup_drill_archive_last_revision` ← `drill_archive_last_revision`,
/// `etcd_steward_backup_drill_archive_failures_total` ← `drill_archive_failures`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackupMetrics {
    /// Unix seconds of the last verified snapshot this sidecar took.
    pub last_success: Option<f64>,
    pub last_revision: Option<i64>,
    pub failures: u64,
    /// Seconds the last attempt took.
    pub duration: Option<f64>,
    pub size: Option<u64>,
    /// The revision of the newest snapshot a drill proved restorable.
    pub verified_revision: Option<i64>,
    pub drill_last_success: Option<f64>,
    pub drill_failures: u64,
    /// The last revision a passing archive drill replayed.
    pub drill_archive_last_revision: Option<i64>,
    pub drill_archive_failures: u64,
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl BackupMetrics {
    /// A snapshot was stored; an unverified one counts as a failure.
    pub fn snapshot_taken(&mut self, m: &Manifest, took: Duration, now: SystemTime) {
        self.duration = Some(took.as_secs_f64());
        if m.verified {
            self.last_success = Some(unix(now));
            self.last_revision = Some(m.revision);
            self.size = Some(m.size);
        } else {
            self.failures += 1;
        }
    }

    /// An attempt failed (etcd or the store unreachable, …).
    pub fn snapshot_failed(&mut self, took: Duration) {
        self.duration = Some(took.as_secs_f64());
        self.failures += 1;
    }

    pub fn drilled(&mut self, outcome: &DrillOutcome, now: SystemTime) {
        if outcome.passed {
            self.drill_last_success = Some(unix(now));
            if let Some(r) = outcome.restored_revision {
                self.verified_revision = Some(r);
            }
        } else {
            self.drill_failures += 1;
        }
        if let Some(a) = &outcome.archive {
            // One drill, one failure: the snapshot's already counted.
            self.archive_drilled(a, outcome.passed);
        }
    }

    /// An archive drill ran: a failure counts in the archive drill counter, and in the
    /// drill counter (whose alert covers it) when `count_drill` (the drill it belongs to
    /// has not counted one already).
    pub fn archive_drilled(&mut self, a: &ArchiveDrill, count_drill: bool) {
        if a.passed {
            if a.check != ArchiveCheck::Nothing {
                self.drill_archive_last_revision = Some(a.last_revision);
            }
        } else {
            self.drill_archive_failures += 1;
            if count_drill {
                self.drill_failures += 1;
            }
        }
    }

    /// A drill could not run (the store unreadable).
    pub fn drill_failed(&mut self) {
        self.drill_failures += 1;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn only_the_leader_takes_snapshots() {
        assert_eq!(
            should_take(false, None, at(100), MIN),
            Take::Not(SkipWhy::NotLeader)
        );
    }

    #[test]
    fn an_empty_store_gets_its_first_snapshot_at_once() {
        assert_eq!(
            should_take(true, None, at(100), MIN),
            Take::Now(TakeWhy::FirstSnapshot)
        );
    }

    #[test]
    fn a_snapshot_is_due_one_interval_after_the_newest() {
        assert_eq!(
            should_take(true, Some(at(100)), at(130), MIN),
            Take::Not(SkipWhy::NotDue {
                due_in: Duration::from_secs(30)
            })
        );
        assert_eq!(
            should_take(true, Some(at(100)), at(160), MIN),
            Take::Now(TakeWhy::Due { age: MIN })
        );
    }

    #[test]
    fn a_new_leader_follows_the_old_leaders_schedule_without_duplicate_or_gap() {
        // The old leader took one at 100; leadership moves at 120. The new leader sees the
        // store's newest (100): nothing before 160, one at 160.
        let newest = Some(at(100));
        assert!(matches!(
            should_take(true, newest, at(120), MIN),
            Take::Not(_)
        ));
        assert!(matches!(
            should_take(true, newest, at(160), MIN),
            Take::Now(_)
        ));
    }

    #[test]
    fn a_newest_snapshot_from_the_future_counts_as_just_taken() {
        assert_eq!(
            should_take(true, Some(at(200)), at(100), MIN),
            Take::Not(SkipWhy::NotDue { due_in: MIN })
        );
    }

    fn manifest(name: &str, verified: bool, drilled: bool) -> Manifest {
        Manifest {
            name: name.into(),
            cluster_id: "1".into(),
            member_id: "1".into(),
            revision: 5,
            etcd_version: "3.5.1".into(),
            size: 1,
            sha256: String::new(),
            time: String::new(),
            time_unix: 0,
            verified,
            unverified_reason: None,
            encryption: None,
            compression: None,
            drill: drilled.then(|| crate::backup::manifest::DrillRecord {
                time: String::new(),
                time_unix: 0,
                passed: true,
                restored_revision: Some(5),
                hash_check: "match".into(),
                detail: String::new(),
                archive: None,
            }),
        }
    }

    #[test]
    fn the_newest_verified_snapshot_is_drilled_once() {
        let fresh = [manifest("b", false, false), manifest("a", true, false)];
        assert_eq!(
            should_drill(true, &fresh).map(|m| m.name.as_str()),
            Some("a")
        );
        assert_eq!(should_drill(false, &fresh), None);
        let done = [manifest("a", true, true)];
        assert_eq!(should_drill(true, &done), None);
    }

    #[test]
    fn the_archive_of_the_snapshot_before_the_newest_is_drilled_once_with_archiving_on() {
        let two = [manifest("new", true, true), manifest("old", true, true)];
        let due = should_drill_archive(true, true, &two).map(|m| m.name.as_str());
        assert_eq!(due, Some("old"));
        assert_eq!(should_drill_archive(false, true, &two), None);
        assert_eq!(should_drill_archive(true, false, &two), None);
        let alone = [manifest("new", true, true), manifest("bad", false, true)];
        assert_eq!(should_drill_archive(true, true, &alone), None);
        let mut done = two.clone();
        if let Some(d) = done[1].drill.as_mut() {
            d.archive = Some(crate::backup::manifest::ArchiveDrillRecord {
                time: String::new(),
                time_unix: 0,
                passed: true,
                last_revision: 9,
                segments: 1,
                revisions: 4,
                hash_check: "match".into(),
                detail: String::new(),
            });
        }
        assert_eq!(should_drill_archive(true, true, &done), None);
    }

    #[test]
    fn a_manifest_written_before_the_archive_drill_still_reads() {
        let old = r#"{"time":"t","time_unix":1,"passed":true,"hash_check":"match","detail":"d"}"#;
        let d: crate::backup::manifest::DrillRecord = serde_json::from_str(old).unwrap();
        assert_eq!(d.archive, None);
    }

    #[test]
    fn an_unverified_snapshot_counts_as_a_failure() {
        let mut metrics = BackupMetrics::default();
        metrics.snapshot_taken(&manifest("a", false, false), Duration::from_secs(2), at(10));
        assert_eq!(metrics.failures, 1);
        assert_eq!(metrics.last_success, None);
        metrics.snapshot_taken(&manifest("b", true, false), Duration::from_secs(2), at(20));
        assert_eq!(metrics.last_success, Some(20.0));
        assert_eq!(metrics.last_revision, Some(5));
    }
}
