//! The formation marker, `member/steward/formation.json`: this pod's nonce for a formation
//! under way, and once agreed, the cluster token. Written durably before etcd starts, so a
//! pod killed mid-formation recognises its own formation when it comes back. Beside it,
//! the snapshots this pod found corrupt when it downloaded one to restore a new cluster
//! from (`rejected-snapshots.json`), so that the next round chooses another.

use std::path::{Path, PathBuf};

use crate::facts::{Formation, LeftMarker, RecoveryMarker};

use super::{steward_dir, write_atomically, VolumeError};

fn path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("formation.json")
}

/// The marker, if there is one. An unreadable or malformed marker is an error the caller
/// notes and ignores (it is not evidence of anything).
pub fn read(dir: &Path) -> Result<Option<Formation>, String> {
    match std::fs::read(path(dir)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| e.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Writes (or replaces) the marker, durably.
pub fn write(dir: &Path, formation: &Formation) -> Result<(), VolumeError> {
    let bytes = serde_json::to_vec(formation).unwrap_or_default();
    write_atomically(&path(dir), &bytes).map_err(VolumeError::unwritable(dir))
}

fn recovery_path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("recovery.json")
}

/// The recovery marker (`member/steward/recovery.json`), if this volume was recovered from.
pub fn recovery(dir: &Path) -> Result<Option<RecoveryMarker>, String> {
    match std::fs::read(recovery_path(dir)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| e.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
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

/// The restore request this volume was set aside for (`member/steward/restored-for.json`).
pub fn restored_for(dir: &Path) -> Option<String> {
    std::fs::read(restored_path(dir))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
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

/// The leave marker (`<data-dir>/steward-left.json`), if this pod left the cluster.
pub fn left(dir: &Path) -> Option<LeftMarker> {
    std::fs::read(left_path(dir))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
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

/// The snapshots found corrupt on download, with why (none when the file is missing or
/// unreadable: a re-download finds a corrupt one again).
pub fn rejected_snapshots(dir: &Path) -> Vec<(String, String)> {
    std::fs::read(rejected_path(dir))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Notes that `name` failed its checksum here, so it is not chosen again.
pub fn reject_snapshot(dir: &Path, name: &str, why: &str) -> Result<(), VolumeError> {
    let mut all = rejected_snapshots(dir);
    if !all.iter().any(|(n, _)| n == name) {
        all.push((name.to_string(), why.to_string()));
    }
    let bytes = serde_json::to_vec(&all).unwrap_or_default();
    write_atomically(&rejected_path(dir), &bytes).map_err(VolumeError::unwritable(dir))
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
    fn a_garbled_marker_is_noted_and_ignored() -> Result<(), VolumeError> {
        let tmp = temp()?;
        std::fs::create_dir_all(tmp.path().join("member/steward")).ok();
        std::fs::write(path(tmp.path()), b"{not json").ok();
        let state = inspect(tmp.path())?;
        assert_eq!(state.formation, None);
        assert_eq!(state.notes.len(), 1, "{:?}", state.notes);
        Ok(())
    }

    #[test]
    fn a_rejected_snapshot_is_remembered_once_and_is_not_data() -> Result<(), VolumeError> {
        let tmp = temp()?;
        assert!(rejected_snapshots(tmp.path()).is_empty());
        reject_snapshot(tmp.path(), "s1", "sha256 mismatch")?;
        reject_snapshot(tmp.path(), "s1", "again")?;
        reject_snapshot(tmp.path(), "s2", "trailer mismatch")?;
        let state = inspect(tmp.path())?;
        assert_eq!(
            state.rejected_snapshots,
            vec![
                ("s1".to_string(), "sha256 mismatch".to_string()),
                ("s2".to_string(), "trailer mismatch".to_string())
            ]
        );
        assert!(!state.has_data());
        Ok(())
    }
}
