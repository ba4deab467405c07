//! The replay written straight into a snapshot's database file: each archived revision
//! becomes the entries etcd itself would have written for it (etcd's `key` bucket:
//! revision `main_sub` → the key's `KeyValue`, a delete as a tombstone), appended after the
//! snapshot's ([`append`]) or, for a restore that marks earlier revisions compacted, only
//! each key's last write into a new file (`super::latest`); each lease a put names that
//! the file does not hold is added to its `lease` bucket with its archived TTL. No page in
//! use is written over ([`crate::backup::bolt`]).
//!
//! Two passes over the segments: the first fetches and checks each one (kept on the
//! scratch disk, compressed) and gathers the keys they touch and where each is last
//! written, so that one walk of the snapshot's `key` bucket learns each of those keys'
//! creation revision and version (`learn`); the second writes (`apply`).
//!
//! What each revision becomes ([`entries`]) and the snapshot's revision ([`revision_of`])
//! are pure; etcd's encodings are in [`super::encode`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::encode::{
    key_value, lease_value, main_of, read_key_value, revision_key, tombstone_value, Live,
};
use super::lease_history::LeaseHistory;
use super::plan::{leases_to_grant, step, EarlyStop, Step, Target};
use super::{io, ReplayError, Replayed};
use crate::backup::archive::segment::{Op, Revision};
use crate::backup::archive::{stored, SegmentManifest};
use crate::backup::bolt::page::LeafEntry;
use crate::backup::bolt::{BoltError, Db, Root};
use crate::backup::store::Store;

pub(super) const KEY_BUCKET: &[u8] = b"key";
pub(super) const LEASE_BUCKET: &[u8] = b"lease";
const META_BUCKET: &[u8] = b"meta";
const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";

/// Why the file cannot take the replay: the replay goes through etcd's API instead.
#[derive(Debug)]
pub struct Unfit(pub String);

impl From<BoltError> for Unfit {
    fn from(e: BoltError) -> Unfit {
        Unfit(e.to_string())
    }
}

/// A key the replay touches: its state (`None`: absent or deleted), and the revision and
/// change of its last write in the replay (what a file of last states keeps of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touched {
    pub live: Option<Live>,
    pub last: (i64, i64),
}

/// An entry etcd writes for a revision, and whether it is its key's last write in the
/// replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub leaf: LeafEntry,
    pub last: bool,
}

/// The entries etcd writes for archived revision `rev`, in order, given every touched key's
/// state before it, which it updates. A delete of a key that is not there is refused: etcd
/// would not have made a revision of it.
pub fn entries(
    rev: &Revision,
    state: &mut HashMap<Vec<u8>, Touched>,
) -> Result<Vec<Entry>, String> {
    let mut out = Vec::with_capacity(rev.ops.len());
    for (sub, op) in rev.ops.iter().enumerate() {
        let sub = sub as i64;
        let (Op::Put { key, .. } | Op::Delete { key }) = op;
        let slot = state
            .get_mut(key)
            .ok_or_else(|| format!("key {:?} was not gathered", String::from_utf8_lossy(key)))?;
        let last = slot.last == (rev.revision, sub);
        let leaf = match op {
            Op::Put { key, value, lease } => {
                let live = match slot.live {
                    Some(l) => Live {
                        create: l.create,
                        version: l.version + 1,
                    },
                    None => Live {
                        create: rev.revision,
                        version: 1,
                    },
                };
                slot.live = Some(live);
                LeafEntry {
                    flags: 0,
                    key: revision_key(rev.revision, sub, false),
                    value: key_value(key, live, rev.revision, value, *lease),
                }
            }
            Op::Delete { key } => {
                if slot.live.is_none() {
                    return Err(format!(
                        "archived revision {} deletes key {:?}, which the revisions before it do not hold",
                        rev.revision,
                        String::from_utf8_lossy(key)
                    ));
                }
                slot.live = None;
                LeafEntry {
                    flags: 0,
                    key: revision_key(rev.revision, sub, true),
                    value: tombstone_value(key),
                }
            }
        };
        out.push(Entry { leaf, last });
    }
    Ok(out)
}

