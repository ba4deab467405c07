//! The archive drill: proves the archive that continues a snapshot replays. The chain of
//! segments after the snapshot ([`super::chain`]) is replayed onto it in a throw-away etcd
//! (without the revision jump, [`super::replay::replay_and_hash`]) up to its last archived
//! revision R, and the scratch etcd's `HashKV` at R is compared with the live cluster's,
//! the scratch first compacted to the live cluster's compacted revision (a `HashKV` covers
//! the revisions above it). The live cluster is asked first: when it has compacted R away,
//! the replay still proves every segment reads and applies, and the hash is skipped, with
//! the reason. `HashKV` does not cover the `lease` bucket, so the leases are compared too
//! ([`super::leases`]: the leases the keys at R name, their granted TTLs and attached
//! keys, the live cluster asked at R before the replay): a replay that lost a lease, or
//! granted it another TTL, fails the drill naming the lease. What the answers mean is
//! decided by [`judge`] (pure).

use std::path::Path;
use std::time::SystemTime;

use super::chain::{self, Chain};
use super::leases::{self, LeaseDiff, LeaseView};
use super::replay::{self, AtRevision, EarlyStop, ReplayError, ReplaySetup, Replayed};
use super::SegmentManifest;
use crate::backup::manifest::{self, ArchiveDrillRecord, Manifest};
use crate::backup::snapshot::{KvHash, SnapshotSource, SourceError};
use crate::backup::store::StoreError;

/// How the replayed archive's hash compared with the live cluster's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveCheck {
    /// No segment continues the snapshot: nothing to replay.
    Nothing,
    Match {
        revision: i64,
        hash: u32,
    },
    Mismatch {
        revision: i64,
        replayed: u32,
        live: u32,
    },
    /// Not compared, and why (the live cluster compacted the revision away, …).
    Skipped {
        reason: String,
    },
    /// The replay did not reach the archive's last revision (a bad segment, a hole, a
    /// revision that came out as another): said in the outcome's detail.
    NotRun,
}

impl ArchiveCheck {
    pub fn word(&self) -> &'static str {
        match self {
            ArchiveCheck::Nothing => "none",
            ArchiveCheck::Match { .. } => "match",
            ArchiveCheck::Mismatch { .. } => "mismatch",
            ArchiveCheck::Skipped { .. } => "skipped",
            ArchiveCheck::NotRun => "not_run",
        }
    }
}

/// How the replayed archive's leases compared with the live cluster's at R.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseCheck {
    /// Every lease a key at R names: held, with the live granted TTL and the same keys.
    Match {
        leases: usize,
    },
    Mismatch {
        diff: LeaseDiff,
    },
    /// Not compared, and why (the live cluster compacted R away, …).
    Skipped {
        reason: String,
    },
    /// The throw-away etcd did not say its leases: fails the drill.
    Unread {
        why: String,
    },
    /// The replay did not reach R, or the hash already failed the drill.
    NotRun,
}

impl LeaseCheck {
    pub fn word(&self) -> &'static str {
        match self {
            LeaseCheck::Match { .. } => "match",
            LeaseCheck::Mismatch { .. } => "mismatch",
            LeaseCheck::Skipped { .. } => "skipped",
            LeaseCheck::Unread { .. } => "failed",
            LeaseCheck::NotRun => "not_run",
        }
    }
}

/// One archive drill's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveDrill {
    pub passed: bool,
    /// The snapshot's revision, and the last revision the replay applied.
    pub from_revision: i64,
    pub last_revision: i64,
    /// The archive's last revision (where the hash is compared).
    pub target_revision: i64,
    /// Segments a revision was replayed from, and revisions replayed.
    pub segments: Vec<String>,
    pub revisions: u64,
    pub check: ArchiveCheck,
    pub leases: LeaseCheck,
    /// A sentence: what was proven, or what failed (the segment, the revision, the lease).
    pub detail: String,
}

impl ArchiveDrill {
    pub fn record(&self, now: SystemTime) -> ArchiveDrillRecord {
        let (time, time_unix) = manifest::timestamps(now);
        ArchiveDrillRecord {
            time,
            time_unix,
            passed: self.passed,
            last_revision: self.last_revision,
            segments: self.segments.len() as u64,
            revisions: self.revisions,
            hash_check: self.check.word().to_string(),
            detail: self.detail.clone(),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "passed": self.passed,
            "from_revision": self.from_revision,
            "last_revision": self.last_revision,
            "target_revision": self.target_revision,
            "segments": self.segments.len(),
            "revisions": self.revisions,
            "hash_check": self.check.word(),
            "lease_check": self.leases.word(),
            "detail": self.detail,
        })
    }
}

