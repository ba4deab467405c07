//! The data directory: what it holds (a `*.wal` under `member/wal` is data, exactly as etcd
//! decides; [`wal`] reads whose), and what etcd-steward writes there: the formation
//! [`marker`], the decision [`journal`], and `set-aside/`. Data is never deleted here:
//! what must go is renamed aside.

pub mod journal;
pub mod marker;
pub mod wal;

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::facts::{DataDirState, WalState};

#[derive(Debug, Error)]
pub enum VolumeError {
    #[error("data directory {path:?} is not a directory; point --data-dir at the etcd volume")]
    NotADirectory { path: PathBuf },
    #[error("cannot read data directory {path:?}: {source}; check the volume and its permissions")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write in data directory {path:?}: {source}; check the volume is writable and not full")]
    Unwritable {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl VolumeError {
    fn unwritable(dir: &Path) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
        move |source| VolumeError::Unwritable {
            path: dir.to_path_buf(),
            source,
        }
    }
}

pub(crate) fn member_dir(dir: &Path) -> PathBuf {
    dir.join("member")
}

/// `member/steward/`: etcd-steward's own files, inside `member/` so that they go aside
/// with the data they describe.
pub(crate) fn steward_dir(dir: &Path) -> PathBuf {
    member_dir(dir).join("steward")
}

/// Looks at the data directory without changing it. A missing directory is empty.
pub fn inspect(dir: &Path) -> Result<DataDirState, VolumeError> {
    let unreadable = |source| VolumeError::Unreadable {
        path: dir.to_path_buf(),
        source,
    };
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(VolumeError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        Ok(_) => {
            std::fs::read_dir(dir).map_err(unreadable)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DataDirState::empty()),
        Err(e) => return Err(unreadable(e)),
    }
    let mut notes = Vec::new();
    let wal = wal::inspect(&member_dir(dir).join("wal")).map_err(unreadable)?;
    let formation = marker::read(dir).unwrap_or_else(|e| {
        notes.push(format!("formation marker unreadable, ignored: {e}"));
        None
    });
    let recovery = marker::recovery(dir).unwrap_or_else(|e| {
        notes.push(format!("recovery marker unreadable, ignored: {e}"));
        None
    });
    Ok(DataDirState {
        wal,
        tail: None,
        recovery,
        restored_for: marker::restored_for(dir),
        left: marker::left(dir),
        formation,
        notes,
        rejected_snapshots: marker::rejected_snapshots(dir),
    })
}

/// How far the volume's log goes (scans the last WAL file; `None` without a WAL).
pub fn log_tail(dir: &Path) -> Result<Option<crate::facts::WalTail>, VolumeError> {
    wal::tail(&member_dir(dir).join("wal")).map_err(|source| VolumeError::Unreadable {
        path: dir.to_path_buf(),
        source,
    })
}

/// Whether the directory holds etcd data (a WAL).
pub fn has_data(dir: &Path) -> Result<bool, VolumeError> {
    Ok(!matches!(inspect(dir)?.wal, WalState::None))
}

/// Creates the data directory (mode 0700, as etcd wants it) and checks it is writable.
pub fn prepare(dir: &Path) -> Result<(), VolumeError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(VolumeError::unwritable(dir))?;
    let probe = dir.join(".etcd-steward-write-test");
    std::fs::write(&probe, b"ok").map_err(VolumeError::unwritable(dir))?;
    std::fs::remove_file(&probe).map_err(VolumeError::unwritable(dir))
}

/// Writes `bytes` to `path` durably: a temporary file, fsync, rename, fsync the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Moves `member/` (WAL, snapshots, our marker) to `set-aside/<stamp>-<why>/member`
/// inside the data directory and returns where it went; `None` when there was nothing.
pub fn set_aside(dir: &Path, why: &str, stamp: u64) -> Result<Option<PathBuf>, VolumeError> {
    let member = member_dir(dir);
    if !member.exists() {
        return Ok(None);
    }
    let target_dir = dir.join("set-aside").join(format!("{stamp}-{why}"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&target_dir)
        .map_err(VolumeError::unwritable(dir))?;
    let target = target_dir.join("member");
    std::fs::rename(&member, &target).map_err(VolumeError::unwritable(dir))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(VolumeError::unwritable(dir))?;
    Ok(Some(target))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::facts::WalIdentity;

    pub(crate) fn temp() -> Result<tempfile::TempDir, VolumeError> {
        tempfile::tempdir().map_err(|source| VolumeError::Unreadable {
            path: "/tmp".into(),
            source,
        })
    }

    /// A data directory whose first WAL names `member` of `cluster`.
    fn temp_with_wal(member: u64, cluster: u64) -> Result<tempfile::TempDir, VolumeError> {
        let tmp = temp()?;
        let wal = tmp.path().join("member/wal");
        std::fs::create_dir_all(&wal).ok();
        std::fs::write(
            wal.join("0000000000000000-0000000000000000.wal"),
            wal::tests::wal_head(member, cluster),
        )
        .ok();
        Ok(tmp)
    }

    #[test]
    fn a_directory_without_a_wal_is_empty_even_with_other_files() -> Result<(), VolumeError> {
        let tmp = temp()?;
        std::fs::create_dir_all(tmp.path().join("member/snap")).ok();
        std::fs::write(tmp.path().join("lost+found"), b"").ok();
        let state = inspect(tmp.path())?;
        assert_eq!(state.wal, WalState::None);
        assert!(!state.has_data());
        assert!(!has_data(tmp.path())?);
        Ok(())
    }

    #[test]
    fn a_wal_file_means_data_and_names_its_member() -> Result<(), VolumeError> {
        let tmp = temp_with_wal(5, 6)?;
        let wal = tmp.path().join("member/wal");
        std::fs::write(wal.join("0.tmp"), b"preallocated").ok();
        let state = inspect(tmp.path())?;
        assert_eq!(
            state.wal_identity(),
            Some(WalIdentity {
                member_id: 5,
                cluster_id: 6
            })
        );
        assert!(has_data(tmp.path())?);
        Ok(())
    }

    #[test]
    fn set_aside_renames_member_and_keeps_every_byte() -> Result<(), VolumeError> {
        let tmp = temp_with_wal(5, 6)?;
        let moved = set_aside(tmp.path(), "removed-member", 42)?;
        let expected = tmp.path().join("set-aside/42-removed-member/member");
        assert_eq!(moved.as_deref(), Some(expected.as_path()));
        assert!(expected
            .join("wal/0000000000000000-0000000000000000.wal")
            .exists());
        assert!(!inspect(tmp.path())?.has_data());
        assert_eq!(set_aside(tmp.path(), "again", 43)?, None);
        Ok(())
    }

    #[test]
    fn a_file_in_place_of_the_directory_is_an_error() {
        let tmp = tempfile::NamedTempFile::new().ok();
        let path = tmp
            .as_ref()
            .map(|t| t.path().to_path_buf())
            .unwrap_or_default();
        assert!(matches!(
            inspect(&path),
            Err(VolumeError::NotADirectory { .. })
        ));
    }
}