/// The revision etcd serves from a file whose `key` bucket ends at `last_key` and whose
/// finished compaction is `compacted`: the higher of the two (a compaction can leave no
/// key at its own revision), and 1 for a store never written.
pub fn revision_of(last_key: Option<&[u8]>, compacted: Option<&[u8]>) -> i64 {
    let main = |k: Option<&[u8]>| k.and_then(main_of).map_or(0, |(m, _)| m);
    main(last_key).max(main(compacted)).max(1)
}

/// The revision the restored file at `db` holds.
pub fn file_revision(db: &Path) -> Result<i64, Unfit> {
    let db = Db::open(db)?;
    let keys = bucket(&db, KEY_BUCKET)?;
    let mut compacted = None;
    db.for_each(&bucket(&db, META_BUCKET)?, &mut |_, k, v| {
        if k == FINISHED_COMPACT {
            compacted = Some(v.to_vec());
        }
        Ok(())
    })?;
    Ok(revision_of(
        db.last_key(&keys)?.as_deref(),
        compacted.as_deref(),
    ))
}

pub(super) fn bucket(db: &Db, name: &[u8]) -> Result<Root, Unfit> {
    match db.bucket(name)? {
        Some(b) => Ok(b.root),
        None => Err(Unfit(format!(
            "the file has no {:?} bucket",
            String::from_utf8_lossy(name)
        ))),
    }
}

/// The segments fetched, checked and kept on the scratch disk, and what they touch.
pub(super) struct Gathered {
    /// Each segment holding a revision to apply: its manifest and its compressed file.
    files: Vec<(SegmentManifest, PathBuf)>,
    /// Every key the revisions touch, with its last write among them and, once the file's
    /// `key` bucket was read, its state before them (one map: the replay's memory is one
    /// copy of these keys).
    pub(super) keys: HashMap<Vec<u8>, Touched>,
    stopped: Option<EarlyStop>,
    /// The target was reached (a revision beyond it was seen).
    reached: bool,
    /// The last revision the replay will apply.
    last: i64,
    /// The leases the revisions name, as the segments say (what the seal checks the
    /// written file's leases with).
    leases: LeaseHistory,
}

/// The first pass: fetches and checks the segments continuing revision `current` up to
/// `target`, keeps each one holding a revision to apply in `dir`, and gathers their keys.
async fn gather(
    store: &Store,
    segments: &[SegmentManifest],
    current: i64,
    target: Target,
    dir: &Path,
) -> Result<Gathered, ReplayError> {
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let mut g = Gathered {
        files: Vec::new(),
        keys: HashMap::new(),
        stopped: None,
        reached: false,
        last: current,
        leases: LeaseHistory::default(),
    };
    for m in segments {
        if m.last_revision <= g.last {
            continue;
        }
        let opened = match stored::fetch(store, m).await {
            Ok(bytes) => stored::open(m, &bytes).map(|s| (s, bytes)),
            Err(e) => Err(e),
        };
        let (segment, bytes) = match super::usable(m, opened)? {
            Ok(ok) => ok,
            Err(stop) => {
                g.stopped = Some(stop);
                break;
            }
        };
        let mut any = false;
        let mut end = false;
        for rev in &segment.revisions {
            match step(g.last, rev, target) {
                Step::Skip => continue,
                Step::Apply => {}
                Step::Done => {
                    g.reached = true;
                    end = true;
                    break;
                }
                Step::Stop(why) => {
                    g.stopped = Some(why);
                    end = true;
                    break;
                }
            }
            any = true;
            g.last = rev.revision;
            g.leases.record(rev, &segment.leases);
            for (sub, op) in rev.ops.iter().enumerate() {
                let (Op::Put { key, .. } | Op::Delete { key }) = op;
                let last = (rev.revision, sub as i64);
                match g.keys.get_mut(key) {
                    Some(t) => t.last = last,
                    None => {
                        g.keys.insert(key.clone(), Touched { live: None, last });
                    }
                }
            }
        }
        if any {
            let file = dir.join(format!("{}.zst", g.files.len()));
            tokio::fs::write(&file, &bytes)
                .await
                .map_err(io("write", &file))?;
            g.files.push((m.clone(), file));
        }
        if end {
            break;
        }
    }
    Ok(g)
}

