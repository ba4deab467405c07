//! The decision journal, `member/steward/decisions.jsonl`: one line per decision `init`
//! acted on. The sidecar reads it (was this member last started as a joining learner? how
//! many of each action for the metrics; which acts to post as Kubernetes Events), so it is
//! typed on both sides. Fields are only ever added, each with a serde default: a journal
//! written by an older release reads, and an older release skips what it does not know.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
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

/// The journal could not be read: its entries are unknown, never "none" (read as empty, a
/// recovery would be recorded, and counted, again).
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("decision journal {path:?}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A whole line (not the last, unfinished one) that is not an entry of any release.
    #[error("decision journal {path:?}, line {line}: not an entry of any release ({detail})")]
    Garbled {
        path: PathBuf,
        line: usize,
        detail: String,
    },
}

/// Appends one entry, durably: the line and its newline in one write, then `sync_data`.
///
/// A journal whose last line is unfinished (an append killed midway: only the last append
/// can be, as each one is synced before `append` returns) is mended first. A last line that
/// is a whole entry only lacks its newline, which is added. A torn one is an entry never
/// recorded (its `append` never returned, so nothing counted on it): the journal is copied
/// to `decisions.jsonl.torn-<length>` (kept, never deleted), then rewritten without the torn
/// bytes, so that the new entry starts a line of its own rather than joining the fragment
/// into a line no release can read.
pub fn append(dir: &Path, entry: &Entry) -> Result<(), VolumeError> {
    let mut line = serde_json::to_string(entry).unwrap_or_default();
    line.push('\n');
    let journal = path(dir);
    let append = || -> std::io::Result<()> {
        super::create_dir_durably(&steward_dir(dir))?;
        let created = !journal.try_exists()?;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&journal)?;
        if created {
            // The journal's own entry in its directory, or a crash loses the whole file.
            std::fs::File::open(steward_dir(dir))?.sync_all()?;
        }
        let mut text = Vec::new();
        f.read_to_end(&mut text)?;
        let kept = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if kept < text.len() {
            if lines_of(&text[kept..]).is_ok() {
                f.write_all(b"\n")?;
            } else {
                let aside = journal.with_extension(format!("jsonl.torn-{}", text.len()));
                std::fs::copy(&journal, &aside)?;
                std::fs::File::open(&aside)?.sync_all()?;
                let mut mended = text[..kept].to_vec();
                mended.extend_from_slice(line.as_bytes());
                super::write_atomically(&journal, &mended)?;
                tracing::warn!(journal = %journal.display(), torn_copy = %aside.display(), torn_bytes = text.len() - kept, "the decision journal's last line was torn (an append killed midway, never recorded): the journal was copied aside and rewritten without it");
                return Ok(());
            }
        }
        f.write_all(line.as_bytes())?;
        f.sync_data()
    };
    append().map_err(VolumeError::unwritable(dir))
}

/// The entries of one line: usually one; more when an older release's append (the entry and
/// its newline in two writes) was killed in between and the next one joined it. An entry of
/// an action this release does not know (a newer one's) is skipped.
fn lines_of(line: &[u8]) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    for value in serde_json::Deserializer::from_slice(line).into_iter::<serde_json::Value>() {
        let value = value.map_err(|e| e.to_string())?;
        match serde_json::from_value::<Entry>(value.clone()) {
            Ok(e) => entries.push(e),
            Err(e) => match value.get("action").and_then(|a| a.as_str()) {
                Some(action) if action.parse::<ActionKind>().is_err() => {}
                _ => return Err(e.to_string()),
            },
        }
    }
    Ok(entries)
}

/// Every entry, oldest first; a missing journal is empty.
///
/// What is skipped: an entry of an action this release does not know (the journal outlives
/// upgrades, and a newer release may have written it), and an unfinished last line that
/// does not parse: a torn append, whose entry was never recorded (see [`append`]). Skipping
/// it can only leave an act uncounted, never count one twice. Anything else that does not
/// parse is an error naming the file and the line: the journal is unreadable, not empty.
pub fn read(dir: &Path) -> Result<Vec<Entry>, JournalError> {
    let journal = path(dir);
    let text = match std::fs::read(&journal) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(source) => {
            return Err(JournalError::Io {
                path: journal,
                source,
            })
        }
    };
    let finished = text.last().is_none_or(|b| *b == b'\n');
    let lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    let mut entries = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        match lines_of(line) {
            Ok(found) => entries.extend(found),
            Err(_) if !finished && i + 1 == lines.len() => {}
            Err(detail) => {
                return Err(JournalError::Garbled {
                    path: journal,
                    line: i + 1,
                    detail,
                })
            }
        }
    }
    Ok(entries)
}

/// The action of the last decision `init` recorded on this volume, if any.
pub fn last_action(dir: &Path) -> Result<Option<ActionKind>, JournalError> {
    Ok(read(dir)?.last().map(|e| e.action))
}

