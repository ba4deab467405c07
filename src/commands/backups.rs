//! `backup --list`: every stored snapshot, newest first, with how far each restores through
//! the continuous archive, and the restorable range (oldest snapshot → last archived
//! revision). `-o json` (the default): one JSON object per snapshot; `-o text`: one screen.

use crate::backup::archive::chain::{self, Reach};
use crate::backup::archive::{stored, SegmentManifest};
use crate::backup::manifest::{self, Manifest};
use crate::backup::Backups;

/// Lists the store: snapshots and segment manifests, then prints them.
pub async fn list(backups: &Backups, text: bool) -> anyhow::Result<()> {
    let snapshots = backups.list().await?;
    let segments = stored::list(&backups.store).await?;
    print!("{}", render(&snapshots, &segments, text));
    Ok(())
}

/// What `backup --list` prints (pure).
pub fn render(snapshots: &[Manifest], segments: &[SegmentManifest], text: bool) -> String {
    let reaches = chain::reaches(snapshots, segments);
    let reach_of = |m: &Manifest| reaches.iter().find(|r| r.snapshot == m.name);
    if !text {
        return snapshots
            .iter()
            .map(|m| {
                let mut line = manifest::list_line(m);
                line["restorable"] = reach_of(m).map(Reach::to_json).into();
                format!("{line}\n")
            })
            .collect();
    }
    let mut out = match chain::range(&reaches) {
        Some((oldest, furthest)) => format!(
            "restorable: revision {} ({}) to revision {} ({}), {} snapshots, {} archive segments\n",
            oldest.from_revision,
            oldest.from_time,
            furthest.to_revision,
            furthest.to_time,
            snapshots.len(),
            segments.len()
        ),
        None if snapshots.is_empty() => {
            "restorable: nothing (the store holds no snapshot)\n".into()
        }
        None => "restorable: nothing (no snapshot is verified)\n".into(),
    };
    out.push_str("SNAPSHOT  REVISION  SIZE  VERIFIED  DRILL  ENCRYPTED  RESTORES TO\n");
    for m in snapshots {
        let drill = match &m.drill {
            Some(d) if d.passed => "passed",
            Some(_) => "FAILED",
            None => "-",
        };
        out.push_str(&format!(
            "{}  {}  {}  {}  {}  {}  {}\n",
            m.name,
            m.revision,
            m.size,
            if m.verified { "yes" } else { "NO" },
            drill,
            if m.encryption.is_some() { "yes" } else { "no" },
            reach_of(m)
                .map(reach_text)
                .unwrap_or_else(|| "never restored".into()),
        ));
    }
    out
}

fn reach_text(r: &Reach) -> String {
    let mut s = format!("revision {} ({})", r.to_revision, r.to_time);
    if let Some(why) = &r.broken {
        s.push_str(&format!("; the archive after it stops: {why}"));
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::backup::archive::chain::tests::seg;

    fn snap(name: &str, revision: i64) -> Manifest {
        Manifest {
            name: name.into(),
            cluster_id: "a".into(),
            member_id: "1".into(),
            revision,
            etcd_version: "3.5.30".into(),
            size: 10,
            sha256: String::new(),
            time: format!("2026-11-27T08:00:{revision:02}Z"),
            time_unix: 0,
            verified: true,
            unverified_reason: None,
            compression: None,
            encryption: None,
            drill: None,
        }
    }

    #[test]
    fn the_list_says_the_restorable_range_from_the_oldest_snapshot_to_the_last_archived_revision() {
        let snapshots = [snap("s2", 20), snap("s1", 10)];
        let segments = [seg("a", 11, 20), seg("a", 21, 45)];
        let text = render(&snapshots, &segments, true);
        let first = text.lines().next().unwrap();
        assert!(
            first.starts_with("restorable: revision 10 (2026-11-27T08:00:10Z) to revision 45 (1970-01-01T00:00:45.000Z)"),
            "{text}"
        );
        let json = render(&snapshots, &segments, false);
        let lines: Vec<serde_json::Value> = json
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["name"], "s2");
        assert_eq!(lines[0]["restorable"]["to_revision"], 45);
        assert_eq!(lines[1]["restorable"]["from_revision"], 10);
        assert_eq!(lines[1]["restorable"]["segments"], 2);
    }

    #[test]
    fn an_empty_store_restores_nothing_and_says_so() {
        assert!(
            render(&[], &[], true).starts_with("restorable: nothing (the store holds no snapshot)")
        );
        assert_eq!(render(&[], &[], false), "");
    }
}
