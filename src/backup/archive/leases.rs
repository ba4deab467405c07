//! The leases a drill compares (pure): what an etcd says of its leases at one revision R,
//! and the throw-away etcd's compared with the live cluster's. `HashKV` covers the keys'
//! `lease` field but not the `lease` bucket, so a replay that lost a lease, or granted it
//! another TTL, would pass the hash while its keys then never expire.
//!
//! Only what R determines is compared: the live cluster has moved on since R (leases
//! granted, revoked, keys attached after it), so its current lease list and the keys its
//! lessor holds now are not R's. What is R's: the keys present at R and the lease each
//! names (a range at R), and each such lease's granted TTL (fixed when it is granted; a
//! lease revoked since R no longer says it, and only its existence and keys in the
//! replay are compared). The throw-away etcd serves exactly R, so its whole lease list and
//! each lease's attached keys (its lessor's, `LeaseTimeToLive` with keys) are R's: every
//! lease a key at R names must be there, with the live TTL and exactly those keys, and no
//! other lease may hold a key. Leases holding no key at R (granted and not used yet, or
//! whose keys were all deleted) are not compared: the archive, made of the keys' changes,
//! does not see them. Not the remaining TTL either: the replay's clocks restart.

use std::collections::{BTreeMap, BTreeSet};

/// One lease as a member holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub granted_ttl: i64,
    /// The keys its lessor attached to it (asked only of the throw-away etcd).
    pub keys: Option<BTreeSet<Vec<u8>>>,
}

/// A member's leases at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// The revision asked about, and the member's own once its leases were read (past
    /// `at` on a throw-away etcd: one of its leases expired, and its leases are no longer
    /// `at`'s).
    pub at: i64,
    pub served: i64,
    /// Each lease a key present at the revision names, and those keys.
    pub attached: BTreeMap<i64, BTreeSet<Vec<u8>>>,
    /// The leases the member holds now (of the live cluster: only those `attached`
    /// names; one revoked since is absent).
    pub held: BTreeMap<i64, Held>,
}

/// How the throw-away etcd's leases differ from the live cluster's at revision R.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDiff {
    /// Keys at R name `lease` on the live cluster; the throw-away etcd does not hold it.
    Missing {
        lease: i64,
        keys: usize,
        key: Vec<u8>,
    },
    Ttl {
        lease: i64,
        live: i64,
        replayed: i64,
    },
    /// The keys attached to `lease` differ (the first key only one side has, and which).
    Keys {
        lease: i64,
        key: Vec<u8>,
        only_live: bool,
    },
}

fn show(k: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(k))
}

impl std::fmt::Display for LeaseDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseDiff::Missing { lease, keys, key } => write!(
                f,
                "lease {lease:x} ({keys} keys at the revision, {} the first) is not held by the replayed etcd: its keys would never expire",
                show(key)
            ),
            LeaseDiff::Ttl {
                lease,
                live,
                replayed,
            } => write!(
                f,
                "lease {lease:x} is granted {replayed} s in the replayed etcd, {live} s on the live cluster"
            ),
            LeaseDiff::Keys {
                lease,
                key,
                only_live: true,
            } => write!(
                f,
                "key {} is attached to lease {lease:x} on the live cluster, not in the replayed etcd",
                show(key)
            ),
            LeaseDiff::Keys { lease, key, .. } => write!(
                f,
                "key {} is attached to lease {lease:x} in the replayed etcd, not on the live cluster",
                show(key)
            ),
        }
    }
}

/// The first key of `a` that `b` lacks.
fn first_missing(a: &BTreeSet<Vec<u8>>, b: &BTreeSet<Vec<u8>>) -> Option<Vec<u8>> {
    a.difference(b).next().cloned()
}

