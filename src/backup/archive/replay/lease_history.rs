//! What the archive says of the leases a replay writes into a restore point's file, and
//! the file's leases compared with it (pure): the seal's lease check. The archive's
//! segments name, for every put, the lease its key is attached to, and carry the granted
//! TTL of each of those leases; the file must hold exactly the snapshot's `lease` bucket
//! plus each lease a replayed put names (at its archived TTL, [`DEFAULT_LEASE_TTL`] when
//! the archiver could not learn it), and each replayed put's `KeyValue` must name the
//! lease the archive says. A lease the file lacks would leave its keys living forever
//! after the restore (etcd attaches no key to a lease it does not hold).
//!
//! What is recorded here comes from the segments as the replay's first pass reads them,
//! not from what the writer did: the check proves the writer, it does not repeat it.

use std::collections::{BTreeMap, HashMap};

use super::plan::DEFAULT_LEASE_TTL;
use crate::backup::archive::segment::{Op, Revision};

/// The leases the replayed revisions name, as the archive says them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseHistory {
    /// Each lease a replayed put names: the first revision naming it, and the TTL the
    /// segment holding that revision recorded (or [`DEFAULT_LEASE_TTL`]).
    named: BTreeMap<i64, (i64, i64)>,
    /// Each replayed put on a lease: (revision, change) → the lease.
    attached: HashMap<(i64, i64), i64>,
}

/// How a restore point's leases differ from what the archive says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseMismatch {
    /// A lease the file should hold is not in its `lease` bucket (`named`: the revision
    /// whose put names it; None: the snapshot holds it).
    Missing {
        lease: i64,
        ttl: i64,
        named: Option<i64>,
    },
    /// A lease is held with another granted TTL.
    Ttl {
        lease: i64,
        file: i64,
        archive: i64,
        named: Option<i64>,
    },
    /// The file holds a lease neither the snapshot nor the archive names.
    Extra { lease: i64, ttl: i64 },
    /// A lease bucket entry whose key is not its lease's ID.
    Misfiled { key: Vec<u8>, lease: i64 },
    /// A replayed put's `KeyValue` names another lease than the archive's.
    Attached {
        revision: i64,
        sub: i64,
        file: i64,
        archive: i64,
    },
}

impl std::fmt::Display for LeaseMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from = |named: &Option<i64>| match named {
            Some(r) => format!("named by archived revision {r}"),
            None => "held by the snapshot".to_string(),
        };
        match self {
            LeaseMismatch::Missing { lease, ttl, named } => write!(
                f,
                "lease {lease:x} ({}, TTL {ttl} s) is not in the written file's lease bucket: its keys would never expire",
                from(named)
            ),
            LeaseMismatch::Ttl {
                lease,
                file,
                archive,
                named,
            } => write!(
                f,
                "lease {lease:x} ({}) has a granted TTL of {file} s in the written file, {archive} s in the archive",
                from(named)
            ),
            LeaseMismatch::Extra { lease, ttl } => write!(
                f,
                "the written file holds lease {lease:x} (TTL {ttl} s), which neither the snapshot nor the archive names"
            ),
            LeaseMismatch::Misfiled { key, lease } => write!(
                f,
                "the written file's lease bucket holds lease {lease:x} under key {key:?}"
            ),
            LeaseMismatch::Attached {
                revision,
                sub,
                file,
                archive,
            } => {
                let name = |l: &i64| match l {
                    0 => "no lease".to_string(),
                    l => format!("lease {l:x}"),
                };
                write!(
                    f,
                    "the put at revision {revision} (change {sub}) is attached to {} in the written file, to {} in the archive",
                    name(file),
                    name(archive)
                )
            }
        }
    }
}

