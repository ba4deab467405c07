//! The data directory: what it holds (a `*.wal` under `member/wal` is data, exactly as etcd
//! decides; [`wal`] reads whose), and what etcd-steward writes there: the formation
//! [`marker`], the decision [`journal`], and `set-aside/`. Data is never deleted here:
//! what must go is renamed aside ([`aside`] lists those copies, and removes one only when an
//! operator names it).

pub mod aside;
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
    /// A marker (named, with the error) that cannot be read or parsed: it is not written
    /// over, as what it records would be lost.
    #[error("{0}; it is not written over until it is repaired or moved away")]
    MarkerUnreadable(String),
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
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
    let wal = wal::inspect(&member_dir(dir).join("wal")).map_err(unreadable)?;
    // Every record of the agent's own that cannot be read or parsed is named, never read as
    // absent: `decide` waits on any of them (`Why::MarkerUnreadable`).
    let mut unreadable_markers = Vec::new();
    let mut named = |what: &str, e: String| unreadable_markers.push(format!("{what} {e}"));
    let formation = marker::read(dir).unwrap_or_else(|e| {
        named("formation marker", e);
        None
    });
    let recovery = marker::recovery(dir).unwrap_or_else(|e| {
        named("recovery marker", e);
        None
    });
    let restored_for = marker::restored_for(dir).unwrap_or_else(|e| {
        named("restore marker", e);
        None
    });
    let left = marker::left(dir).unwrap_or_else(|e| {
        named("leave marker", e);
        None
    });
    let rejected_snapshots = marker::rejected_snapshots(dir).unwrap_or_else(|e| {
        named("list of rejected snapshots", e);
        vec![]
    });
    if let Err(e) = journal::read(dir) {
        unreadable_markers.push(e.to_string());
    }
    Ok(DataDirState {
        wal,
        tail: None,
        recovery,
        restored_for,
        left,
        formation,
        notes: vec![],
        rejected_snapshots,
        unreadable_markers,
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

/// Creates `dir` (mode 0700, as etcd wants its directories) and the parents it lacks, each
/// one synced into its own parent, so that what is then written inside survives a crash.
pub(crate) fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    if dir.as_os_str().is_empty() || dir.try_exists()? {
        return Ok(());
    }
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent {
        create_dir_durably(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        other => other?,
    }
    match parent {
        Some(parent) => std::fs::File::open(parent)?.sync_all(),
        None => Ok(()),
    }
}

/// Writes `bytes` to `path` durably: a temporary file, fsync, rename, fsync the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        create_dir_durably(parent)?;
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
    create_dir_durably(&target_dir).map_err(VolumeError::unwritable(dir))?;
    let target = target_dir.join("member");
    std::fs::rename(&member, &target).map_err(VolumeError::unwritable(dir))?;
    // Both ends of the rename: `member/` gone from the data directory, arrived aside.
    for synced in [dir, target_dir.as_path()] {
        std::fs::File::open(synced)
            .and_then(|d| d.sync_all())
            .map_err(VolumeError::unwritable(synced))?;
    }
    Ok(Some(target))
}

/// The file inside a copy's directory naming what it was copied for.
const COPIED_FOR: &str = "copied-for";

/// Copies `member/` (WAL, snapshots, our files) to `set-aside/<stamp>-<why>/member`, once
/// for `tag`: when a copy for `tag` already exists it is returned and nothing is copied.
/// The copy is made under `set-aside/.<why>-<tag>.partial` (a copy killed midway is copied
/// over when run again), fsynced, and renamed into place last. `None` without `member/`.
pub fn copy_aside(
    dir: &Path,
    why: &str,
    tag: &str,
    stamp: u64,
) -> Result<Option<(PathBuf, bool)>, VolumeError> {
    let member = member_dir(dir);
    if !member.exists() {
        return Ok(None);
    }
    let root = dir.join("set-aside");
    if let Some(done) = find_copy(&root, why, tag) {
        return Ok(Some((done.join("member"), false)));
    }
    let unwritable = VolumeError::unwritable(dir);
    let partial = root.join(format!(".{why}-{}.partial", slug(tag)));
    let copy = || -> std::io::Result<PathBuf> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&partial)?;
        copy_tree(&member, &partial.join("member"), Path::new(""))?;
        let mut f = std::fs::File::create(partial.join(COPIED_FOR))?;
        f.write_all(tag.as_bytes())?;
        f.sync_all()?;
        std::fs::File::open(&partial)?.sync_all()?;
        let target = root.join(format!("{stamp}-{why}"));
        std::fs::rename(&partial, &target)?;
        std::fs::File::open(&root)?.sync_all()?;
        Ok(target.join("member"))
    };
    copy().map(|to| Some((to, true))).map_err(|e| {
        // A copy that failed (the volume full, most often) is removed, or it would hold the
        // room the next attempt, and etcd itself, need: it is only a copy of `member/`,
        // which stays in place untouched.
        if let Err(left) = std::fs::remove_dir_all(&partial) {
            tracing::warn!(partial = %partial.display(), error = %left, "the failed copy aside could not be removed");
        }
        unwritable(e)
    })
}

