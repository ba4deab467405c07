//! The formation marker, `member/steward/formation.json`: this pod's nonce for a formation
//! under way, and once agreed, the cluster token. Written durably before etcd starts, so a
//! pod killed mid-formation recognises its own formation when it comes back. Beside it,
//! the snapshots this pod could not use when it downloaded one to restore a new cluster
//! from (`rejected-snapshots.json`), with the content or the keys they failed on, so that
//! the next round chooses another until either changes. And what `init` waits for
//! (`waiting.json`), for `/ready`, the peer report and `status`.

use std::path::{Path, PathBuf};

use crate::facts::{Failed, Formation, LeftMarker, RecoveryMarker, Rejection, Waiting};

use super::{steward_dir, write_atomically, VolumeError};

fn path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("formation.json")
}

/// The marker, if there is one; an error names the marker that could not be read or
/// parsed (never read as "no marker": a pod that prepared or started a formation would take
/// part in another one).
pub fn read(dir: &Path) -> Result<Option<Formation>, String> {
    read_marker(&path(dir))
}

/// Writes (or replaces) the marker, durably.
pub fn write(dir: &Path, formation: &Formation) -> Result<(), VolumeError> {
    let bytes = serde_json::to_vec(formation).unwrap_or_default();
    write_atomically(&path(dir), &bytes).map_err(VolumeError::unwritable(dir))
}

fn recovery_path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("recovery.json")
}

/// The recovery marker (`member/steward/recovery.json`), if this volume was recovered from;
/// an error names the marker that could not be read or parsed (never read as "no marker":
/// while the request is held, the survivor would be forced to a new cluster again).
pub fn recovery(dir: &Path) -> Result<Option<RecoveryMarker>, String> {
    read_marker(&recovery_path(dir))
}

/// Records, durably and before etcd is forced to a one-member cluster, which recovery
/// this is and how far the WAL's commit index went.
pub fn write_recovery(dir: &Path, m: &RecoveryMarker) -> Result<(), VolumeError> {
    let bytes = serde_json::to_vec(m).unwrap_or_default();
    write_atomically(&recovery_path(dir), &bytes).map_err(VolumeError::unwritable(dir))
}

fn restored_path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("restored-for.json")
}

/// The restore request this volume was set aside for (`member/steward/restored-for.json`);
/// an error names the marker that
/// could not be read or parsed (never read as "no marker": that would set the volume aside
/// for the same request again).
pub fn restored_for(dir: &Path) -> Result<Option<String>, String> {
    read_marker(&restored_path(dir))
}

/// A JSON marker at `path`: `None` when there is none; an error, naming the file, when it
/// cannot be read or parsed.
fn read_marker<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Records that this volume was set aside for restore request `id`: it is not set aside
/// for it again.
pub fn write_restored_for(dir: &Path, id: &str) -> Result<(), VolumeError> {
    let bytes = serde_json::to_vec(id).unwrap_or_default();
    write_atomically(&restored_path(dir), &bytes).map_err(VolumeError::unwritable(dir))
}

fn left_path(dir: &Path) -> PathBuf {
    dir.join("steward-left.json")
}

/// The leave marker (`<data-dir>/steward-left.json`), if this pod left the cluster; an error names the marker that could not be read or parsed (never
/// read as "no marker": that would let a pod that left rejoin).
pub fn left(dir: &Path) -> Result<Option<LeftMarker>, String> {
    read_marker(&left_path(dir))
}

/// Records that this pod leaves the cluster: it does not rejoin until `rejoin`.
pub fn write_left(dir: &Path, m: &LeftMarker) -> Result<(), VolumeError> {
    let bytes = serde_json::to_vec(m).unwrap_or_default();
    write_atomically(&left_path(dir), &bytes).map_err(VolumeError::unwritable(dir))
}

/// `rejoin`: the leave marker is renamed (kept, with the time) so that the pod joins again;
/// `false` when there was none.
pub fn clear_left(dir: &Path, stamp: u64) -> Result<bool, VolumeError> {
    let from = left_path(dir);
    if !from.exists() {
        return Ok(false);
    }
    let to = dir.join(format!("steward-left.json.rejoined-{stamp}"));
    std::fs::rename(&from, &to).map_err(VolumeError::unwritable(dir))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(VolumeError::unwritable(dir))?;
    Ok(true)
}

