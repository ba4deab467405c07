//! Which archived segments continue a snapshot, decided from the manifests alone (pure).
//!
//! Replay is by revision, so overlapping segments are harmless (a revision already applied
//! is skipped); a hole is not: the chain ends before it, and says why, so a restore uses
//! what is continuous and never skips revisions in the middle.

use super::SegmentManifest;

/// The segments that continue a snapshot, in order, and how far they reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The revision the chain starts after (the snapshot's).
    pub from_revision: i64,
    /// In replay order: each one's first revision is at most one past the previous last.
    pub segments: Vec<SegmentManifest>,
    /// The last revision the chain reaches (`from_revision` with no segment).
    pub last_revision: i64,
    /// When the archiver received that revision (Unix ms), when a segment holds it.
    pub last_time_unix_ms: Option<u64>,
    /// Why the chain stops before the newest archived revision, when it does.
    pub broken: Option<String>,
}

/// The chain continuing a snapshot of cluster `cluster_id` at `from_revision`, from every
/// segment manifest in the store (any order). Segments of another cluster are ignored;
/// ones wholly at or before the reach so far are skipped; the first that starts after a
/// hole ends the chain.
pub fn chain(from_revision: i64, cluster_id: &str, manifests: &[SegmentManifest]) -> Chain {
    let mut ours: Vec<&SegmentManifest> = manifests
        .iter()
        .filter(|m| m.cluster_id == cluster_id && m.last_revision >= m.first_revision)
        .collect();
    ours.sort_by_key(|m| (m.first_revision, m.last_revision));
    let mut out = Chain {
        from_revision,
        segments: Vec::new(),
        last_revision: from_revision,
        last_time_unix_ms: None,
        broken: None,
    };
    for m in ours {
        if m.last_revision <= out.last_revision {
            continue;
        }
        if m.first_revision > out.last_revision + 1 {
            out.broken = Some(format!(
                "revisions {}..{} are not in the archive (the next segment, {}, starts at {})",
                out.last_revision + 1,
                m.first_revision - 1,
                m.name,
                m.first_revision
            ));
            break;
        }
        out.last_revision = m.last_revision;
        out.last_time_unix_ms = Some(m.last_time_unix_ms);
        out.segments.push(m.clone());
    }
    out
}

/// How far one snapshot restores: its own revision, or further through the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    /// The snapshot's name.
    pub snapshot: String,
    /// The snapshot's revision and time (RFC 3339).
    pub from_revision: i64,
    pub from_time: String,
    /// The last revision a restore from it reaches, and when the archiver received it
    /// (the snapshot's own time when no segment continues it).
    pub to_revision: i64,
    pub to_time: String,
    pub segments: usize,
    /// Why the archive after it stops early, when it does.
    pub broken: Option<String>,
}

impl Reach {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "from_revision": self.from_revision,
            "from_time": self.from_time,
            "to_revision": self.to_revision,
            "to_time": self.to_time,
            "segments": self.segments,
            "broken": self.broken,
        })
    }
}

/// How far each verified snapshot restores (newest first, as `snapshots` are listed):
/// what `backup --list` shows. Unverified snapshots are never restored and have none.
pub fn reaches(
    snapshots: &[crate::backup::manifest::Manifest],
    segments: &[SegmentManifest],
) -> Vec<Reach> {
    snapshots
        .iter()
        .filter(|m| m.verified)
        .map(|m| {
            let c = chain(m.revision, &m.cluster_id, segments);
            Reach {
                snapshot: m.name.clone(),
                from_revision: m.revision,
                from_time: m.time.clone(),
                to_revision: c.last_revision,
                to_time: c
                    .last_time_unix_ms
                    .map(super::rfc3339_ms)
                    .unwrap_or_else(|| m.time.clone()),
                segments: c.segments.len(),
                broken: c.broken,
            }
        })
        .collect()
}