/// Entries of the written file's `key` bucket: kept from the snapshot, and added by the
/// replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub before: u64,
    pub added: u64,
}

/// What the second pass wrote.
pub(super) struct Written {
    pub(super) appended: Option<Appended>,
    segments: Vec<String>,
    revisions: u64,
    last_revision: i64,
    last_time_unix_ms: Option<u64>,
    pub(super) stopped: Option<EarlyStop>,
}

impl Written {
    fn nothing(current: i64, stopped: Option<EarlyStop>) -> Written {
        Written {
            appended: None,
            segments: Vec::new(),
            revisions: 0,
            last_revision: current,
            last_time_unix_ms: None,
            stopped,
        }
    }
}

/// The second pass, blocking: writes the gathered revisions (from the snapshot's revision
/// on, up to the target) into a file ([`append`], or `super::latest::write`).
pub(super) type Write =
    Box<dyn FnOnce(&mut Gathered, i64, Target) -> Result<Written, Unfit> + Send>;

/// What `learn` hands each entry of an untouched key to: its revision key and value.
pub(super) type Keep<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), BoltError> + 'a;

/// Walks the snapshot's `key` bucket at `root`: learns each touched key's state before
/// the replay, and hands each entry of a key the replay does not touch to `keep`. Returns
/// the entries walked.
pub(super) fn learn(
    db: &Db,
    root: &Root,
    state: &mut HashMap<Vec<u8>, Touched>,
    keep: &mut Keep<'_>,
) -> Result<u64, BoltError> {
    let mut walked = 0u64;
    let bad = |what: String| BoltError::Unexpected {
        path: db.path().to_path_buf(),
        what,
    };
    db.for_each(root, &mut |_, k, v| {
        walked += 1;
        let (_, tombstone) =
            main_of(k).ok_or_else(|| bad(format!("a key bucket entry {k:?} is not a revision")))?;
        let (key, live) = read_key_value(v)
            .ok_or_else(|| bad(format!("the value at revision key {k:?} does not decode")))?;
        match state.get_mut(key) {
            Some(slot) => slot.live = (!tombstone).then_some(live),
            None => keep(k, v)?,
        }
        Ok(())
    })?;
    Ok(walked)
}

/// The file's `lease` bucket, and the leases the replay grants.
pub(super) struct LeaseBucket {
    existing: BTreeMap<Vec<u8>, Vec<u8>>,
    known: HashSet<i64>,
    granted: BTreeMap<i64, i64>,
}

impl LeaseBucket {
    pub(super) fn read(db: &Db) -> Result<LeaseBucket, Unfit> {
        let mut existing: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        db.for_each(&bucket(db, LEASE_BUCKET)?, &mut |_, k, v| {
            existing.insert(k.to_vec(), v.to_vec());
            Ok(())
        })?;
        let known = existing
            .keys()
            .filter_map(|k| <[u8; 8]>::try_from(k.as_slice()).ok())
            .map(i64::from_be_bytes)
            .collect();
        Ok(LeaseBucket {
            existing,
            known,
            granted: BTreeMap::new(),
        })
    }

    /// The bucket's entries, the granted leases added; None when the replay granted none
    /// and the bucket stays as it was.
    pub(super) fn changed(self) -> Option<Vec<LeafEntry>> {
        self.entries(false)
    }

    /// The bucket's entries, the granted leases added.
    pub(super) fn all(self) -> Vec<LeafEntry> {
        self.entries(true).unwrap_or_default()
    }

    fn entries(mut self, always: bool) -> Option<Vec<LeafEntry>> {
        if self.granted.is_empty() && !always {
            return None;
        }
        for (id, ttl) in &self.granted {
            self.existing
                .insert(id.to_be_bytes().to_vec(), lease_value(*id, *ttl));
        }
        Some(
            self.existing
                .into_iter()
                .map(|(key, value)| LeafEntry {
                    flags: 0,
                    key,
                    value,
                })
                .collect(),
        )
    }
}