/// What the archive drill learned, for [`judge`].
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The chain continuing the snapshot (its last revision is R).
    pub chain: &'a Chain,
    /// Whether a later verified snapshot is beyond the chain's end: a hole after it is a
    /// break the archive resumed from (counted in `etcd_steward_archive_breaks_total`),
    /// not a failure of this archive.
    pub resumed_after_hole: bool,
    /// The live cluster's `HashKV` at R (asked before the replay).
    pub live: &'a Result<KvHash, SourceError>,
    /// The live cluster's leases at R (asked before the replay).
    pub live_leases: &'a Result<LeaseView, SourceError>,
    /// The replay (an error other than the store's: the scratch etcd, a transaction);
    /// `None` when no segment continues the snapshot.
    pub replay: Option<Result<&'a Replayed, &'a ReplayError>>,
    /// The scratch etcd's `HashKV` and leases at R, when it reached R.
    pub scratch: Option<&'a AtRevision>,
}

/// What the answers mean (pure): a mismatch, a hole, a segment that fails its checks or a
/// replay that does not reach R fails the drill, naming the segment or the revision, and so
/// do leases that differ, naming the lease; a live cluster that compacted R away, or whose
/// hash or leases are unavailable, skips that comparison.
pub fn judge(f: &Facts<'_>) -> ArchiveDrill {
    let r = f.chain.last_revision;
    let mut out = ArchiveDrill {
        passed: false,
        from_revision: f.chain.from_revision,
        last_revision: f.chain.from_revision,
        target_revision: r,
        segments: Vec::new(),
        revisions: 0,
        check: ArchiveCheck::NotRun,
        leases: LeaseCheck::NotRun,
        detail: String::new(),
    };
    let hole = f
        .chain
        .broken
        .as_ref()
        .map(|why| (why, f.resumed_after_hole));
    let replayed = match f.replay {
        None => {
            out.check = ArchiveCheck::Nothing;
            out.passed = !matches!(hole, Some((_, false)));
            out.detail = match hole {
                None => format!(
                    "no archived revision continues the snapshot (revision {})",
                    f.chain.from_revision
                ),
                Some((why, true)) => format!("no archived revision continues the snapshot; a break the archive resumed from a later snapshot: {why}"),
                Some((why, false)) => format!("the archive has a hole right after the snapshot: {why}"),
            };
            return out;
        }
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            out.detail = format!("the archive replay failed: {e}");
            return out;
        }
    };
    out.last_revision = replayed.last_revision;
    out.segments = replayed.segments.clone();
    out.revisions = replayed.revisions;
    if let Some(stop) = &replayed.stopped {
        out.detail = match stop {
            EarlyStop::BadSegment { name, .. } => format!(
                "{stop}; replayed {} revisions up to revision {} of the archive's {r} (bad segment {name})",
                replayed.revisions, replayed.last_revision
            ),
            _ => format!(
                "{stop}; replayed {} revisions up to revision {} of the archive's {r}",
                replayed.revisions, replayed.last_revision
            ),
        };
        return out;
    }
    let (check, compared) = match (f.live, f.scratch.map(|s| &s.hash)) {
        (Err(SourceError::Compacted { .. }), _) => (
            ArchiveCheck::Skipped {
                reason: format!(
                    "revision {r} is compacted away on the live cluster (it compacted past the archive's end)"
                ),
            },
            true,
        ),
        (Err(e), _) => (
            ArchiveCheck::Skipped {
                reason: format!("the live cluster's HashKV is unavailable: {e}"),
            },
            true,
        ),
        (Ok(_), None) => (ArchiveCheck::NotRun, false),
        (Ok(_), Some(Err(e))) => {
            out.detail = format!("the replay reached revision {r}, but the throw-away etcd: {e}");
            return out;
        }
        (Ok(live), Some(Ok(s))) if live.compact_revision != s.compact_revision => (
            ArchiveCheck::Skipped {
                reason: format!(
                    "the live cluster is compacted to revision {}, the replayed archive to {}",
                    live.compact_revision, s.compact_revision
                ),
            },
            true,
        ),
        (Ok(live), Some(Ok(s))) if live.hash == s.hash => (
            ArchiveCheck::Match {
                revision: r,
                hash: s.hash,
            },
            true,
        ),
        (Ok(live), Some(Ok(s))) => (
            ArchiveCheck::Mismatch {
                revision: r,
                replayed: s.hash,
                live: live.hash,
            },
            false,
        ),
    };
    let span = match (replayed.segments.first(), replayed.segments.last()) {
        (Some(a), Some(b)) if a != b => format!("segments {a} to {b}"),
        (Some(a), _) => format!("segment {a}"),
        _ => "no segment".to_string(),
    };
    let said = match &check {
        ArchiveCheck::Match { hash, .. } => format!(
            "replayed {} revisions ({}) from revision {} to {r}; HashKV {hash:#x} at {r} matches the live cluster's",
            replayed.revisions, span, f.chain.from_revision
        ),
        ArchiveCheck::Mismatch { replayed: h, live, .. } => format!(
            "HashKV at revision {r} after replaying {} revisions ({}): replayed {h:#x}, live {live:#x}",
            replayed.revisions, span
        ),
        ArchiveCheck::Skipped { reason } => format!(
            "replayed {} revisions ({}) from revision {} to {r}; hash not compared: {reason}",
            replayed.revisions, span, f.chain.from_revision
        ),
        ArchiveCheck::NotRun | ArchiveCheck::Nothing => format!(
            "the replay stopped at revision {} before the archive's last, {r}",
            replayed.last_revision
        ),
    };
    out.check = check;
    out.passed = compared;
    out.detail = said;
    if compared {
        out.leases = lease_check(r, f.live_leases, f.scratch.map(|s| &s.leases));
        match &out.leases {
            LeaseCheck::Match { leases } => out.detail.push_str(&format!(
                "; the {leases} leases the keys at {r} name match the live cluster's (IDs, granted TTLs, keys)"
            )),
            LeaseCheck::Mismatch { diff } => {
                out.passed = false;
                out.detail
                    .push_str(&format!("; the leases differ at revision {r}: {diff}"));
            }
            LeaseCheck::Skipped { reason } => {
                out.detail
                    .push_str(&format!("; leases not compared: {reason}"));
            }
            LeaseCheck::Unread { why } => {
                out.passed = false;
                out.detail.push_str(&format!(
                    "; the throw-away etcd's leases at revision {r}: {why}"
                ));
            }
            LeaseCheck::NotRun => {
                out.passed = false;
                out.detail.push_str(&format!(
                    "; the replay reached revision {r}, but the throw-away etcd's leases were not read"
                ));
            }
        }
    }
    if let Some((why, resumed)) = hole {
        if resumed {
            out.detail.push_str(&format!(
                "; then a break the archive resumed from a later snapshot: {why}"
            ));
        } else {
            out.passed = false;
            out.detail
                .push_str(&format!("; the archive has a hole: {why}"));
        }
    }
    out
}