/// The restorable range: from the oldest verified snapshot to the furthest any reaches.
pub fn range(reaches: &[Reach]) -> Option<(&Reach, &Reach)> {
    let oldest = reaches.iter().min_by_key(|r| r.from_revision)?;
    let furthest = reaches.iter().max_by_key(|r| r.to_revision)?;
    Some((oldest, furthest))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub mod tests {
    use super::super::segment_name;
    use super::*;

    /// A manifest for revisions `first..=last` of cluster `c`, received at `last` seconds.
    pub fn seg(c: &str, first: i64, last: i64) -> SegmentManifest {
        SegmentManifest {
            name: segment_name(first, last),
            cluster_id: c.into(),
            first_revision: first,
            last_revision: last,
            revisions: u64::try_from(last - first + 1).unwrap(),
            events: 0,
            leases: 0,
            size: 0,
            sha256: String::new(),
            plain_size: 0,
            first_time: String::new(),
            first_time_unix_ms: u64::try_from(first).unwrap() * 1000,
            last_time: String::new(),
            last_time_unix_ms: u64::try_from(last).unwrap() * 1000,
            compression: "zstd".into(),
            encryption: None,
        }
    }

    fn names(c: &Chain) -> Vec<(i64, i64)> {
        c.segments
            .iter()
            .map(|m| (m.first_revision, m.last_revision))
            .collect()
    }

    #[test]
    fn segments_continuing_a_snapshot_chain_in_revision_order() {
        let all = [seg("a", 21, 30), seg("a", 11, 20), seg("a", 31, 31)];
        let c = chain(10, "a", &all);
        assert_eq!(names(&c), vec![(11, 20), (21, 30), (31, 31)]);
        assert_eq!(
            (c.last_revision, c.last_time_unix_ms, c.broken),
            (31, Some(31_000), None)
        );
    }

    #[test]
    fn overlaps_are_harmless_and_older_segments_are_skipped() {
        // A new leader re-archived 18..25; a segment before the snapshot is not needed.
        let all = [
            seg("a", 1, 9),
            seg("a", 11, 20),
            seg("a", 18, 25),
            seg("a", 26, 40),
        ];
        let c = chain(15, "a", &all);
        assert_eq!(names(&c), vec![(11, 20), (18, 25), (26, 40)]);
        assert_eq!(c.last_revision, 40);
    }

    #[test]
    fn a_hole_ends_the_chain_and_says_which_revisions_are_missing() {
        let all = [seg("a", 11, 20), seg("a", 25, 40)];
        let c = chain(10, "a", &all);
        assert_eq!(names(&c), vec![(11, 20)]);
        assert_eq!(c.last_revision, 20);
        let why = c.broken.unwrap();
        assert!(
            why.contains("revisions 21..24 are not in the archive"),
            "{why}"
        );
    }

    #[test]
    fn another_clusters_segments_never_join_the_chain() {
        let all = [seg("b", 11, 20), seg("a", 11, 12)];
        let c = chain(10, "a", &all);
        assert_eq!(names(&c), vec![(11, 12)]);
    }

    #[test]
    fn a_snapshot_with_no_segment_after_it_reaches_its_own_revision() {
        let c = chain(50, "a", &[seg("a", 11, 20)]);
        assert!(c.segments.is_empty());
        assert_eq!(
            (c.last_revision, c.last_time_unix_ms, c.broken),
            (50, None, None)
        );
    }

    #[test]
    fn each_verified_snapshot_reaches_as_far_as_its_chain_and_the_range_spans_them() {
        use crate::backup::manifest::Manifest;
        let snap = |name: &str, revision: i64, verified: bool| Manifest {
            name: name.into(),
            cluster_id: "a".into(),
            member_id: "1".into(),
            revision,
            etcd_version: "3.5.30".into(),
            size: 1,
            sha256: String::new(),
            time: format!("t{revision}"),
            time_unix: 0,
            verified,
            unverified_reason: None,
            compression: None,
            encryption: None,
            drill: None,
        };
        let snapshots = [
            snap("new", 30, true),
            snap("bad", 20, false),
            snap("old", 10, true),
        ];
        let segments = [seg("a", 11, 25), seg("a", 31, 40)];
        let r = reaches(&snapshots, &segments);
        assert_eq!(r.len(), 2, "the unverified one has no reach");
        assert_eq!((r[0].to_revision, r[0].segments), (40, 1));
        assert_eq!((r[1].to_revision, r[1].segments), (25, 1));
        assert!(r[1].broken.as_deref().unwrap_or("").contains("26..30"));
        let (oldest, furthest) = range(&r).unwrap();
        assert_eq!((oldest.from_revision, furthest.to_revision), (10, 40));
        assert_eq!(furthest.to_time, super::super::rfc3339_ms(40_000));
    }
}
