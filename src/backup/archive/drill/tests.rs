//! The archive drill's unit tests.
#![cfg(test)]
use std::path::PathBuf;
use std::time::Duration;

use std::collections::{BTreeMap, BTreeSet};

use super::super::chain::tests::seg;
use super::super::leases::Held;
use super::*;

/// The chain of segments `spans` after a snapshot at 10, cluster `a`.
fn chain_of(spans: &[(i64, i64)]) -> Chain {
    let all: Vec<_> = spans.iter().map(|(f, l)| seg("a", *f, *l)).collect();
    chain::chain(10, "a", &all)
}

fn replayed(c: &Chain, last: i64, stopped: Option<EarlyStop>) -> Replayed {
    Replayed {
        file: PathBuf::new(),
        snapshot: "s".into(),
        snapshot_revision: 10,
        segments: c.segments.iter().map(|m| m.name.clone()).collect(),
        revisions: u64::try_from(last - 10).unwrap(),
        last_revision: last,
        last_time_unix_ms: None,
        stopped,
        applying: Duration::ZERO,
        sealing: Duration::ZERO,
        resent: 0,
        overtaken: 0,
        method: crate::backup::archive::replay::Method::File,
        history: crate::backup::archive::replay::History::Full,
    }
}

fn hash(hash: u32, compact_revision: i64) -> KvHash {
    KvHash {
        hash,
        compact_revision,
    }
}

/// Live at R: keys a and b on lease 7 (TTL 30).
fn live_leases() -> LeaseView {
    LeaseView {
        at: 30,
        served: 30,
        attached: BTreeMap::from([(7, keys(&["a", "b"]))]),
        held: BTreeMap::from([(
            7,
            Held {
                granted_ttl: 30,
                keys: None,
            },
        )]),
    }
}

fn keys(k: &[&str]) -> BTreeSet<Vec<u8>> {
    k.iter().map(|k| k.as_bytes().to_vec()).collect()
}

/// The throw-away etcd at R, holding lease 7 with `ttl` and its keys.
fn replayed_leases(ttl: i64) -> LeaseView {
    LeaseView {
        at: 30,
        served: 30,
        attached: BTreeMap::from([(7, keys(&["a", "b"]))]),
        held: BTreeMap::from([(
            7,
            Held {
                granted_ttl: ttl,
                keys: Some(keys(&["a", "b"])),
            },
        )]),
    }
}

fn at(hash: Result<KvHash, String>) -> AtRevision {
    AtRevision {
        hash,
        leases: Ok(replayed_leases(30)),
    }
}

fn judged(
    c: &Chain,
    live: Result<KvHash, SourceError>,
    r: &Replayed,
    scratch: Option<Result<KvHash, String>>,
) -> ArchiveDrill {
    let scratch = scratch.map(at);
    // Asked at the same revision: compacted away for both, or for neither.
    let leases = match &live {
        Err(e) => Err(e.clone()),
        Ok(_) => Ok(live_leases()),
    };
    judge(&Facts {
        chain: c,
        resumed_after_hole: false,
        live: &live,
        live_leases: &leases,
        replay: Some(Ok(r)),
        scratch: scratch.as_ref(),
    })
}

#[test]
fn an_archive_replayed_to_the_live_hash_at_its_last_revision_passes() {
    let c = chain_of(&[(11, 20), (21, 30)]);
    let r = replayed(&c, 30, None);
    let d = judged(&c, Ok(hash(7, 0)), &r, Some(Ok(hash(7, 0))));
    assert!(d.passed, "{d:?}");
    assert_eq!(
        d.check,
        ArchiveCheck::Match {
            revision: 30,
            hash: 7
        }
    );
    assert_eq!(
        (d.last_revision, d.revisions, d.segments.len()),
        (30, 20, 2)
    );
    assert!(
        d.detail.contains("matches the live cluster's"),
        "{}",
        d.detail
    );
}

#[test]
fn a_different_hash_fails_naming_the_revision_and_segments() {
    let c = chain_of(&[(11, 30)]);
    let r = replayed(&c, 30, None);
    let d = judged(&c, Ok(hash(7, 5)), &r, Some(Ok(hash(8, 5))));
    assert!(!d.passed);
    assert_eq!(d.check.word(), "mismatch");
    assert!(d.detail.contains("HashKV at revision 30"), "{}", d.detail);
    assert!(d.detail.contains(&c.segments[0].name), "{}", d.detail);
}

#[test]
fn a_live_cluster_compacted_past_the_archives_end_skips_the_hash_and_passes() {
    let c = chain_of(&[(11, 30)]);
    let r = replayed(&c, 30, None);
    let compacted = Err(SourceError::Compacted {
        endpoint: "e".into(),
        revision: 30,
    });
    let d = judged(&c, compacted, &r, None);
    assert!(d.passed, "{d:?}");
    assert_eq!(d.check.word(), "skipped");
    assert!(
        d.detail.contains("compacted away on the live cluster"),
        "{}",
        d.detail
    );
}

#[test]
fn hashes_from_different_compacted_revisions_are_not_compared() {
    let c = chain_of(&[(11, 30)]);
    let r = replayed(&c, 30, None);
    let d = judged(&c, Ok(hash(7, 25)), &r, Some(Ok(hash(8, 12))));
    assert!(d.passed);
    assert_eq!(d.check.word(), "skipped");
}