impl LeaseHistory {
    /// Records the leases replayed revision `rev` names; `recorded` is the lease table of
    /// the segment holding it.
    pub fn record(&mut self, rev: &Revision, recorded: &BTreeMap<i64, i64>) {
        for (sub, op) in rev.ops.iter().enumerate() {
            let Op::Put { lease, .. } = op else { continue };
            if *lease == 0 {
                continue;
            }
            self.attached.insert((rev.revision, sub as i64), *lease);
            self.named.entry(*lease).or_insert_with(|| {
                let ttl = recorded
                    .get(lease)
                    .copied()
                    .filter(|t| *t > 0)
                    .unwrap_or(DEFAULT_LEASE_TTL);
                (rev.revision, ttl)
            });
        }
    }

    /// The lease the archive says the put at revision `main`, change `sub`, is attached
    /// to (0: none, or no such put).
    pub fn lease_of(&self, main: i64, sub: i64) -> i64 {
        self.attached.get(&(main, sub)).copied().unwrap_or(0)
    }

    /// Compares the written file's `lease` bucket (`file`: key → (ID, granted TTL)) with
    /// the snapshot's (`snapshot`: ID → TTL) and the leases the revisions up to `upto`
    /// name. The first difference, in lease order.
    pub fn compare_bucket(
        &self,
        snapshot: &BTreeMap<i64, i64>,
        file: &BTreeMap<Vec<u8>, (i64, i64)>,
        upto: i64,
    ) -> Result<(), LeaseMismatch> {
        let mut held: BTreeMap<i64, i64> = BTreeMap::new();
        for (key, (id, ttl)) in file {
            if key.as_slice() != id.to_be_bytes() {
                return Err(LeaseMismatch::Misfiled {
                    key: key.clone(),
                    lease: *id,
                });
            }
            held.insert(*id, *ttl);
        }
        let mut expected: BTreeMap<i64, (i64, Option<i64>)> = snapshot
            .iter()
            .map(|(id, ttl)| (*id, (*ttl, None)))
            .collect();
        for (id, (revision, ttl)) in &self.named {
            if *revision <= upto {
                expected.entry(*id).or_insert((*ttl, Some(*revision)));
            }
        }
        for (lease, (ttl, named)) in &expected {
            match held.get(lease) {
                None => {
                    return Err(LeaseMismatch::Missing {
                        lease: *lease,
                        ttl: *ttl,
                        named: *named,
                    })
                }
                Some(file) if file != ttl => {
                    return Err(LeaseMismatch::Ttl {
                        lease: *lease,
                        file: *file,
                        archive: *ttl,
                        named: *named,
                    })
                }
                Some(_) => {}
            }
        }
        match held.iter().find(|(id, _)| !expected.contains_key(id)) {
            Some((lease, ttl)) => Err(LeaseMismatch::Extra {
                lease: *lease,
                ttl: *ttl,
            }),
            None => Ok(()),
        }
    }