/// The second pass's walk: every gathered revision from `current` on (up to `target`) in
/// order, each entry it becomes handed to `emit`, each lease it names that the file does
/// not hold granted in `leases`.
pub(super) fn apply(
    g: &Gathered,
    state: &mut HashMap<Vec<u8>, Touched>,
    current: i64,
    target: Target,
    leases: &mut LeaseBucket,
    emit: &mut dyn FnMut(Entry) -> Result<(), BoltError>,
) -> Result<Written, BoltError> {
    let mut w = Written::nothing(current, g.stopped.clone());
    for (m, file) in &g.files {
        let bytes = std::fs::read(file).map_err(|source| BoltError::Io {
            path: file.clone(),
            source,
        })?;
        let segment = stored::open(m, &bytes).map_err(|e| BoltError::Unexpected {
            path: file.clone(),
            what: e.to_string(),
        })?;
        let before = w.revisions;
        for rev in &segment.revisions {
            match step(w.last_revision, rev, target) {
                Step::Skip => continue,
                Step::Apply => {}
                Step::Done | Step::Stop(_) => break,
            }
            if rev.revision > g.last {
                break;
            }
            let new = match entries(rev, state) {
                Ok(e) => e,
                Err(why) => {
                    w.stopped = Some(EarlyStop::Unreplayable {
                        revision: rev.revision,
                        why,
                    });
                    break;
                }
            };
            for (id, ttl) in leases_to_grant(rev, &segment.leases, &leases.known) {
                leases.known.insert(id);
                leases.granted.insert(id, ttl);
            }
            for e in new {
                emit(e)?;
            }
            w.revisions += 1;
            w.last_revision = rev.revision;
            w.last_time_unix_ms = Some(rev.time_unix_ms);
        }
        if w.revisions > before {
            w.segments.push(m.name.clone());
        }
        if matches!(w.stopped, Some(EarlyStop::Unreplayable { .. })) {
            break;
        }
    }
    Ok(w)
}

/// The second pass into a copy of the snapshot at `db`: learns the gathered keys' state
/// from the file, then appends every gathered revision and the leases they name. The whole
/// history, as etcd holds it.
pub(super) fn append(db: &Path) -> Write {
    let db = db.to_path_buf();
    Box::new(move |g, current, target| append_into(&db, g, current, target))
}

fn append_into(
    db: &Path,
    g: &mut Gathered,
    current: i64,
    target: Target,
) -> Result<Written, Unfit> {
    let mut db = Db::open(db)?;
    let keys_root = bucket(&db, KEY_BUCKET)?;
    let mut state = std::mem::take(&mut g.keys);
    let before = learn(&db, &keys_root, &mut state, &mut |_, _| Ok(()))?;
    let mut leases = LeaseBucket::read(&db)?;
    let mut w = Written::nothing(current, None);
    let mut added = 0u64;
    let mut append = db.append()?;
    let key_root = append.extend(&keys_root, &mut |append, leaves| {
        w = apply(g, &mut state, current, target, &mut leases, &mut |e| {
            added += 1;
            append.push(leaves, e.leaf)
        })?;
        Ok(())
    })?;
    let mut replaced: Vec<(&[u8], u64)> = vec![(KEY_BUCKET, key_root)];
    if let Some(entries) = leases.changed() {
        replaced.push((LEASE_BUCKET, append.rebuild(entries)?));
    }
    let root = crate::backup::bolt::root_entries_with(append.db(), &replaced)?;
    let root = append.rebuild(root)?;
    append.commit(root)?;
    w.appended = Some(Appended { before, added });
    Ok(w)
}