/// The leases compared at R: the live cluster's (asked first) with the throw-away etcd's.
pub fn lease_check(
    r: i64,
    live: &Result<LeaseView, SourceError>,
    scratch: Option<&Result<LeaseView, String>>,
) -> LeaseCheck {
    match (live, scratch) {
        (Err(SourceError::Compacted { .. }), _) => LeaseCheck::Skipped {
            reason: format!("revision {r} is compacted away on the live cluster"),
        },
        (Err(e), _) => LeaseCheck::Skipped {
            reason: format!("the live cluster's leases are unavailable: {e}"),
        },
        (Ok(_), None) => LeaseCheck::NotRun,
        (Ok(_), Some(Err(e))) => LeaseCheck::Unread { why: e.clone() },
        (Ok(_), Some(Ok(s))) if s.served > s.at => LeaseCheck::Skipped {
            reason: format!(
                "the throw-away etcd moved from revision {} to {} while its leases were read (a lease expired): they are not the revision's any more",
                s.at, s.served
            ),
        },
        (Ok(l), Some(Ok(s))) => match leases::compare(l, s) {
            Ok(n) => LeaseCheck::Match { leases: n },
            Err(diff) => LeaseCheck::Mismatch { diff },
        },
    }
}

/// Drills the archive continuing snapshot `m`, whose verified file is `snapshot` (already
/// downloaded), given every segment manifest in the store (`all`) and every snapshot's
/// (`snapshots`, for a break the archive resumed from). An error only when the store
/// cannot be read (try again later).
pub async fn drill<L: SnapshotSource>(
    m: &Manifest,
    snapshot: &Path,
    all: &[SegmentManifest],
    snapshots: &[Manifest],
    store: &crate::backup::store::Store,
    setup: &ReplaySetup,
    live: &L,
) -> Result<ArchiveDrill, StoreError> {
    let c = chain::chain(m.revision, &m.cluster_id, all);
    let resumed_after_hole = snapshots
        .iter()
        .any(|s| s.verified && s.cluster_id == m.cluster_id && s.revision > c.last_revision);
    if c.segments.is_empty() {
        return Ok(judge(&Facts {
            chain: &c,
            resumed_after_hole,
            live: &Err(SourceError::Other {
                endpoint: String::new(),
                detail: "not asked: nothing to compare".into(),
            }),
            live_leases: &Err(SourceError::Other {
                endpoint: String::new(),
                detail: "not asked: nothing to compare".into(),
            }),
            replay: None,
            scratch: None,
        }));
    }
    // Asked first: its compacted revision is where the scratch etcd is compacted to.
    let live_hash = live.hash_kv(c.last_revision).await;
    let compact = live_hash.as_ref().ok().map(|h| h.compact_revision);
    let live_leases = live.leases_at(c.last_revision).await;
    let replayed = replay::replay_and_hash(
        store,
        snapshot,
        &m.name,
        &c.segments,
        c.last_revision,
        compact,
        setup,
    )
    .await;
    let _ = std::fs::remove_dir_all(&setup.work_dir);
    let replayed = match replayed {
        Err(ReplayError::Store(e)) => return Err(e),
        other => other,
    };
    let (replay, scratch) = match &replayed {
        Ok((r, s)) => (Ok(r), s.as_ref()),
        Err(e) => (Err(e), None),
    };
    Ok(judge(&Facts {
        chain: &c,
        resumed_after_hole,
        live: &live_hash,
        live_leases: &live_leases,
        replay: Some(replay),
        scratch,
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