    /// Compares the lease of the written file's entry at revision `main`, change `sub`
    /// (a replayed one) with the archive's.
    pub fn compare_attached(&self, main: i64, sub: i64, file: i64) -> Result<(), LeaseMismatch> {
        let archive = self.lease_of(main, sub);
        if file == archive {
            Ok(())
        } else {
            Err(LeaseMismatch::Attached {
                revision: main,
                sub,
                file,
                archive,
            })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn put(key: &str, lease: i64) -> Op {
        Op::Put {
            key: key.into(),
            value: b"v".to_vec(),
            lease,
        }
    }

    fn rev(revision: i64, ops: Vec<Op>) -> Revision {
        Revision {
            revision,
            time_unix_ms: 0,
            ops,
        }
    }

    /// Revisions 11 (a on lease 7, b on none) and 12 (c on lease 8, whose TTL the archiver
    /// could not learn), from two segments.
    fn history() -> LeaseHistory {
        let mut h = LeaseHistory::default();
        h.record(
            &rev(11, vec![put("a", 7), put("b", 0)]),
            &BTreeMap::from([(7, 30)]),
        );
        h.record(&rev(12, vec![put("c", 8)]), &BTreeMap::from([(8, -1)]));
        h
    }

    fn bucket(leases: &[(i64, i64)]) -> BTreeMap<Vec<u8>, (i64, i64)> {
        leases
            .iter()
            .map(|(id, ttl)| (id.to_be_bytes().to_vec(), (*id, *ttl)))
            .collect()
    }

    #[test]
    fn a_file_holding_the_snapshots_leases_and_every_archived_one_at_its_ttl_passes() {
        let snapshot = BTreeMap::from([(3, 90)]);
        let file = bucket(&[(3, 90), (7, 30), (8, DEFAULT_LEASE_TTL)]);
        assert_eq!(history().compare_bucket(&snapshot, &file, 12), Ok(()));
        // Replayed only up to 11: lease 8 is not named yet.
        let file = bucket(&[(3, 90), (7, 30)]);
        assert_eq!(history().compare_bucket(&snapshot, &file, 11), Ok(()));
    }

    #[test]
    fn a_replay_that_dropped_an_archived_lease_fails_naming_it_and_its_revision() {
        let snapshot = BTreeMap::from([(3, 90)]);
        let file = bucket(&[(3, 90), (8, DEFAULT_LEASE_TTL)]);
        let m = history().compare_bucket(&snapshot, &file, 12).unwrap_err();
        assert_eq!(
            m,
            LeaseMismatch::Missing {
                lease: 7,
                ttl: 30,
                named: Some(11)
            }
        );
        let said = m.to_string();
        assert!(
            said.contains("lease 7 ") && said.contains("revision 11"),
            "{said}"
        );
        // The snapshot's own lease dropped.
        let file = bucket(&[(7, 30), (8, DEFAULT_LEASE_TTL)]);
        let m = history().compare_bucket(&snapshot, &file, 12).unwrap_err();
        assert!(
            matches!(
                m,
                LeaseMismatch::Missing {
                    lease: 3,
                    named: None,
                    ..
                }
            ),
            "{m:?}"
        );
    }

    #[test]
    fn a_replay_that_granted_a_wrong_ttl_fails_naming_the_lease_and_both_ttls() {
        let file = bucket(&[(7, 60), (8, DEFAULT_LEASE_TTL)]);
        let m = history()
            .compare_bucket(&BTreeMap::new(), &file, 12)
            .unwrap_err();
        assert_eq!(
            m,
            LeaseMismatch::Ttl {
                lease: 7,
                file: 60,
                archive: 30,
                named: Some(11)
            }
        );
        assert!(m
            .to_string()
            .contains("60 s in the written file, 30 s in the archive"));
    }

    #[test]
    fn a_lease_no_one_named_or_one_filed_under_another_id_fails() {
        let file = bucket(&[(7, 30), (8, DEFAULT_LEASE_TTL), (9, 5)]);
        let m = history()
            .compare_bucket(&BTreeMap::new(), &file, 12)
            .unwrap_err();
        assert_eq!(m, LeaseMismatch::Extra { lease: 9, ttl: 5 });
        let mut file = bucket(&[(7, 30), (8, DEFAULT_LEASE_TTL)]);
        file.insert(10i64.to_be_bytes().to_vec(), (11, 5));
        let m = history()
            .compare_bucket(&BTreeMap::new(), &file, 12)
            .unwrap_err();
        assert!(
            matches!(m, LeaseMismatch::Misfiled { lease: 11, .. }),
            "{m:?}"
        );
    }

    #[test]
    fn a_replayed_put_attached_to_another_lease_than_the_archives_fails_naming_its_revision() {
        let h = history();
        assert_eq!(h.compare_attached(11, 0, 7), Ok(()));
        assert_eq!(h.compare_attached(11, 1, 0), Ok(()));
        let m = h.compare_attached(11, 0, 0).unwrap_err();
        assert!(
            m.to_string().contains(
                "revision 11 (change 0) is attached to no lease in the written file, to lease 7"
            ),
            "{m}"
        );
        assert!(h.compare_attached(11, 1, 7).is_err(), "b has no lease");
    }
}