fn rejected_path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("rejected-snapshots.json")
}

/// One entry of `rejected-snapshots.json`, as this or an older etcd-steward wrote it.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Stored {
    Now(Rejection),
    /// Before the content and keys were recorded: `[name, detail]`.
    Before(String, String),
}

/// The snapshots this pod could not use, with what was wanting (none without the file).
/// Entries an older etcd-steward wrote (name and detail only) come back as
/// [`Failed::Unrecorded`]. An error names the file that could not be read or parsed (never
/// read as "none rejected": the snapshot that failed would be chosen again).
pub fn rejected_snapshots(dir: &Path) -> Result<Vec<Rejection>, String> {
    let stored: Vec<Stored> = read_marker(&rejected_path(dir))?.unwrap_or_default();
    Ok(stored
        .into_iter()
        .map(|s| match s {
            Stored::Now(r) => r,
            Stored::Before(name, detail) => Rejection {
                name,
                failed: Failed::Unrecorded { detail },
            },
        })
        .collect())
}

/// Records why snapshot `r.name` could not be used here, in place of whatever was recorded
/// for it before (one entry per name: the latest). Writing the same record again changes
/// nothing. A list that cannot be read is not written over (its entries would be lost).
pub fn reject_snapshot(dir: &Path, r: &Rejection) -> Result<(), VolumeError> {
    let mut all = rejected_snapshots(dir).map_err(VolumeError::MarkerUnreadable)?;
    all.retain(|old| old.name != r.name);
    all.push(r.clone());
    let bytes = serde_json::to_vec(&all).unwrap_or_default();
    write_atomically(&rejected_path(dir), &bytes).map_err(VolumeError::unwritable(dir))
}

fn waiting_path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("waiting.json")
}

/// What `init` noted it waits for (`member/steward/waiting.json`), if anything. A note
/// that does not parse says nothing.
pub fn waiting(dir: &Path) -> Option<Waiting> {
    std::fs::read(waiting_path(dir))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
}

/// Notes what `init` waits for, in place of the note before, durably.
pub fn write_waiting(dir: &Path, w: &Waiting) -> Result<(), VolumeError> {
    let bytes = serde_json::to_vec(w).unwrap_or_default();
    write_atomically(&waiting_path(dir), &bytes).map_err(VolumeError::unwritable(dir))
}