/// Replays the gathered segments into `output` (the snapshot at revision `current`, as
/// [`file_revision`] says), keeping the fetched segments under `dir`. Returns the entries
/// of the written file's `key` bucket and the leases the archive says the replayed
/// revisions name (None: nothing to replay, nothing written).
/// `Ok(Err(_))`: the file cannot take them and is as it was; the replay goes another way.
#[allow(clippy::too_many_arguments)]
pub(super) async fn replay_into(
    store: &Store,
    write: Write,
    current: i64,
    segments: &[SegmentManifest],
    target: Target,
    dir: &Path,
    done: &mut Replayed,
) -> Result<Result<Option<(Appended, LeaseHistory)>, Unfit>, ReplayError> {
    let started = Instant::now();
    let g = gather(store, segments, current, target, dir).await?;
    let (g, written) = tokio::task::spawn_blocking(move || {
        let mut g = g;
        let w = if g.last > current {
            write(&mut g, current, target)
        } else {
            Ok(Written::nothing(current, g.stopped.clone()))
        };
        (g, w)
    })
    .await
    .map_err(|e| ReplayError::Apply {
        revision: current + 1,
        detail: format!("the file writer stopped: {e}"),
    })?;
    let _ = std::fs::remove_dir_all(dir);
    let mut w = match written {
        Ok(w) => w,
        Err(unfit) => return Ok(Err(unfit)),
    };
    done.segments = std::mem::take(&mut w.segments);
    done.revisions = w.revisions;
    done.last_revision = w.last_revision;
    done.last_time_unix_ms = w.last_time_unix_ms;
    done.stopped = w.stopped.take();
    done.applying = started.elapsed();
    if let (Target::Revision(n), None, false) = (target, &done.stopped, g.reached) {
        if done.last_revision < n {
            done.stopped = Some(EarlyStop::ArchiveEnds {
                last: done.last_revision,
                target: n,
            });
        }
    }
    Ok(Ok(w.appended.map(|a| (a, g.leases))))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn put(k: &str, v: &str, lease: i64) -> Op {
        Op::Put {
            key: k.into(),
            value: v.into(),
            lease,
        }
    }

    fn del(k: &str) -> Op {
        Op::Delete { key: k.into() }
    }

    fn rev(revision: i64, ops: Vec<Op>) -> Revision {
        Revision {
            revision,
            time_unix_ms: 0,
            ops,
        }
    }

    fn touched(live: Option<Live>, last: (i64, i64)) -> Touched {
        Touched { live, last }
    }

    #[test]
    fn a_revision_becomes_the_entries_etcd_writes_versions_counted_and_lives_restarted() {
        let mut state: HashMap<Vec<u8>, Touched> = HashMap::new();
        let a = Live {
            create: 3,
            version: 2,
        };
        state.insert(b"a".to_vec(), touched(Some(a), (12, 0)));
        state.insert(b"b".to_vec(), touched(None, (10, 1)));
        let e = entries(
            &rev(10, vec![put("a", "x", 0), put("b", "y", 7)]),
            &mut state,
        )
        .unwrap();
        assert_eq!(e[0].leaf.key, revision_key(10, 0, false));
        assert_eq!(
            read_key_value(&e[0].leaf.value).unwrap(),
            (
                &b"a"[..],
                Live {
                    create: 3,
                    version: 3
                }
            )
        );
        assert_eq!(e[1].leaf.key, revision_key(10, 1, false));
        assert_eq!(
            read_key_value(&e[1].leaf.value).unwrap(),
            (
                &b"b"[..],
                Live {
                    create: 10,
                    version: 1
                }
            )
        );
        assert_eq!(
            (e[0].last, e[1].last),
            (false, true),
            "a is written again at 12, b never again"
        );
        let e = entries(&rev(11, vec![del("a")]), &mut state).unwrap();
        assert_eq!(e[0].leaf.key, revision_key(11, 0, true));
        assert_eq!(main_of(&e[0].leaf.key), Some((11, true)));
        assert_eq!(state[&b"a".to_vec()].live, None);
        assert!(!e[0].last);
        let e = entries(&rev(12, vec![put("a", "z", 0)]), &mut state).unwrap();
        assert_eq!(
            read_key_value(&e[0].leaf.value).unwrap().1,
            Live {
                create: 12,
                version: 1
            }
        );
        assert!(e[0].last, "a's last write");
        let refused = entries(&rev(13, vec![del("b"), del("b")]), &mut state).unwrap_err();
        assert!(
            refused.contains("revision 13 deletes key \"b\""),
            "{refused}"
        );
    }

    #[test]
    fn the_files_revision_is_its_last_key_or_its_compaction_whichever_is_higher() {
        let k = revision_key(40, 0, true);
        let c = revision_key(45, 0, false);
        assert_eq!(revision_of(Some(&k), None), 40);
        assert_eq!(revision_of(Some(&k), Some(&c)), 45);
        assert_eq!(revision_of(None, None), 1, "etcd's first revision");
    }
}