/// Whether `rel` (a path inside `member/`) is a WAL segment etcd preallocated and has not
/// written yet (`wal/<n>.tmp`): it holds no entry, and copying it could fill the volume.
fn is_preallocated_wal(rel: &Path) -> bool {
    rel.parent() == Some(Path::new("wal")) && rel.extension().is_some_and(|e| e == "tmp")
}

/// The copy made for `tag` (`set-aside/<stamp>-<why>/` holding `copied-for` = `tag`).
fn find_copy(root: &Path, why: &str, tag: &str) -> Option<PathBuf> {
    let suffix = format!("-{why}");
    std::fs::read_dir(root)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(&suffix) && !n.starts_with('.'))
        })
        .find(|p| std::fs::read(p.join(COPIED_FOR)).is_ok_and(|b| b == tag.as_bytes()))
}

/// `tag` with only the characters a file name may safely hold.
fn slug(tag: &str) -> String {
    tag.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Copies the directory tree `from` (at `rel` inside `member/`) into `to` (files fsynced;
/// symlinks copied as links; etcd's preallocated WAL segments left out).
fn copy_tree(from: &Path, to: &Path, rel: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let rel = rel.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&src, &dst, &rel)?;
        } else if is_preallocated_wal(&rel) {
            continue;
        } else if kind.is_symlink() {
            if std::fs::symlink_metadata(&dst).is_err() {
                std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
            }
        } else {
            std::fs::copy(&src, &dst)?;
            std::fs::File::open(&dst)?.sync_all()?;
        }
    }
    std::fs::File::open(to)?.sync_all()
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
    fn unreadable_leave_and_restore_markers_are_named_never_read_as_absent(
    ) -> Result<(), VolumeError> {
        let tmp = temp_with_wal(5, 6)?;
        let steward = tmp.path().join("member/steward");
        std::fs::create_dir_all(&steward).ok();
        std::fs::write(tmp.path().join("steward-left.json"), b"{\"ts\":").ok();
        std::fs::write(steward.join("restored-for.json"), b"not json").ok();
        let state = inspect(tmp.path())?;
        assert_eq!(state.left, None);
        assert_eq!(state.restored_for, None);
        assert_eq!(
            state.unreadable_markers.len(),
            2,
            "{:?}",
            state.unreadable_markers
        );
        assert!(state.unreadable_markers[0].starts_with("restore marker "));
        assert!(state.unreadable_markers[0].contains("restored-for.json"));
        assert!(state.unreadable_markers[1].starts_with("leave marker "));
        assert!(state.unreadable_markers[1].contains("steward-left.json"));
        // Readable markers are read, and nothing is unreadable.
        std::fs::write(
            tmp.path().join("steward-left.json"),
            br#"{"ts":1,"member_id":"a1"}"#,
        )
        .ok();
        std::fs::write(steward.join("restored-for.json"), br#""restore-1""#).ok();
        let state = inspect(tmp.path())?;
        assert!(
            state.unreadable_markers.is_empty(),
            "{:?}",
            state.unreadable_markers
        );
        assert_eq!(state.restored_for.as_deref(), Some("restore-1"));
        assert_eq!(state.left.map(|l| l.member_id), Some(0xa1));
        Ok(())
    }

    /// Each of the agent's own records, torn (JSON cut short, as by a crash mid-write) or
    /// garbage, or unreadable (a directory in its place), is named in `unreadable_markers`
    /// with its file: never read as absent.
    #[test]
    fn every_torn_or_garbled_marker_and_the_journal_are_named_never_read_as_absent(
    ) -> Result<(), VolumeError> {
        let tmp = temp_with_wal(5, 6)?;
        let steward = tmp.path().join("member/steward");
        std::fs::create_dir_all(&steward).ok();
        let records = [
            (
                "formation marker ",
                "formation.json",
                r#"{"nonce":"n","initial_cluster":"a=b"}"#,
            ),
            (
                "recovery marker ",
                "recovery.json",
                r#"{"id":"r1","commit":9}"#,
            ),
            (
                "list of rejected snapshots ",
                "rejected-snapshots.json",
                "[]",
            ),
            (
                "decision journal ",
                "decisions.jsonl",
                "{\"ts\":1,\"action\":\"recover\"}\n",
            ),
        ];
        for (what, file, whole) in records {
            let path = steward.join(file);
            // Whole: read, nothing unreadable.
            std::fs::write(&path, whole).ok();
            let state = inspect(tmp.path())?;
            assert!(
                state.unreadable_markers.is_empty(),
                "{file}: {:?}",
                state.unreadable_markers
            );
            let torn = &whole[..whole.len() / 2];
            let garbage = "\u{0}\u{0}not json at all\n";
            for broken in [torn, garbage] {
                if file == "decisions.jsonl" && broken == torn {
                    // The journal's torn *last* line is an append that never returned:
                    // skipped (journal::tests); torn anywhere else, it is garbage.
                    std::fs::write(&path, format!("{torn}\n{whole}")).ok();
                } else {
                    std::fs::write(&path, broken).ok();
                }
                let state = inspect(tmp.path())?;
                assert_eq!(
                    state.unreadable_markers.len(),
                    1,
                    "{file}: {:?}",
                    state.unreadable_markers
                );
                let named = &state.unreadable_markers[0];
                assert!(named.starts_with(what) && named.contains(file), "{named}");
            }
            // Not a file at all (an I/O error reading it).
            std::fs::remove_file(&path).ok();
            std::fs::create_dir(&path).ok();
            let state = inspect(tmp.path())?;
            assert_eq!(
                state.unreadable_markers.len(),
                1,
                "{file}: {:?}",
                state.unreadable_markers
            );
            assert!(state.unreadable_markers[0].contains(file));
            std::fs::remove_dir(&path).ok();
        }
        let state = inspect(tmp.path())?;
        assert!(
            state.unreadable_markers.is_empty(),
            "{:?}",
            state.unreadable_markers
        );
        assert_eq!(state.formation, None);
        assert_eq!(state.recovery, None);
        Ok(())
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
    fn a_copy_aside_keeps_the_data_in_place_and_is_made_once_per_tag() -> Result<(), VolumeError> {
        let tmp = temp_with_wal(5, 6)?;
        let wal = "wal/0000000000000000-0000000000000000.wal";
        // A copy killed midway left a partial directory: it is copied over, not kept apart.
        let partial = tmp
            .path()
            .join("set-aside/.before-recovery-r_1.partial/member");
        std::fs::create_dir_all(partial.join("wal")).ok();
        std::fs::write(partial.join(wal), b"torn").ok();
        let made = copy_aside(tmp.path(), "before-recovery", "r/1", 42)?;
        let expected = tmp.path().join("set-aside/42-before-recovery/member");
        assert_eq!(made, Some((expected.clone(), true)));
        assert_eq!(
            std::fs::read(expected.join(wal)).ok(),
            std::fs::read(tmp.path().join("member").join(wal)).ok()
        );
        assert!(inspect(tmp.path())?.has_data(), "a copy, not a rename");
        assert!(!partial.exists());
        // Run again for the same recovery (later): the copy is found, nothing is copied.
        assert_eq!(
            copy_aside(tmp.path(), "before-recovery", "r/1", 43)?,
            Some((expected, false))
        );
        assert!(!tmp.path().join("set-aside/43-before-recovery").exists());
        // Another recovery gets its own copy.
        let other = copy_aside(tmp.path(), "before-recovery", "r2", 44)?;
        assert_eq!(other.map(|(_, new)| new), Some(true));
        Ok(())
    }

    #[test]
    fn a_copy_aside_leaves_out_the_preallocated_wal_segment() -> Result<(), VolumeError> {
        let tmp = temp_with_wal(5, 6)?;
        let wal = tmp.path().join("member/wal");
        std::fs::write(wal.join("0.tmp"), vec![0u8; 4096]).ok();
        std::fs::create_dir_all(tmp.path().join("member/snap")).ok();
        std::fs::write(tmp.path().join("member/snap/db"), b"bolt").ok();
        let made = copy_aside(tmp.path(), "before-recovery", "r1", 42)?;
        let copy = tmp.path().join("set-aside/42-before-recovery/member");
        assert_eq!(made, Some((copy.clone(), true)));
        assert!(copy
            .join("wal/0000000000000000-0000000000000000.wal")
            .exists());
        assert!(copy.join("snap/db").exists());
        assert!(!copy.join("wal/0.tmp").exists(), "no room spent on zeros");
        assert!(wal.join("0.tmp").exists(), "the original is untouched");
        Ok(())
    }

    #[test]
    fn a_copy_aside_that_fails_leaves_no_partial_copy_behind() -> Result<(), VolumeError> {
        let tmp = temp_with_wal(5, 6)?;
        // The copy cannot be made: a file stands where its `member/` directory goes.
        let partial = tmp.path().join("set-aside/.before-recovery-r1.partial");
        std::fs::create_dir_all(&partial).ok();
        std::fs::write(partial.join("member"), b"in the way").ok();
        assert!(copy_aside(tmp.path(), "before-recovery", "r1", 42).is_err());
        assert!(!partial.exists(), "the failed copy still holds room");
        assert!(inspect(tmp.path())?.has_data(), "member/ stays in place");
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