/// Compares the throw-away etcd's leases (`replayed`) with the live cluster's at the same
/// revision, as the module says: the leases compared, or the first difference.
pub fn compare(live: &LeaseView, replayed: &LeaseView) -> Result<usize, LeaseDiff> {
    let none = BTreeSet::new();
    for (lease, keys) in &live.attached {
        let Some(held) = replayed.held.get(lease) else {
            return Err(LeaseDiff::Missing {
                lease: *lease,
                keys: keys.len(),
                key: keys.iter().next().cloned().unwrap_or_default(),
            });
        };
        if let Some(l) = live.held.get(lease) {
            if l.granted_ttl != held.granted_ttl {
                return Err(LeaseDiff::Ttl {
                    lease: *lease,
                    live: l.granted_ttl,
                    replayed: held.granted_ttl,
                });
            }
        }
        let at_r = replayed.attached.get(lease).unwrap_or(&none);
        let lessor = held.keys.as_ref().unwrap_or(at_r);
        for theirs in [at_r, lessor] {
            if let Some(key) = first_missing(keys, theirs) {
                return Err(LeaseDiff::Keys {
                    lease: *lease,
                    key,
                    only_live: true,
                });
            }
            if let Some(key) = first_missing(theirs, keys) {
                return Err(LeaseDiff::Keys {
                    lease: *lease,
                    key,
                    only_live: false,
                });
            }
        }
    }
    let lessors = replayed
        .held
        .iter()
        .filter_map(|(id, h)| h.keys.as_ref().map(|k| (id, k)));
    let named = replayed.attached.iter();
    for (lease, keys) in lessors.chain(named) {
        if live.attached.contains_key(lease) {
            continue;
        }
        if let Some(key) = keys.iter().next() {
            return Err(LeaseDiff::Keys {
                lease: *lease,
                key: key.clone(),
                only_live: false,
            });
        }
    }
    Ok(live.attached.len())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn keys(k: &[&str]) -> BTreeSet<Vec<u8>> {
        k.iter().map(|k| k.as_bytes().to_vec()).collect()
    }

    fn held(ttl: i64, k: Option<&[&str]>) -> Held {
        Held {
            granted_ttl: ttl,
            keys: k.map(keys),
        }
    }

    /// Live at R: a and b on lease 7 (TTL 30), c on lease 8 (revoked since R); lease 9 was
    /// granted after R and holds key d now.
    fn live() -> LeaseView {
        LeaseView {
            at: 30,
            served: 30,
            attached: BTreeMap::from([(7, keys(&["a", "b"])), (8, keys(&["c"]))]),
            held: BTreeMap::from([(7, held(30, None)), (9, held(5, None))]),
        }
    }

    /// The replayed etcd as it should be; it also holds lease 6, whose keys were deleted.
    fn replayed() -> LeaseView {
        LeaseView {
            at: 30,
            served: 30,
            attached: BTreeMap::from([(7, keys(&["a", "b"])), (8, keys(&["c"]))]),
            held: BTreeMap::from([
                (6, held(60, Some(&[]))),
                (7, held(30, Some(&["a", "b"]))),
                (8, held(15, Some(&["c"]))),
            ]),
        }
    }

    #[test]
    fn leases_of_the_keys_at_the_revision_match_whatever_the_live_cluster_did_since() {
        assert_eq!(compare(&live(), &replayed()), Ok(2));
    }

    #[test]
    fn a_replayed_etcd_without_a_lease_fails_naming_it() {
        let mut r = replayed();
        r.held.remove(&7);
        let d = compare(&live(), &r).unwrap_err();
        assert_eq!(
            d,
            LeaseDiff::Missing {
                lease: 7,
                keys: 2,
                key: b"a".to_vec()
            }
        );
        assert!(d.to_string().contains("lease 7 "), "{d}");
    }

    #[test]
    fn a_replayed_lease_granted_another_ttl_fails_naming_both() {
        let mut r = replayed();
        r.held.insert(7, held(60, Some(&["a", "b"])));
        let d = compare(&live(), &r).unwrap_err();
        assert_eq!(
            d,
            LeaseDiff::Ttl {
                lease: 7,
                live: 30,
                replayed: 60
            }
        );
    }

    #[test]
    fn keys_attached_otherwise_in_the_replayed_etcd_fail_naming_the_key() {
        // Its lessor did not attach b (the key names the lease, the lease lost it).
        let mut r = replayed();
        r.held.insert(7, held(30, Some(&["a"])));
        let d = compare(&live(), &r).unwrap_err();
        assert_eq!(
            d,
            LeaseDiff::Keys {
                lease: 7,
                key: b"b".to_vec(),
                only_live: true
            }
        );
        // A lease no key at R names holds a key in the replayed etcd.
        let mut r = replayed();
        r.held.insert(6, held(60, Some(&["z"])));
        let d = compare(&live(), &r).unwrap_err();
        assert!(
            d.to_string()
                .contains("key \"z\" is attached to lease 6 in the replayed etcd"),
            "{d}"
        );
    }
}