#[test]
fn a_segment_failing_its_checksum_fails_the_drill_naming_it() {
    let c = chain_of(&[(11, 20), (21, 30)]);
    let bad = c.segments[1].name.clone();
    let r = replayed(
        &c,
        20,
        Some(EarlyStop::BadSegment {
            name: bad.clone(),
            error: "fails its checksum".into(),
        }),
    );
    let d = judged(&c, Ok(hash(7, 0)), &r, None);
    assert!(!d.passed);
    assert_eq!(d.check, ArchiveCheck::NotRun);
    assert_eq!(d.last_revision, 20);
    assert!(d.detail.contains(&bad), "{}", d.detail);
}

#[test]
fn a_hole_fails_the_drill_unless_a_later_snapshot_restarted_the_archive() {
    let c = chain_of(&[(11, 20), (25, 30)]);
    let r = replayed(&c, 20, None);
    let d = judged(&c, Ok(hash(7, 0)), &r, Some(Ok(hash(7, 0))));
    assert!(!d.passed);
    assert_eq!(
        d.check.word(),
        "match",
        "the continuous part still compares"
    );
    assert!(d.detail.contains("revisions 21..24"), "{}", d.detail);
    let live = Ok(hash(7, 0));
    let scratch = at(Ok(hash(7, 0)));
    let resumed = judge(&Facts {
        chain: &c,
        resumed_after_hole: true,
        live: &live,
        live_leases: &Ok(live_leases()),
        replay: Some(Ok(&r)),
        scratch: Some(&scratch),
    });
    assert!(resumed.passed, "{resumed:?}");
}

#[test]
fn nothing_after_the_snapshot_is_nothing_to_drill() {
    let c = chain_of(&[]);
    let live = Err(SourceError::Other {
        endpoint: String::new(),
        detail: "not asked".into(),
    });
    let d = judge(&Facts {
        chain: &c,
        resumed_after_hole: false,
        live: &live,
        live_leases: &Err(SourceError::Other {
            endpoint: String::new(),
            detail: "not asked".into(),
        }),
        replay: None,
        scratch: None,
    });
    assert!(d.passed);
    assert_eq!(d.check.word(), "none");
}

#[test]
fn a_replay_that_fails_fails_the_drill_with_its_error() {
    let c = chain_of(&[(11, 30)]);
    let e = ReplayError::Apply {
        revision: 17,
        detail: "no answer".into(),
    };
    let live = Ok(hash(7, 0));
    let d = judge(&Facts {
        chain: &c,
        resumed_after_hole: false,
        live: &live,
        live_leases: &Ok(live_leases()),
        replay: Some(Err(&e)),
        scratch: None,
    });
    assert!(!d.passed);
    assert!(d.detail.contains("revision 17"), "{}", d.detail);
}

#[test]
fn a_replay_whose_leases_differ_from_the_live_ones_fails_the_drill_naming_the_lease() {
    let c = chain_of(&[(11, 30)]);
    let r = replayed(&c, 30, None);
    let judged_with = |leases: Result<LeaseView, String>| {
        let scratch = AtRevision {
            hash: Ok(hash(7, 0)),
            leases,
        };
        judge(&Facts {
            chain: &c,
            resumed_after_hole: false,
            live: &Ok(hash(7, 0)),
            live_leases: &Ok(live_leases()),
            replay: Some(Ok(&r)),
            scratch: Some(&scratch),
        })
    };
    let d = judged_with(Ok(replayed_leases(30)));
    assert!(d.passed, "{d:?}");
    assert_eq!(d.leases, LeaseCheck::Match { leases: 1 });
    // The hash matches, the lease was granted another TTL.
    let d = judged_with(Ok(replayed_leases(60)));
    assert!(!d.passed, "{d:?}");
    assert_eq!(d.check.word(), "match");
    assert_eq!(d.leases.word(), "mismatch");
    assert!(
        d.detail
            .contains("lease 7 is granted 60 s in the replayed etcd, 30 s on the live"),
        "{}",
        d.detail
    );
    // The lease is gone.
    let d = judged_with(Ok(LeaseView {
        held: BTreeMap::new(),
        ..replayed_leases(30)
    }));
    assert!(!d.passed);
    assert!(d.detail.contains("lease 7 (2 keys"), "{}", d.detail);
    // A lease expired in the throw-away etcd while it was read: not R's leases any more.
    let d = judged_with(Ok(LeaseView {
        served: 31,
        held: BTreeMap::new(),
        ..replayed_leases(30)
    }));
    assert!(d.passed, "{d:?}");
    assert_eq!(d.leases.word(), "skipped");
    // The throw-away etcd did not answer.
    let d = judged_with(Err("lease list: no answer".into()));
    assert!(!d.passed);
    assert_eq!(d.leases.word(), "failed");
}

#[test]
fn a_live_cluster_compacted_past_the_archive_skips_the_leases_too() {
    let c = chain_of(&[(11, 30)]);
    let r = replayed(&c, 30, None);
    let compacted = || SourceError::Compacted {
        endpoint: "e".into(),
        revision: 30,
    };
    let d = judge(&Facts {
        chain: &c,
        resumed_after_hole: false,
        live: &Err(compacted()),
        live_leases: &Err(compacted()),
        replay: Some(Ok(&r)),
        scratch: None,
    });
    assert!(d.passed, "{d:?}");
    assert_eq!(d.leases.word(), "skipped");
    assert!(d.detail.contains("leases not compared"), "{}", d.detail);
}
