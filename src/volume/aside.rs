//! The copies under `set-aside/` (`<unix-time>-<why>/member`, what `init`, `leave`, a restore
//! or a recovery renamed aside rather than delete): listed with why, the sentence the journal
//! gave, size and age ([`list`]); removed only when an operator names one ([`remove`], behind
//! `etcd-steward set-aside --remove NAME --yes`). Nothing here removes anything on its own.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{journal, VolumeError};

/// One copy under `set-aside/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Copy {
    /// The directory's name under `set-aside/` (what `--remove` takes).
    pub name: String,
    /// The reason's slug from the name (`removed-member`, `left`, `before-recovery`, …).
    pub why: String,
    /// When it was set aside (Unix seconds, from the name).
    pub at_unix: Option<u64>,
    /// The sentence `init` logged for it, when the volume's journal still has it.
    pub reason: Option<String>,
    /// Bytes of its files.
    pub bytes: u64,
    /// Whether it holds a WAL (etcd data), not only etcd-steward's own files.
    pub holds_wal: bool,
}

fn root(dir: &Path) -> PathBuf {
    dir.join("set-aside")
}

fn unreadable(path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Unreadable {
        path: path.to_path_buf(),
        source,
    }
}

/// Bytes under `path` (files only; symlinks not followed).
fn size_of(path: &Path) -> Result<u64, VolumeError> {
    let meta = std::fs::symlink_metadata(path).map_err(unreadable(path))?;
    if !meta.is_dir() {
        return Ok(meta.len());
    }
    let mut total = 0;
    for e in std::fs::read_dir(path).map_err(unreadable(path))? {
        total += size_of(&e.map_err(unreadable(path))?.path())?;
    }
    Ok(total)
}

/// Every copy under `set-aside/`, oldest first (a copy made midway and not finished,
/// `.<why>-<tag>.partial`, is not listed: `init` finishes or redoes it). None without the
/// directory.
pub fn list(dir: &Path) -> Result<Vec<Copy>, VolumeError> {
    let root = root(dir);
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(unreadable(&root)(e)),
    };
    // The journal's sentences, by where the data went; an unreadable journal only loses them.
    let reasons: Vec<(String, String)> = journal::read(dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.set_aside.map(|s| (s.to, e.reason)))
        .collect();
    let mut copies = Vec::new();
    for e in entries {
        let e = e.map_err(unreadable(&root))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !e.path().is_dir() {
            continue;
        }
        let (stamp, why) = name.split_once('-').unwrap_or(("", name.as_str()));
        let to = format!("set-aside/{name}/member");
        copies.push(Copy {
            reason: reasons
                .iter()
                .rev()
                .find(|(t, _)| *t == to)
                .map(|(_, r)| r.clone()),
            why: why.to_string(),
            at_unix: stamp.parse().ok(),
            bytes: size_of(&e.path())?,
            holds_wal: super::has_data(&e.path()).unwrap_or(false),
            name,
        });
    }
    copies.sort_by(|a, b| (a.at_unix, &a.name).cmp(&(b.at_unix, &b.name)));
    Ok(copies)
}

/// Why a copy may not be removed by that name, if it may not: only a name [`list`] shows
/// (no path, no `..`, not a partial copy).
pub fn check_name(copies: &[Copy], name: &str) -> Result<(), String> {
    if copies.iter().any(|c| c.name == name) {
        return Ok(());
    }
    let known: Vec<&str> = copies.iter().map(|c| c.name.as_str()).collect();
    Err(format!(
        "no copy named {name:?} under set-aside/ (copies: {}); `etcd-steward set-aside --list` shows them",
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    ))
}

/// Removes the copy `name` (checked with [`check_name`] first) and returns its path. The
/// directory is renamed to a hidden name before it is emptied, so a removal killed midway
/// leaves no half copy that looks whole; run again, it finishes.
pub fn remove(dir: &Path, name: &str) -> Result<Result<PathBuf, String>, VolumeError> {
    let root = root(dir);
    let doomed = root.join(format!(".removing-{name}"));
    let copies = list(dir)?;
    if let Err(why) = check_name(&copies, name) {
        // A removal killed after its rename: finish it.
        if doomed.is_dir() {
            std::fs::remove_dir_all(&doomed).map_err(VolumeError::unwritable(dir))?;
            return Ok(Ok(root.join(name)));
        }
        return Ok(Err(why));
    }
    let path = root.join(name);
    let synced = || {
        std::fs::File::open(&root)
            .and_then(|d| d.sync_all())
            .map_err(VolumeError::unwritable(dir))
    };
    std::fs::rename(&path, &doomed).map_err(VolumeError::unwritable(dir))?;
    synced()?;
    std::fs::remove_dir_all(&doomed).map_err(VolumeError::unwritable(dir))?;
    synced()?;
    Ok(Ok(path))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn copy_at(dir: &Path, name: &str, bytes: usize) {
        let wal = dir.join("set-aside").join(name).join("member/wal");
        std::fs::create_dir_all(&wal).unwrap();
        std::fs::write(
            wal.join("0000000000000000-0000000000000000.wal"),
            vec![0u8; bytes],
        )
        .unwrap();
    }

    #[test]
    fn the_copies_are_listed_oldest_first_with_their_size_and_why() {
        let dir = tempfile::tempdir().unwrap();
        copy_at(dir.path(), "200-left", 10);
        copy_at(dir.path(), "100-removed-member", 5);
        std::fs::create_dir_all(dir.path().join("set-aside/.before-recovery-x.partial")).unwrap();
        let copies = list(dir.path()).unwrap();
        let names: Vec<_> = copies.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["100-removed-member", "200-left"]);
        assert_eq!(copies[0].why, "removed-member");
        assert_eq!(copies[0].at_unix, Some(100));
        assert_eq!(copies[1].bytes, 10);
        assert!(copies[1].holds_wal);
    }

    #[test]
    fn only_a_listed_name_is_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        copy_at(dir.path(), "100-left", 5);
        copy_at(dir.path(), "200-left", 5);
        std::fs::create_dir_all(dir.path().join("member/wal")).unwrap();
        for bad in ["../member", "100-left/member", "", ".", "300-left"] {
            let r = remove(dir.path(), bad).unwrap();
            assert!(r.is_err(), "{bad:?} was accepted");
        }
        assert_eq!(list(dir.path()).unwrap().len(), 2);
        assert!(dir.path().join("member/wal").is_dir());
        let gone = remove(dir.path(), "100-left").unwrap().unwrap();
        assert!(!gone.exists());
        let names: Vec<_> = list(dir.path())
            .unwrap()
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["200-left"]);
    }

    #[test]
    fn a_removal_killed_after_its_rename_is_finished_when_run_again() {
        let dir = tempfile::tempdir().unwrap();
        copy_at(dir.path(), "100-left", 5);
        let root = dir.path().join("set-aside");
        std::fs::rename(root.join("100-left"), root.join(".removing-100-left")).unwrap();
        assert!(
            list(dir.path()).unwrap().is_empty(),
            "a half-removed copy is not listed"
        );
        remove(dir.path(), "100-left").unwrap().unwrap();
        assert!(!root.join(".removing-100-left").exists());
    }
}
