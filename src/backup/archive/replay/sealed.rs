//! A restore point's file made without a throw-away etcd: a copy of the snapshot with the
//! archive written into it ([`super::direct`]) or, for a restore that marks every earlier
//! revision compacted, a new file holding each touched key's last write only
//! ([`super::latest`]); then **checked** — every page of its `key` and `lease` buckets
//! walked, the `key` bucket's revisions strictly increasing and ending at the last
//! replayed revision, as many entries as were kept of the snapshot's plus the replayed
//! ones written — and **sealed** as etcd seals a snapshot: cut at its last page, its
//! SHA-256 appended, which the restore's `snapshot restore` checks again.
//!
//! What this leaves out, the drill proves: every periodic archive drill replays the same
//! way, then starts etcd on the result and compares its `HashKV` with the live cluster's.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::direct::{self, Unfit};
use super::encode::main_of;
use super::{io, History, ReplayError, Replayed, Target};
use crate::backup::archive::SegmentManifest;
use crate::backup::bolt::{BoltError, Db, Root};
use crate::backup::store::Store;

/// etcd's snapshot trailer: the SHA-256 of the database before it.
const TRAILER: usize = 32;

/// The snapshot a restore point is made from, and what its file keeps.
#[derive(Debug, Clone, Copy)]
pub(super) struct File<'a> {
    /// The verified snapshot file.
    pub snapshot: &'a Path,
    pub name: &'a str,
    pub history: History,
}

/// Replays `segments` onto `file`'s snapshot up to `target` into `out`, in `work`.
/// `Ok(Err(_))`: the file could not take them or failed its check; nothing is at `out`.
pub(super) async fn fold(
    store: &Store,
    file: File<'_>,
    segments: &[SegmentManifest],
    target: Target,
    work: &Path,
    out: &Path,
) -> Result<Result<Replayed, Unfit>, ReplayError> {
    if work.exists() {
        std::fs::remove_dir_all(work).map_err(io("remove", work))?;
    }
    crate::backup::scratch::create_private_dir(work).map_err(io("create", work))?;
    let db = work.join("db");
    let copy = || {
        let (from, to) = (file.snapshot.to_path_buf(), db.clone());
        blocking(move || std::fs::copy(&from, &to).map_err(io("copy", &from)))
    };
    let current = match direct::file_revision(file.snapshot) {
        Ok(r) => r,
        Err(unfit) => return Ok(Err(unfit)),
    };
    let mut done = Replayed::from_snapshot(file.name, current, super::Finish::SnapshotTo(out));
    let write = match file.history {
        History::Full => {
            copy().await??;
            direct::append(&db)
        }
        History::Latest => super::latest::write(file.snapshot, &db),
    };
    let kept = work.join("segments");
    let appended =
        match direct::replay_into(store, write, current, segments, target, &kept, &mut done).await?
        {
            Ok(a) => a,
            Err(unfit) => return Ok(Err(unfit)),
        };
    if appended.is_none() && file.history == History::Latest {
        copy().await??;
    }
    done.method = super::Method::File;
    done.history = file.history;
    let expected = appended.map(|a| (a.before + a.added, done.last_revision));
    let sealing = std::time::Instant::now();
    let sealed = {
        let db = db.clone();
        blocking(move || seal(&db, expected)).await?
    };
    if let Err(unfit) = sealed {
        return Ok(Err(unfit));
    }
    done.sealing = sealing.elapsed();
    std::fs::rename(&db, out).map_err(io("rename", out))?;
    let _ = std::fs::remove_dir_all(work);
    Ok(Ok(done))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ReplayError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ReplayError::Snapshot {
            detail: format!("the file's writer stopped: {e}"),
        })
}

/// The `key` bucket's entries and the main revision of its last, walking every page.
fn count(db: &Path) -> Result<(u64, i64), BoltError> {
    let db = Db::open(db)?;
    let root = db
        .bucket(b"key")?
        .map(|b| b.root)
        .unwrap_or(Root::Inline(Vec::new()));
    let mut n = 0u64;
    let mut last: Option<Vec<u8>> = None;
    let mut bad = None;
    db.for_each(&root, &mut |_, k, _| {
        if main_of(k).is_none() || last.as_deref().is_some_and(|l| l >= k) {
            bad.get_or_insert_with(|| {
                format!("key bucket entry {k:?} is out of order or not a revision")
            });
        }
        last = Some(k.to_vec());
        n += 1;
        Ok(())
    })?;
    if let Some(what) = bad {
        return Err(BoltError::Unexpected {
            path: PathBuf::from(db.path()),
            what,
        });
    }
    if let Some(lease) = db.bucket(b"lease")? {
        db.for_each(&lease.root, &mut |_, _, _| Ok(()))?;
    }
    Ok((n, last.and_then(|k| main_of(&k)).map_or(0, |(m, _)| m)))
}

/// Checks the written file (`expected`: its entries and last revision, when the replay
/// wrote any), cuts it at its last page and appends its SHA-256.
fn seal(db: &Path, expected: Option<(u64, i64)>) -> Result<(), Unfit> {
    let (entries, last) = count(db)?;
    if let Some((n, r)) = expected.filter(|e| *e != (entries, last)) {
        return Err(Unfit(format!(
            "the written file's key bucket holds {entries} entries up to revision {last}, not {n} up to {r}"
        )));
    }
    let len = {
        let d = Db::open(db)?;
        d.meta.pgid * d.page_size() as u64
    };
    let failed = |e: std::io::Error| Unfit(format!("sealing {db:?}: {e}"));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(db)
        .map_err(failed)?;
    file.set_len(len).map_err(failed)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(failed)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    let digest = hash.finalize();
    file.write_all(&digest[..TRAILER]).map_err(failed)?;
    file.sync_all().map_err(failed)
}
