//! Restore points and which one a new cluster starts from ([`snapshot_choice`]): a snapshot
//! by its name, `<snapshot>+r<revision>` (the archive replayed onto it up to that revision)
//! or `<snapshot>+t<unix_ms>` (replayed up to the last revision archived at or before that
//! moment). Every pod reads the same store, so every pod names the same point; the replay
//! from a point's name is the same on every pod.

use std::time::{Duration, UNIX_EPOCH};

use crate::facts::{BackupFacts, Failed, PointAt, Rejection, RestoreWanted, SnapshotFacts};

use super::types::{Unusable, Why};

/// A restore point, `<snapshot>+r<revision>`: the snapshot with the archive replayed to it.
pub fn restore_point(snapshot: &str, revision: i64) -> String {
    format!("{snapshot}+r{revision}")
}

/// A restore point, `<snapshot>+t<unix_ms>`: the snapshot with the archive replayed up to
/// the last revision received at or before that moment (Unix milliseconds).
pub fn time_point(snapshot: &str, unix_ms: u64) -> String {
    format!("{snapshot}+t{unix_ms}")
}

/// A restore point's snapshot and how far the archive is replayed onto it; a plain
/// snapshot name has no point.
pub fn parse_restore_point(name: &str) -> (&str, Option<PointAt>) {
    if let Some((snapshot, r)) = name.rsplit_once("+r") {
        if let (false, Ok(r)) = (snapshot.is_empty(), r.parse::<i64>()) {
            return (snapshot, Some(PointAt::Revision(r)));
        }
    }
    if let Some((snapshot, t)) = name.rsplit_once("+t") {
        if let (false, Ok(t)) = (snapshot.is_empty(), t.parse::<u64>()) {
            return (snapshot, Some(PointAt::Time { unix_ms: t }));
        }
    }
    (name, None)
}