/// `init` goes on: the note goes (the agent's own note, not data). No note is fine.
pub fn clear_waiting(dir: &Path) -> Result<(), VolumeError> {
    match std::fs::remove_file(waiting_path(dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(VolumeError::unwritable(dir)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{inspect, tests::temp};

    #[test]
    fn a_marker_round_trips_and_is_not_data() -> Result<(), VolumeError> {
        let tmp = temp()?;
        let f = Formation {
            nonce: "n".into(),
            initial_cluster: "a=b".into(),
            token: Some("t".into()),
            snapshot: Some("s".into()),
        };
        write(tmp.path(), &f)?;
        assert_eq!(inspect(tmp.path())?.formation, Some(f));
        assert!(!inspect(tmp.path())?.has_data());
        Ok(())
    }

    #[test]
    fn a_waiting_note_round_trips_is_not_data_and_clearing_it_twice_is_fine(
    ) -> Result<(), VolumeError> {
        let tmp = temp()?;
        assert_eq!(waiting(tmp.path()), None);
        let w = Waiting {
            since: 1,
            kind: "NoUsableBackup".into(),
            reason: "no key opens it".into(),
        };
        write_waiting(tmp.path(), &w)?;
        assert_eq!(waiting(tmp.path()), Some(w));
        assert!(!inspect(tmp.path())?.has_data(), "a note is not data");
        clear_waiting(tmp.path())?;
        clear_waiting(tmp.path())?;
        assert_eq!(waiting(tmp.path()), None);
        Ok(())
    }

    #[test]
    fn a_garbled_marker_is_an_error_naming_it_never_no_marker() -> Result<(), VolumeError> {
        let tmp = temp()?;
        std::fs::create_dir_all(tmp.path().join("member/steward")).ok();
        std::fs::write(path(tmp.path()), b"{not json").ok();
        assert!(read(tmp.path()).is_err_and(|e| e.contains("formation.json")));
        std::fs::write(recovery_path(tmp.path()), br#"{"id":"r1","com"#).ok();
        assert!(recovery(tmp.path()).is_err_and(|e| e.contains("recovery.json")));
        Ok(())
    }

    #[test]
    fn a_rejected_list_that_cannot_be_read_is_never_written_over() -> Result<(), VolumeError> {
        let tmp = temp()?;
        std::fs::create_dir_all(tmp.path().join("member/steward")).ok();
        let torn = br#"[{"name":"s1","failed":{"#;
        std::fs::write(rejected_path(tmp.path()), torn).ok();
        assert!(
            rejected_snapshots(tmp.path()).is_err_and(|e| e.contains("rejected-snapshots.json"))
        );
        assert!(matches!(
            reject_snapshot(tmp.path(), &checksum("s2", "e1")),
            Err(VolumeError::MarkerUnreadable(_))
        ));
        assert_eq!(
            std::fs::read(rejected_path(tmp.path())).ok().as_deref(),
            Some(&torn[..]),
            "what it held is kept for someone to look at"
        );
        Ok(())
    }

    fn checksum(name: &str, etag: &str) -> Rejection {
        Rejection {
            name: name.into(),
            failed: Failed::Checksum {
                content: crate::facts::SnapshotContent {
                    sha256: "ab".into(),
                    size: Some(10),
                    etag: Some(etag.into()),
                },
                detail: "sha256 mismatch".into(),
            },
        }
    }

    #[test]
    fn a_rejected_snapshot_is_remembered_once_per_name_latest_first_and_is_not_data(
    ) -> Result<(), VolumeError> {
        let tmp = temp()?;
        assert_eq!(rejected_snapshots(tmp.path()), Ok(vec![]));
        let key = Rejection {
            name: "s2".into(),
            failed: Failed::Key {
                content: Default::default(),
                encrypted_to: "sha256:aa".into(),
                configured: vec!["sha256:bb".into()],
            },
        };
        reject_snapshot(tmp.path(), &checksum("s1", "e1"))?;
        reject_snapshot(tmp.path(), &key)?;
        reject_snapshot(tmp.path(), &checksum("s1", "e2"))?;
        reject_snapshot(tmp.path(), &checksum("s1", "e2"))?;
        let state = inspect(tmp.path())?;
        assert_eq!(state.rejected_snapshots, vec![key, checksum("s1", "e2")]);
        assert!(!state.has_data());
        Ok(())
    }

    #[test]
    fn an_older_name_and_detail_list_is_still_read_as_unrecorded() -> Result<(), VolumeError> {
        let tmp = temp()?;
        std::fs::create_dir_all(tmp.path().join("member/steward")).ok();
        std::fs::write(
            rejected_path(tmp.path()),
            br#"[["s1","snapshot s1 fails its checksum: sha256 mismatch"]]"#,
        )
        .ok();
        let unrecorded = Rejection {
            name: "s1".into(),
            failed: Failed::Unrecorded {
                detail: "snapshot s1 fails its checksum: sha256 mismatch".into(),
            },
        };
        assert_eq!(rejected_snapshots(tmp.path()), Ok(vec![unrecorded.clone()]));
        // Rewritten in the new form, the old entry kept as it was until its name fails again.
        reject_snapshot(tmp.path(), &checksum("s2", "e1"))?;
        assert_eq!(
            rejected_snapshots(tmp.path()),
            Ok(vec![unrecorded, checksum("s2", "e1")])
        );
        reject_snapshot(tmp.path(), &checksum("s1", "e1"))?;
        assert_eq!(
            rejected_snapshots(tmp.path()),
            Ok(vec![checksum("s2", "e1"), checksum("s1", "e1")])
        );
        Ok(())
    }
}
