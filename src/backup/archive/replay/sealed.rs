//! A restore point's file made without a throw-away etcd: a copy of the snapshot with the
//! archive written into it ([`super::direct`]) or, for a restore that marks every earlier
//! revision compacted, a new file holding each touched key's last write only
//! ([`super::latest`]); then **checked** — every page of its `key` and `lease` buckets
//! walked, the `key` bucket's revisions strictly increasing and ending at the last
//! replayed revision, as many entries as were kept of the snapshot's plus the replayed
//! ones written, its `lease` bucket the snapshot's plus every lease the archive names at
//! its archived TTL and each replayed put on the lease the archive says
//! ([`super::lease_history`]) — and **sealed** as etcd seals a snapshot: cut at its last page, its
//! SHA-256 appended, which the restore's `snapshot restore` checks again.
//!
//! What this leaves out, the drill proves: every periodic archive drill replays the same
//! way, then starts etcd on the result and compares its `HashKV` with the live cluster's.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::direct::{self, Unfit};
use super::encode::{main_of, read_key_lease, read_lease_value, sub_of};
use super::lease_history::LeaseHistory;
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
    let expected = appended.map(|(a, history)| Expected {
        entries: a.before + a.added,
        last: done.last_revision,
        leases: Leases {
            history,
            snapshot: file.snapshot.to_path_buf(),
            above: current,
            upto: done.last_revision,
        },
    });
    let sealing = std::time::Instant::now();
    let sealed = {
        let db = db.clone();
        blocking(move || seal(&db, expected.as_ref())).await?
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

/// What the written file must hold, when the replay wrote any revision.
struct Expected {
    /// The `key` bucket's entries, and the main revision of its last.
    entries: u64,
    last: i64,
    leases: Leases,
}

/// What the written file's leases are compared with.
struct Leases {
    /// The archive's leases of the replayed revisions.
    history: LeaseHistory,
    /// The snapshot's file: its `lease` bucket is kept as it is.
    snapshot: PathBuf,
    /// The snapshot's revision: every entry above it was replayed.
    above: i64,
    /// The last revision replayed.
    upto: i64,
}

/// A bucket's lease entries: key → (ID, granted TTL).
fn lease_bucket(db: &Db) -> Result<BTreeMap<Vec<u8>, (i64, i64)>, BoltError> {
    let mut out = BTreeMap::new();
    let Some(lease) = db.bucket(b"lease")? else {
        return Ok(out);
    };
    let mut bad = None;
    db.for_each(&lease.root, &mut |_, k, v| {
        match read_lease_value(v) {
            Some(l) => {
                out.insert(k.to_vec(), l);
            }
            None => {
                bad.get_or_insert_with(|| format!("lease bucket entry {k:?} does not decode"));
            }
        }
        Ok(())
    })?;
    match bad {
        Some(what) => Err(BoltError::Unexpected {
            path: PathBuf::from(db.path()),
            what,
        }),
        None => Ok(out),
    }
}

/// Walks every page of the written file's `key` and `lease` buckets: the `key` bucket's
/// entries and the main revision of its last, and (with `leases`) the first way its
/// leases differ from the archive's.
fn count(db: &Path, leases: Option<&Leases>) -> Result<(u64, i64, Option<String>), BoltError> {
    let db = Db::open(db)?;
    let root = db
        .bucket(b"key")?
        .map(|b| b.root)
        .unwrap_or(Root::Inline(Vec::new()));
    let mut n = 0u64;
    let mut last: Option<Vec<u8>> = None;
    let mut bad = None;
    let mut differs = None;
    db.for_each(&root, &mut |_, k, v| {
        if main_of(k).is_none() || last.as_deref().is_some_and(|l| l >= k) {
            bad.get_or_insert_with(|| {
                format!("key bucket entry {k:?} is out of order or not a revision")
            });
        }
        if let (Some(l), Some((main, _)), Some(sub)) = (leases, main_of(k), sub_of(k)) {
            if main > l.above && differs.is_none() {
                differs = match read_key_lease(v) {
                    None => Some(format!("the value at revision key {k:?} does not decode")),
                    Some(lease) => l
                        .history
                        .compare_attached(main, sub, lease)
                        .err()
                        .map(|m| m.to_string()),
                };
            }
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
    let held = lease_bucket(&db)?;
    let last = last.and_then(|k| main_of(&k)).map_or(0, |(m, _)| m);
    if let (Some(l), None) = (leases, &differs) {
        let snapshot: BTreeMap<i64, i64> = lease_bucket(&Db::open(&l.snapshot)?)?
            .into_values()
            .collect();
        differs = l
            .history
            .compare_bucket(&snapshot, &held, l.upto)
            .err()
            .map(|m| m.to_string());
    }
    Ok((n, last, differs))
}

/// Checks the written file (`expected`: its entries, last revision and leases, when the
/// replay wrote any), cuts it at its last page and appends its SHA-256.
fn seal(db: &Path, expected: Option<&Expected>) -> Result<(), Unfit> {
    let (entries, last, differs) = count(db, expected.map(|e| &e.leases))?;
    if let Some(e) = expected.filter(|e| (e.entries, e.last) != (entries, last)) {
        return Err(Unfit(format!(
            "the written file's key bucket holds {entries} entries up to revision {last}, not {} up to {}",
            e.entries, e.last
        )));
    }
    if let Some(why) = differs {
        return Err(Unfit(format!(
            "the written file's leases are not the archive's: {why}"
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::encode::{key_value, lease_value, revision_key, Live};
    use super::*;
    use crate::backup::archive::segment::{Op, Revision};
    use crate::backup::bolt::page::{self, LeafEntry, Meta, BUCKET_FLAG};

    /// A bolt file at `path` holding a `key` bucket of `keys` and a `lease` bucket of
    /// `leases` (ID, TTL), written as the replay writes its files.
    fn file(path: &Path, keys: &[(i64, i64, &str, i64)], leases: &[(i64, i64)]) {
        let like = Meta {
            page_size: 4096,
            flags: 0,
            root: 0,
            sequence: 0,
            freelist: 0,
            pgid: 0,
            txid: 0,
        };
        let mut db = Db::create(path, &like).unwrap();
        let mut append = db.append().unwrap();
        let live = Live {
            create: 1,
            version: 1,
        };
        let keys = keys
            .iter()
            .map(|(main, sub, key, lease)| LeafEntry {
                flags: 0,
                key: revision_key(*main, *sub, false),
                value: key_value(key.as_bytes(), live, *main, b"v", *lease),
            })
            .collect();
        let leases = leases
            .iter()
            .map(|(id, ttl)| LeafEntry {
                flags: 0,
                key: id.to_be_bytes().to_vec(),
                value: lease_value(*id, *ttl),
            })
            .collect();
        let key_root = append.rebuild(keys).unwrap();
        let lease_root = append.rebuild(leases).unwrap();
        let bucket = |name: &[u8], root| LeafEntry {
            flags: BUCKET_FLAG,
            key: name.to_vec(),
            value: page::bucket_value_of(root, 0),
        };
        let root = append
            .rebuild(vec![bucket(b"key", key_root), bucket(b"lease", lease_root)])
            .unwrap();
        append.commit(root).unwrap();
    }

    /// A snapshot at revision 10 holding lease 3 (TTL 90) and key k on it; the archive's
    /// revision 11 puts a on lease 7 (TTL 30) and b on none.
    fn sealed_with(
        dir: &Path,
        keys: &[(i64, i64, &str, i64)],
        leases: &[(i64, i64)],
    ) -> Result<(), Unfit> {
        let snapshot = dir.join("snapshot.db");
        let _ = std::fs::remove_file(&snapshot);
        file(&snapshot, &[(10, 0, "k", 3)], &[(3, 90)]);
        let written = dir.join("written.db");
        let _ = std::fs::remove_file(&written);
        file(&written, keys, leases);
        let mut history = LeaseHistory::default();
        let put = |key: &str, lease| Op::Put {
            key: key.into(),
            value: b"v".to_vec(),
            lease,
        };
        history.record(
            &Revision {
                revision: 11,
                time_unix_ms: 0,
                ops: vec![put("a", 7), put("b", 0)],
            },
            &BTreeMap::from([(7, 30)]),
        );
        let expected = Expected {
            entries: keys.len() as u64,
            last: 11,
            leases: Leases {
                history,
                snapshot,
                above: 10,
                upto: 11,
            },
        };
        seal(&written, Some(&expected))
    }

    const KEYS: &[(i64, i64, &str, i64)] = &[(10, 0, "k", 3), (11, 0, "a", 7), (11, 1, "b", 0)];

    #[test]
    fn a_written_file_holding_every_archived_lease_at_its_ttl_is_sealed() {
        let dir = tempfile::tempdir().unwrap();
        sealed_with(dir.path(), KEYS, &[(3, 90), (7, 30)]).unwrap();
    }

    #[test]
    fn a_written_file_that_dropped_an_archived_lease_fails_its_seal_naming_the_lease() {
        let dir = tempfile::tempdir().unwrap();
        let Unfit(why) = sealed_with(dir.path(), KEYS, &[(3, 90)]).unwrap_err();
        assert!(
            why.contains(
                "lease 7 (named by archived revision 11, TTL 30 s) is not in the written file"
            ),
            "{why}"
        );
        // Every lease dropped, the snapshot's too.
        let Unfit(why) = sealed_with(dir.path(), KEYS, &[]).unwrap_err();
        assert!(why.contains("lease 3 (held by the snapshot"), "{why}");
    }

    #[test]
    fn a_written_file_that_granted_an_archived_lease_another_ttl_fails_its_seal() {
        let dir = tempfile::tempdir().unwrap();
        let Unfit(why) = sealed_with(dir.path(), KEYS, &[(3, 90), (7, 60)]).unwrap_err();
        assert!(
            why.contains("lease 7 (named by archived revision 11) has a granted TTL of 60 s in the written file, 30 s in the archive"),
            "{why}"
        );
    }

    #[test]
    fn a_written_put_not_on_its_archived_lease_fails_its_seal_naming_the_revision() {
        let dir = tempfile::tempdir().unwrap();
        let keys = &[(10, 0, "k", 3), (11, 0, "a", 0), (11, 1, "b", 0)];
        let Unfit(why) = sealed_with(dir.path(), keys, &[(3, 90), (7, 30)]).unwrap_err();
        assert!(
            why.contains("revision 11 (change 0) is attached to no lease in the written file, to lease 7 in the archive"),
            "{why}"
        );
        // The snapshot's own entries are not the replay's: not compared.
        let keys = &[(10, 0, "k", 0), (11, 0, "a", 7), (11, 1, "b", 0)];
        sealed_with(dir.path(), keys, &[(3, 90), (7, 30)]).unwrap();
    }
}