/// How many times `init` took each action on this volume.
pub fn counts(dir: &Path) -> Result<BTreeMap<ActionKind, u64>, JournalError> {
    let mut counts = BTreeMap::new();
    for e in read(dir)? {
        *counts.entry(e.action).or_insert(0) += 1;
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{inspect, tests::temp};

    fn entry(action: ActionKind) -> Entry {
        Entry::new(1, action, "because")
    }

    fn raw(dir: &Path, bytes: &[u8]) {
        std::fs::create_dir_all(steward_dir(dir)).ok();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path(dir))
            .ok();
        if let Some(f) = f.as_mut() {
            f.write_all(bytes).ok();
        }
    }

    fn actions(dir: &Path) -> Result<Vec<ActionKind>, JournalError> {
        Ok(read(dir)?.into_iter().map(|e| e.action).collect())
    }

    #[test]
    fn entries_are_read_back_typed_and_counted() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = temp()?;
        assert_eq!(last_action(tmp.path())?, None);
        append(tmp.path(), &entry(ActionKind::Resume))?;
        assert_eq!(last_action(tmp.path())?, Some(ActionKind::Resume));
        append(tmp.path(), &entry(ActionKind::Restart))?;
        append(tmp.path(), &entry(ActionKind::Restart))?;
        assert_eq!(counts(tmp.path())?.get(&ActionKind::Restart), Some(&2));
        assert_eq!(last_action(tmp.path())?, Some(ActionKind::Restart));
        assert!(!inspect(tmp.path())?.has_data());
        Ok(())
    }

    #[test]
    fn a_line_of_a_newer_action_is_skipped_but_garbage_is_an_error_naming_the_line(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = temp()?;
        append(tmp.path(), &entry(ActionKind::Join))?;
        raw(
            tmp.path(),
            b"{\"ts\":2,\"action\":\"teleport\",\"reason\":\"new\"}\n",
        );
        assert_eq!(actions(tmp.path())?, vec![ActionKind::Join]);
        assert_eq!(last_action(tmp.path())?, Some(ActionKind::Join));
        // Garbage, a known action of the wrong shape, or a line torn and then followed by
        // another: the journal is unreadable, never shorter.
        for bad in [
            &b"not json\n"[..],
            b"{\"ts\":\"x\",\"action\":\"recover\"}\n",
            b"{\"ts\":3,\"act\n",
        ] {
            let tmp = temp()?;
            append(tmp.path(), &entry(ActionKind::Recover))?;
            raw(tmp.path(), bad);
            append(tmp.path(), &entry(ActionKind::Restart))?;
            let e = read(tmp.path()).err().ok_or("garbage read as entries")?;
            assert!(matches!(e, JournalError::Garbled { line: 2, .. }), "{e}");
            assert!(e.to_string().contains("decisions.jsonl"), "{e}");
            assert!(counts(tmp.path()).is_err());
        }
        Ok(())
    }

    #[test]
    fn a_journal_that_cannot_be_read_is_an_error_never_empty() -> Result<(), VolumeError> {
        let tmp = temp()?;
        std::fs::create_dir_all(path(tmp.path())).ok();
        assert!(matches!(read(tmp.path()), Err(JournalError::Io { .. })));
        assert!(last_action(tmp.path()).is_err());
        Ok(())
    }

    /// A crash mid-append leaves the last line torn (cut short, or zeros where the page was
    /// not written): that entry was never recorded, since its `append` never returned. It
    /// is skipped, so it is never counted; the next append keeps a copy of the torn
    /// journal aside and starts its entry on a line of its own.
    #[test]
    fn a_torn_last_line_is_an_entry_never_recorded_and_the_next_append_mends_it(
    ) -> Result<(), Box<dyn std::error::Error>> {
        for torn in [&b"{\"ts\":3,\"action\":\"reco"[..], &[0u8; 40][..]] {
            let tmp = temp()?;
            append(tmp.path(), &entry(ActionKind::Join))?;
            raw(tmp.path(), torn);
            assert_eq!(actions(tmp.path())?, vec![ActionKind::Join]);
            let len = std::fs::metadata(path(tmp.path()))?.len();
            append(tmp.path(), &entry(ActionKind::Recover))?;
            assert_eq!(
                actions(tmp.path())?,
                vec![ActionKind::Join, ActionKind::Recover]
            );
            let aside = std::fs::read(
                tmp.path()
                    .join(format!("member/steward/decisions.jsonl.torn-{len}")),
            )?;
            assert!(aside.ends_with(torn), "the torn bytes are kept aside");
            append(tmp.path(), &entry(ActionKind::Restart))?;
            assert_eq!(counts(tmp.path())?.get(&ActionKind::Recover), Some(&1));
        }
        Ok(())
    }

    /// An older release wrote the entry and its newline in two writes: killed in between,
    /// the entry is whole but unterminated, and the next append may have joined it.
    #[test]
    fn an_entry_without_its_newline_is_kept_and_one_joined_to_it_is_read(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = temp()?;
        raw(tmp.path(), br#"{"ts":1,"action":"join"}"#);
        assert_eq!(actions(tmp.path())?, vec![ActionKind::Join]);
        append(tmp.path(), &entry(ActionKind::Recover))?;
        assert_eq!(
            actions(tmp.path())?,
            vec![ActionKind::Join, ActionKind::Recover]
        );
        raw(
            tmp.path(),
            br#"{"ts":2,"action":"restart"}{"ts":3,"action":"resume"}"#,
        );
        raw(tmp.path(), b"\n");
        assert_eq!(
            actions(tmp.path())?,
            vec![
                ActionKind::Join,
                ActionKind::Recover,
                ActionKind::Restart,
                ActionKind::Resume
            ]
        );
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
