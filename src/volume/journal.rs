//! The decision journal, `member/steward/decisions.jsonl`: one line per decision `init`
//! acted on. The sidecar reads it (was this member last started as a joining learner? how
//! many of each action for the metrics; which acts to post as Kubernetes Events), so it is
//! typed on both sides. Fields are only ever added, each with a serde default: a journal
//! written by an older release reads, and an older release skips what it does not know.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::facts::{ActionKind, Vouch};

use super::{steward_dir, VolumeError};

/// One journal line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Unix time, seconds.
    pub ts: u64,
    pub action: ActionKind,
    /// The sentence the log gave for it.
    #[serde(default)]
    pub reason: String,
    /// The cluster's word for this volume when the decision was taken, if a voter that saw
    /// a leader listed the WAL's member, in the WAL's cluster, at this pod's peer URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vouch: Option<Vouch>,
    /// For a set-aside: why, and where the data went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_aside: Option<SetAside>,
    /// For a member started from a backup: what it was restored from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<Restored>,
}

impl Entry {
    /// An entry with nothing but its time, action and sentence.
    pub fn new(ts: u64, action: ActionKind, reason: impl Into<String>) -> Entry {
        Entry {
            ts,
            action,
            reason: reason.into(),
            vouch: None,
            set_aside: None,
            restored: None,
        }
    }
}

/// Where a set-aside moved the data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAside {
    /// The reason's slug (`removed-member`, `left`, …), as in the directory's name.
    pub why: String,
    /// Relative to the data directory: `set-aside/<unix-time>-<why>/member`.
    pub to: String,
}

/// What a member started from a backup was restored from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restored {
    /// The snapshot (or restore point) the formation agreed on.
    pub snapshot: String,
    /// The revision the restored data holds, when known (the snapshot's, or the last one
    /// the archive replayed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// The revision the cluster starts from after the jump (`--restore-bump-revision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_after: Option<i64>,
}

pub fn path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("decisions.jsonl")
}

/// Appends one entry, durably.
pub fn append(dir: &Path, entry: &Entry) -> Result<(), VolumeError> {
    let line = serde_json::to_string(entry).unwrap_or_default();
    let append = || -> std::io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(steward_dir(dir))?;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path(dir))?;
        writeln!(f, "{line}")?;
        f.sync_data()
    };
    append().map_err(VolumeError::unwritable(dir))
}

/// Every entry that parses, oldest first (a line this version does not know is skipped:
/// the journal outlives upgrades).
pub fn read(dir: &Path) -> Vec<Entry> {
    let Ok(text) = std::fs::read_to_string(path(dir)) else {
        return vec![];
    };
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The action of the last decision `init` recorded on this volume, if any.
pub fn last_action(dir: &Path) -> Option<ActionKind> {
    read(dir).last().map(|e| e.action)
}

/// How many times `init` took each action on this volume.
pub fn counts(dir: &Path) -> BTreeMap<ActionKind, u64> {
    let mut counts = BTreeMap::new();
    for e in read(dir) {
        *counts.entry(e.action).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{inspect, tests::temp};

    fn entry(action: ActionKind) -> Entry {
        Entry::new(1, action, "because")
    }

    #[test]
    fn entries_are_read_back_typed_and_counted() -> Result<(), VolumeError> {
        let tmp = temp()?;
        assert_eq!(last_action(tmp.path()), None);
        append(tmp.path(), &entry(ActionKind::Resume))?;
        assert_eq!(last_action(tmp.path()), Some(ActionKind::Resume));
        append(tmp.path(), &entry(ActionKind::Restart))?;
        append(tmp.path(), &entry(ActionKind::Restart))?;
        assert_eq!(counts(tmp.path()).get(&ActionKind::Restart), Some(&2));
        assert_eq!(last_action(tmp.path()), Some(ActionKind::Restart));
        assert!(!inspect(tmp.path())?.has_data());
        Ok(())
    }

    #[test]
    fn lines_of_an_older_or_newer_version_are_skipped() -> Result<(), VolumeError> {
        let tmp = temp()?;
        append(tmp.path(), &entry(ActionKind::Join))?;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(path(tmp.path()))
            .map_err(VolumeError::unwritable(tmp.path()))?;
        writeln!(f, "{{\"ts\":2,\"action\":\"teleport\"}}\nnot json").ok();
        assert_eq!(read(tmp.path()).len(), 1);
        assert_eq!(last_action(tmp.path()), Some(ActionKind::Join));
        Ok(())
    }

    #[test]
    fn the_journal_line_format_is_stable() {
        let text = serde_json::to_string(&entry(ActionKind::SetAside)).unwrap_or_default();
        assert_eq!(text, r#"{"ts":1,"action":"set-aside","reason":"because"}"#);
        let vouched = Entry {
            vouch: Some(Vouch {
                member_id: 0xab,
                cluster_id: 0xcd,
                peer_url: "http://etcd-0.etcd:2380".into(),
                ts: 1,
            }),
            ..entry(ActionKind::Restart)
        };
        let text = serde_json::to_string(&vouched).unwrap_or_default();
        assert_eq!(
            text,
            r#"{"ts":1,"action":"restart","reason":"because","vouch":{"member_id":"ab","cluster_id":"cd","peer_url":"http://etcd-0.etcd:2380","ts":1}}"#
        );
        let back: Entry = serde_json::from_str(&text).unwrap_or_else(|_| entry(ActionKind::Join));
        assert_eq!(back, vouched);
    }

    #[test]
    fn a_set_aside_and_a_restore_are_recorded_and_older_lines_still_read() {
        let moved = Entry {
            set_aside: Some(SetAside {
                why: "left".into(),
                to: "set-aside/7-left/member".into(),
            }),
            ..entry(ActionKind::SetAside)
        };
        let text = serde_json::to_string(&moved).unwrap_or_default();
        assert_eq!(
            text,
            r#"{"ts":1,"action":"set-aside","reason":"because","set_aside":{"why":"left","to":"set-aside/7-left/member"}}"#
        );
        let restored = Entry {
            restored: Some(Restored {
                snapshot: "20261123T033912.123Z-r42".into(),
                revision: Some(42),
                revision_after: Some(1_000_000_042),
            }),
            ..entry(ActionKind::Bootstrap)
        };
        let text = serde_json::to_string(&restored).unwrap_or_default();
        let back: Option<Entry> = serde_json::from_str(&text).ok();
        assert_eq!(back, Some(restored));
        // A line of the release before these fields reads, without them.
        let old: Option<Entry> =
            serde_json::from_str(r#"{"ts":1,"action":"set-aside","reason":"because"}"#).ok();
        assert_eq!(old, Some(entry(ActionKind::SetAside)));
    }
}