/// An instant as RFC 3339 with milliseconds (UTC).
fn rfc3339(unix_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

/// When snapshot `s` was taken, Unix milliseconds.
fn taken_ms(s: &SnapshotFacts) -> u64 {
    s.time_unix.saturating_mul(1000)
}

/// The last revision `s` restores to, with the archive continuing it.
fn reach(s: &SnapshotFacts) -> i64 {
    s.archive
        .as_ref()
        .map_or(s.revision, |a| a.last_revision.max(s.revision))
}

/// The last moment (Unix ms) `s` restores to: when the archive received its last revision
/// continuing `s`, or when `s` was taken.
fn reach_ms(s: &SnapshotFacts) -> u64 {
    match &s.archive {
        Some(a) if a.last_revision > s.revision => a.last_time_unix_ms.max(taken_ms(s)),
        _ => taken_ms(s),
    }
}

/// Whether point `at` lies inside what snapshot `s` and its archive restore.
fn reaches(s: &SnapshotFacts, at: PointAt) -> bool {
    match at {
        PointAt::Revision(n) => s.revision <= n && n <= reach(s),
        PointAt::Time { unix_ms } => taken_ms(s) <= unix_ms && unix_ms <= reach_ms(s),
    }
}

/// The restorable range of `usable` (newest first), in revisions or in time as `at` is.
fn range(usable: &[&SnapshotFacts], at: PointAt) -> String {
    let Some(oldest) = usable.last() else {
        return "no usable snapshot".into();
    };
    match at {
        PointAt::Revision(_) => format!(
            "revision {} (snapshot {}) to revision {}",
            oldest.revision,
            oldest.name,
            usable
                .iter()
                .map(|s| reach(s))
                .max()
                .unwrap_or(oldest.revision)
        ),
        PointAt::Time { .. } => format!(
            "{} (snapshot {}) to {}",
            rfc3339(taken_ms(oldest)),
            oldest.name,
            rfc3339(usable.iter().map(|s| reach_ms(s)).max().unwrap_or(0))
        ),
    }
}

/// The point that restores `at` from `s`: the snapshot itself when it is exactly there.
fn point_name(s: &SnapshotFacts, at: PointAt) -> String {
    match at {
        PointAt::Revision(n) if n == s.revision => s.name.clone(),
        PointAt::Revision(n) => restore_point(&s.name, n),
        PointAt::Time { unix_ms } => time_point(&s.name, unix_ms),
    }
}

/// How `--restore revision:N` / `time:T` is said in a refusal.
fn moment_name(at: PointAt) -> String {
    match at {
        PointAt::Revision(n) => format!("revision:{n}"),
        PointAt::Time { unix_ms } => format!("time:{}", rfc3339(unix_ms)),
    }
}

/// Which backup a new cluster starts from, from what the store holds and what this volume rejected: also how a
/// sidecar checks an operator's restore request before it stops anything.
pub fn snapshot_choice(
    backups: &BackupFacts,
    rejected: &[Rejection],
) -> Result<Option<String>, Why> {
    let problem = |s: &SnapshotFacts, keys: &[String]| {
        if !s.verified {
            Some(Unusable::NotVerified)
        } else if s.drill_failed {
            Some(Unusable::DrillFailed)
        } else {
            rejected
                .iter()
                .filter(|r| r.name == s.name)
                .find_map(|r| rejection_holds(r, s, keys))
        }
    };
    match backups {
        BackupFacts::Off => Ok(None),
        BackupFacts::NotAsked => Err(Why::BackupStoreUnreachable {
            error: "not asked yet".into(),
        }),
        BackupFacts::Unreachable { error } => Err(Why::BackupStoreUnreachable {
            error: error.clone(),
        }),
        BackupFacts::Listed {
            wanted: RestoreWanted::Latest,
            snapshots,
            keys,
        } => {
            if snapshots.is_empty() {
                return Ok(None);
            }
            if let Some(usable) = snapshots.iter().find(|s| problem(s, keys).is_none()) {
                // With segments continuing it, the point at the archive's end: every
                // revision archived after the snapshot is replayed onto it.
                return Ok(Some(match &usable.archive {
                    Some(a) if a.last_revision > usable.revision => {
                        restore_point(&usable.name, a.last_revision)
                    }
                    _ => usable.name.clone(),
                }));
            }
            Err(Why::NoUsableBackup {
                skipped: snapshots
                    .iter()
                    .filter_map(|s| Some((s.name.clone(), problem(s, keys)?)))
                    .collect(),
            })
        }
        BackupFacts::Listed {
            wanted: wanted @ (RestoreWanted::Revision(_) | RestoreWanted::Time(_)),
            snapshots,
            keys,
        } => {
            let at = match wanted {
                RestoreWanted::Revision(n) => PointAt::Revision(*n),
                RestoreWanted::Time(t) => PointAt::Time { unix_ms: *t },
                _ => unreachable!("matched as a revision or a time"),
            };
            let usable: Vec<&SnapshotFacts> = snapshots
                .iter()
                .filter(|s| problem(s, keys).is_none())
                .collect();
            // Newest first: the newest snapshot at or before the moment whose archive
            // reaches it.
            if let Some(s) = usable.iter().find(|s| reaches(s, at)) {
                return Ok(Some(point_name(s, at)));
            }
            Err(Why::NamedBackupUnusable {
                name: moment_name(at),
                problem: Unusable::OutsideRange {
                    range: range(&usable, at),
                },
            })
        }
        BackupFacts::Listed {
            wanted: RestoreWanted::Named(name),
            snapshots,
            keys,
        } => {
            let (base, at) = parse_restore_point(name);
            match snapshots.iter().find(|s| s.name == base) {
                None => Err(Why::NamedBackupUnusable {
                    name: name.clone(),
                    problem: Unusable::NotInStore,
                }),
                Some(s) => match (problem(s, keys), at) {
                    (Some(p), _) => Err(Why::NamedBackupUnusable {
                        name: name.clone(),
                        problem: p,
                    }),
                    (None, Some(at)) if !reaches(s, at) => Err(Why::NamedBackupUnusable {
                        name: name.clone(),
                        problem: Unusable::OutsideRange {
                            range: range(&[s], at),
                        },
                    }),
                    (None, _) => Ok(Some(name.clone())),
                },
            }
        }
    }
}

/// Whether what this pod remembers about snapshot `s` still holds: the same content for
/// bytes that failed, the same content and the same configured keys for a key that did
/// not open it. An entry an older etcd-steward wrote (no content, no keys recorded) holds
/// nothing: the snapshot is tried once more, and if it fails again, the new entry records
/// what it failed on.
fn rejection_holds(r: &Rejection, s: &SnapshotFacts, keys: &[String]) -> Option<Unusable> {
    match &r.failed {
        Failed::Checksum { content, detail } => {
            (*content == s.content).then(|| Unusable::BadBytes {
                detail: detail.clone(),
            })
        }
        Failed::Key {
            content,
            encrypted_to,
            configured,
        } => (*content == s.content && same_set(configured, keys)).then(|| Unusable::NoKey {
            encrypted_to: encrypted_to.clone(),
            configured: keys.to_vec(),
        }),
        Failed::Unrecorded { .. } => None,
    }
}

fn same_set(a: &[String], b: &[String]) -> bool {
    let set = |v: &[String]| v.iter().cloned().collect::<std::collections::BTreeSet<_>>();
    set(a) == set(b)
}
