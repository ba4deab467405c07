//! The replay's pure parts: what to do with each archived revision ([`step`]), the
//! transaction it becomes ([`txn_ops`]) and its guards ([`guards`]), the leases it needs
//! first ([`leases_to_grant`]), and why a replay stopped early ([`EarlyStop`]).

use std::collections::{BTreeMap, HashSet};

use etcd_client::{Compare, CompareOp, PutOptions, TxnOp};

use super::pipeline::Proofs;
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
    /// An archived revision cannot be what the revisions before it lead to (it deletes a
    /// key they do not hold).
    Unreplayable { revision: i64, why: String },
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
            EarlyStop::Unreplayable { why, .. } => {
                write!(f, "{why}: the replay ends before it")
            }
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

/// A key `rev` leaves written at its own revision (its last op on the key is a put): the
/// guard, for the revision after it, that `rev` was applied.
pub fn applied_key(rev: &Revision) -> Option<&[u8]> {
    rev.ops
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, op)| match op {
            Op::Put { key, .. } if !touched(&rev.ops[i + 1..], key) => Some(key.as_slice()),
            _ => None,
        })
}

fn touched(ops: &[Op], key: &[u8]) -> bool {
    ops.iter().any(|op| match op {
        Op::Put { key: k, .. } | Op::Delete { key: k } => k == key,
    })
}

/// The compares of `rev`'s transaction, and what they prove ([`Proofs`]):
/// - *after*: `pred` (a key the previous revision left written, [`applied_key`]) is at
///   the previous revision: the previous revision was applied (a later one would have
///   needed this one first);
/// - *once*: a key `rev` leaves written is below `rev`'s revision, or else a key it
///   deletes first (the archive says it existed) is present and below it: `rev` was not
///   applied yet (once applied, the first is at `rev` or above, the second absent or
///   written again above).
///
/// Together: the transaction applies only right after its predecessor and only once, so
/// exactly at its revision (the header's revision checks it too).
pub fn guards(pred: Option<&[u8]>, rev: &Revision) -> (Vec<Compare>, Proofs) {
    let r = rev.revision;
    let mut compares = Vec::with_capacity(3);
    if let Some(key) = pred {
        compares.push(Compare::mod_revision(key, CompareOp::Equal, r - 1));
    }
    let once = if let Some(key) = applied_key(rev) {
        compares.push(Compare::mod_revision(key, CompareOp::Less, r));
        true
    } else if let Some(key) = first_deleted(rev) {
        compares.push(Compare::mod_revision(key, CompareOp::Greater, 0));
        compares.push(Compare::mod_revision(key, CompareOp::Less, r));
        true
    } else {
        false
    };
    let proofs = Proofs {
        after: pred.is_some(),
        once,
    };
    (compares, proofs)
}

/// A key whose first op in `rev` is a delete.
fn first_deleted(rev: &Revision) -> Option<&[u8]> {
    rev.ops.iter().enumerate().find_map(|(i, op)| match op {
        Op::Delete { key } if !touched(&rev.ops[..i], key) => Some(key.as_slice()),
        _ => None,
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

    fn del(key: &str) -> Op {
        Op::Delete {
            key: key.as_bytes().to_vec(),
        }
    }

    #[test]
    fn the_guards_prove_the_predecessor_applied_and_this_revision_not_yet_with_a_key_left_written()
    {
        let r = rev(12, 0, vec![put("a", 0), del("b"), put("c", 0), del("a")]);
        // "a" is deleted after its put: "c" is the key revision 12 leaves written.
        assert_eq!(applied_key(&r), Some(&b"c"[..]));
        let (compares, proofs) = guards(Some(b"p"), &r);
        assert_eq!(
            proofs,
            Proofs {
                after: true,
                once: true
            }
        );
        let text = format!("{compares:?}");
        assert_eq!(compares.len(), 2, "{text}");
        assert!(
            text.contains("key: [112]") && text.contains("ModRevision(11)"),
            "{text}"
        );
        assert!(
            text.contains("key: [99]") && text.contains("ModRevision(12)"),
            "{text}"
        );
        assert!(
            text.contains("result: Equal") && text.contains("result: Less"),
            "{text}"
        );
        // The first revision after the snapshot has no predecessor's key.
        let (compares, proofs) = guards(None, &r);
        assert_eq!((compares.len(), proofs.after), (1, false));
    }

    #[test]
    fn a_revision_of_deletes_only_is_guarded_by_its_first_deleted_key_being_present_and_older() {
        let r = rev(20, 0, vec![del("x"), del("y")]);
        assert_eq!(applied_key(&r), None);
        let (compares, proofs) = guards(None, &r);
        assert!(proofs.once);
        let text = format!("{compares:?}");
        assert_eq!(compares.len(), 2, "{text}");
        assert!(
            text.contains("key: [120]") && !text.contains("key: [121]"),
            "{text}"
        );
        assert!(
            text.contains("result: Greater") && text.contains("ModRevision(0)"),
            "{text}"
        );
        assert!(
            text.contains("result: Less") && text.contains("ModRevision(20)"),
            "{text}"
        );
        // A key put and then deleted in one revision proves nothing either way.
        let r = rev(21, 0, vec![put("z", 0), del("z")]);
        let (compares, proofs) = guards(Some(b"p"), &r);
        assert_eq!((compares.len(), proofs.once), (1, false));
    }
}
