//! The `HashKV` of a member's database file, computed offline (issue 27): for a member
//! whose etcd does not run (it refuses to start on data that differs from its peers'), so
//! that its data can still be judged against the majority's. The file is copied while no
//! etcd holds it (etcd's bbolt takes an exclusive `flock` on it: while the copy holds that
//! lock, etcd cannot open the file, and a file etcd holds is not copied), then restored
//! into the scratch space as the drill restores a snapshot (`--skip-hash-check`: a database
//! file has no SHA-256 trailer; never a revision jump), served by a throw-away etcd on
//! loopback, and asked its `HashKV` at its own revision. The volume itself is only read.

use std::path::{Path, PathBuf};

use super::drill::{ask_restored, DrillSetup};
use super::scratch::{create_private_dir, Scratch};
use super::snapshot::SnapshotSource;

/// What the member's database file answers, offline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfflineHash {
    /// The revision the file holds (its newest applied).
    pub revision: i64,
    pub hash: u32,
    pub compact_revision: i64,
}

/// Where a database file stands, to tell whether it changed since it was hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub len: u64,
    pub modified: Option<std::time::SystemTime>,
}

/// The database file of the data directory `data_dir`.
pub fn db_file(data_dir: &Path) -> PathBuf {
    data_dir.join("member").join("snap").join("db")
}

/// The fingerprint of `db` as it is now (`None`: no such file).
pub fn fingerprint(db: &Path) -> Option<Fingerprint> {
    let m = std::fs::metadata(db).ok()?;
    Some(Fingerprint {
        len: m.len(),
        modified: m.modified().ok(),
    })
}

/// The scratch directory the offline hash uses (emptied before and after each use).
pub fn work_dir(scratch: &Path) -> PathBuf {
    scratch.join("offline-hash")
}

/// `HashKV` of the database file `db` at its own revision, computed in a throw-away etcd;
/// with the fingerprint of the file copied. Refused while an etcd holds the file.
pub async fn hash_db_file(
    setup: &DrillSetup,
    db: &Path,
) -> Result<(OfflineHash, Fingerprint), String> {
    let work = work_dir(&setup.scratch_dir);
    if work.exists() {
        std::fs::remove_dir_all(&work)
            .map_err(|e| format!("cannot empty the scratch directory {work:?}: {e}"))?;
    }
    create_private_dir(&work)
        .map_err(|e| format!("cannot create the scratch directory {work:?}: {e}"))?;
    let result = hash_in(setup, db, &work).await;
    let _ = std::fs::remove_dir_all(&work);
    result
}

async fn hash_in(
    setup: &DrillSetup,
    db: &Path,
    work: &Path,
) -> Result<(OfflineHash, Fingerprint), String> {
    let copy = work.join("db");
    let (from, to) = (db.to_path_buf(), copy.clone());
    let copied = tokio::task::spawn_blocking(move || copy_unheld(&from, &to))
        .await
        .map_err(|e| format!("the copy ended abnormally: {e}"))??;
    let scratch = Scratch::new("offline-hash", "offline-hash")
        .map_err(|e| format!("no free port for the throw-away etcd: {e}"))?;
    let data = work.join("data");
    setup
        .tool
        .restore_db_file(&copy, &scratch.member, &data)
        .await
        .map_err(|e| format!("the copy of {db:?} does not restore: {e}"))?;
    let mut etcd = scratch
        .spawn(&setup.etcd_bin, &data, &[], None)
        .map_err(|e| format!("cannot start {:?}: {e}", setup.etcd_bin))?;
    let answer = ask_restored(scratch.client_port, setup, |src| async move {
        let revision = src.info().await?.revision;
        let h = src.hash_kv(revision).await?;
        Ok(OfflineHash {
            revision,
            hash: h.hash,
            compact_revision: h.compact_revision,
        })
    })
    .await;
    let _ = etcd.kill().await;
    answer
        .map(|h| (h, copied))
        .map_err(|e| format!("the throw-away etcd on the copy of {db:?} did not answer: {e}"))
}

/// Copies `db` to `to` while holding its exclusive lock (etcd holds it while it runs).
fn copy_unheld(db: &Path, to: &Path) -> Result<Fingerprint, String> {
    let mut file = std::fs::File::open(db).map_err(|e| format!("cannot open {db:?}: {e}"))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(format!(
                "{db:?} is held by a running etcd: it is not copied while etcd may write it"
            ))
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(format!("cannot lock {db:?}: {e}")),
    }
    let seen = fingerprint(db).ok_or_else(|| format!("{db:?} is gone"))?;
    let mut out = std::fs::File::create(to).map_err(|e| format!("cannot create {to:?}: {e}"))?;
    std::io::copy(&mut file, &mut out).map_err(|e| format!("cannot copy {db:?}: {e}"))?;
    out.sync_all()
        .map_err(|e| format!("cannot sync {to:?}: {e}"))?;
    // The lock goes with the file handle.
    drop(file);
    Ok(seen)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_database_file_held_by_a_running_etcd_is_not_copied() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        std::fs::write(&db, b"bbolt pages").unwrap();
        let holder = std::fs::File::open(&db).unwrap();
        holder.lock().unwrap();
        let err = copy_unheld(&db, &dir.path().join("copy")).unwrap_err();
        assert!(err.contains("held by a running etcd"), "{err}");
        assert!(!dir.path().join("copy").exists());
        drop(holder);
        let f = copy_unheld(&db, &dir.path().join("copy")).unwrap();
        assert_eq!(f.len, 11);
        assert_eq!(
            std::fs::read(dir.path().join("copy")).unwrap(),
            b"bbolt pages"
        );
    }
}
