//! The replay's pure parts: what to do with each archived revision ([`step`]), the
//! transaction it becomes ([`txn_ops`]), the leases it needs first ([`leases_to_grant`]),
//! and why a replay stopped early ([`EarlyStop`]).

use std::collections::{BTreeMap, HashSet};

use etcd_client::{PutOptions, TxnOp};

use crate::backup::archive::segment::{Op, Revision};

/// The TTL (seconds) a lease gets when the archiver could not learn its own (it was gone
/// when asked): long enough that its keys outlive the restore's start, short enough that
/// they go soon after if no one keeps the lease alive.
pub const DEFAULT_LEASE_TTL: i64 = 60;

/// How far the replay goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Every revision the segments hold.
    End,
    /// Up to and including this revision.
    Revision(i64),
    /// Up to the last revision received at or before this time (Unix milliseconds).
    Time { unix_ms: u64 },
}

/// Why a replay stopped before its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EarlyStop {
    /// A segment failed its checksum, decryption or decoding: nothing from it is applied.
    BadSegment { name: String, error: String },
    /// The next archived revision is not the next revision of the scratch etcd.
    Hole { after: i64, next: i64 },
    /// A replayed revision came out as another revision in the scratch etcd.
    Mismatch { archived: i64, served: i64 },
    /// The segments end before the target revision.
    ArchiveEnds { last: i64, target: i64 },
}

impl std::fmt::Display for EarlyStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EarlyStop::BadSegment { name, error } => write!(
                f,
                "archive segment {name} is not usable ({error}): the replay ends before it"
            ),
            EarlyStop::Hole { after, next } => write!(
                f,
                "revisions {}..{} are not in the archive (the next archived revision is {next})",
                after + 1,
                next - 1
            ),
            EarlyStop::Mismatch { archived, served } => write!(
                f,
                "archived revision {archived} became revision {served} in the scratch etcd: the replay ends before it"
            ),
            EarlyStop::ArchiveEnds { last, target } => write!(
                f,
                "the archive ends at revision {last}, before the target revision {target}"
            ),
        }
    }
}

/// What to do with one archived revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Already in the scratch etcd (the snapshot or an overlapping segment holds it).
    Skip,
    Apply,
    /// The target is reached: this revision is beyond it.
    Done,
    /// Stop before it, and why.
    Stop(EarlyStop),
}

/// What to do with archived revision `rev` while the scratch etcd is at `current`.
pub fn step(current: i64, rev: &Revision, target: Target) -> Step {
    if rev.revision <= current {
        return Step::Skip;
    }
    match target {
        Target::Revision(n) if rev.revision > n => return Step::Done,
        Target::Time { unix_ms } if rev.time_unix_ms > unix_ms => return Step::Done,
        _ => {}
    }
    if rev.revision != current + 1 {
        return Step::Stop(EarlyStop::Hole {
            after: current,
            next: rev.revision,
        });
    }
    Step::Apply
}

/// The transaction replaying `rev`: its puts (with their lease) and deletes, in order.
pub fn txn_ops(rev: &Revision) -> Vec<TxnOp> {
    rev.ops
        .iter()
        .map(|op| match op {
            Op::Put { key, value, lease } => {
                let options = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
                TxnOp::put(key.clone(), value.clone(), options)
            }
            Op::Delete { key } => TxnOp::delete(key.clone(), None),
        })
        .collect()
}

/// The leases `rev`'s puts name that `known` does not hold yet, each with the TTL to grant
/// it: the recorded one, or [`DEFAULT_LEASE_TTL`] when it is unknown (-1) or not recorded.
pub fn leases_to_grant(
    rev: &Revision,
    recorded: &BTreeMap<i64, i64>,
    known: &HashSet<i64>,
) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = Vec::new();
    for op in &rev.ops {
        if let Op::Put { lease, .. } = op {
            if *lease != 0 && !known.contains(lease) && !out.iter().any(|(id, _)| id == lease) {
                let ttl = recorded
                    .get(lease)
                    .copied()
                    .filter(|t| *t > 0)
                    .unwrap_or(DEFAULT_LEASE_TTL);
                out.push((*lease, ttl));
            }
        }
    }
    out
}

/// A key `rev` puts (the guard of the revision after it).
pub fn put_key(rev: &Revision) -> Option<Vec<u8>> {
    rev.ops.iter().find_map(|op| match op {
        Op::Put { key, .. } => Some(key.clone()),
        Op::Delete { .. } => None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rev(revision: i64, time_unix_ms: u64, ops: Vec<Op>) -> Revision {
        Revision {
            revision,
            time_unix_ms,
            ops,
        }
    }

    fn put(key: &str, lease: i64) -> Op {
        Op::Put {
            key: key.into(),
            value: b"v".to_vec(),
            lease,
        }
    }

    #[test]
    fn revisions_at_or_below_the_scratch_revision_are_skipped_and_the_next_one_applied() {
        let r = rev(11, 0, vec![put("a", 0)]);
        assert_eq!(step(11, &r, Target::End), Step::Skip);
        assert_eq!(step(12, &r, Target::End), Step::Skip);
        assert_eq!(step(10, &r, Target::End), Step::Apply);
    }

    #[test]
    fn a_revision_after_a_hole_stops_the_replay_and_says_which_revisions_are_missing() {
        let r = rev(15, 0, vec![put("a", 0)]);
        let Step::Stop(why) = step(10, &r, Target::End) else {
            panic!("not a stop")
        };
        assert_eq!(
            why,
            EarlyStop::Hole {
                after: 10,
                next: 15
            }
        );
        assert!(why.to_string().contains("revisions 11..14"), "{why}");
    }

    #[test]
    fn the_target_ends_the_replay_at_its_revision_or_at_the_last_revision_not_after_its_time() {
        let r = rev(11, 5_000, vec![put("a", 0)]);
        assert_eq!(step(10, &r, Target::Revision(11)), Step::Apply);
        assert_eq!(step(10, &r, Target::Revision(10)), Step::Done);
        assert_eq!(step(10, &r, Target::Time { unix_ms: 5_000 }), Step::Apply);
        assert_eq!(step(10, &r, Target::Time { unix_ms: 4_999 }), Step::Done);
    }

    #[test]
    fn a_revisions_puts_and_deletes_become_one_transaction_in_order() {
        let r = rev(
            3,
            0,
            vec![put("a", 7), Op::Delete { key: b"b".to_vec() }, put("c", 0)],
        );
        let ops = txn_ops(&r);
        assert_eq!(ops.len(), 3);
        let text = format!("{ops:?}");
        let (a, b, c) = (
            text.find("RequestPut").unwrap(),
            text.find("RequestDeleteRange").unwrap(),
            text.rfind("RequestPut").unwrap(),
        );
        assert!(a < b && b < c, "{text}");
        assert!(text.contains("lease: 7"), "{text}");
    }

    #[test]
    fn each_new_lease_is_granted_once_with_its_recorded_ttl_or_the_default() {
        let r = rev(
            3,
            0,
            vec![
                put("a", 7),
                put("b", 7),
                put("c", 8),
                put("d", 9),
                put("e", 0),
            ],
        );
        let recorded = BTreeMap::from([(7, 15), (8, -1)]);
        let known = HashSet::from([9]);
        assert_eq!(
            leases_to_grant(&r, &recorded, &known),
            vec![(7, 15), (8, DEFAULT_LEASE_TTL)]
        );
    }
}
