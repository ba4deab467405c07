//! The replay written straight into the restored snapshot's database file, before the
//! throw-away etcd starts on it: each archived revision becomes the entries etcd itself
//! would have written for it (etcd's `key` bucket: revision `main_sub` → the key's
//! `KeyValue`, a delete as a tombstone), appended after the snapshot's, and each lease a
//! put names that the file does not hold is added to its `lease` bucket with its archived
//! TTL. No page in use is written over ([`crate::backup::bolt`]); the throw-away etcd then
//! rebuilds its index from the file and must serve exactly the last replayed revision.
//!
//! Two passes over the segments: the first fetches and checks each one (kept on the
//! scratch disk, compressed) and gathers the keys they touch, so that one walk of the
//! snapshot's `key` bucket learns each of those keys' creation revision and version; the
//! second writes.
//!
//! What each revision becomes ([`entries`]), etcd's encodings ([`revision_key`],
//! [`key_value`], [`lease_value`]) and the snapshot's revision ([`revision_of`]) are pure.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::plan::{leases_to_grant, step, EarlyStop, Step, Target};
use super::{io, ReplayError, Replayed};
use crate::backup::archive::segment::{Op, Revision};
use crate::backup::archive::{stored, SegmentManifest};
use crate::backup::bolt::page::LeafEntry;
use crate::backup::bolt::{BoltError, Db, Root};
use crate::backup::store::Store;

const KEY_BUCKET: &[u8] = b"key";
const LEASE_BUCKET: &[u8] = b"lease";
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

/// etcd's key for revision `main`, change `sub`; a delete's ends in `t`.
pub fn revision_key(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(18);
    k.extend_from_slice(&main.to_be_bytes());
    k.push(b'_');
    k.extend_from_slice(&sub.to_be_bytes());
    if tombstone {
        k.push(b't');
    }
    k
}

/// The main revision of an etcd revision key, and whether it marks a delete.
pub fn main_of(k: &[u8]) -> Option<(i64, bool)> {
    if (k.len() != 17 && k.len() != 18) || k[8] != b'_' {
        return None;
    }
    let mut m = [0u8; 8];
    m.copy_from_slice(&k[..8]);
    Some((i64::from_be_bytes(m), k.len() == 18 && k[17] == b't'))
}

fn varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

fn field_bytes(out: &mut Vec<u8>, field: u8, b: &[u8]) {
    if !b.is_empty() {
        out.push(field << 3 | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }
}

fn field_int(out: &mut Vec<u8>, field: u8, x: i64) {
    if x != 0 {
        out.push(field << 3);
        varint(out, x as u64);
    }
}

/// A key's state: where its current life began and how many times it was written since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    pub create: i64,
    pub version: i64,
}

/// etcd's `mvccpb.KeyValue`, encoded as etcd's protobuf encoder does (fields in order,
/// zero values left out).
pub fn key_value(key: &[u8], live: Live, modified: i64, value: &[u8], lease: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + value.len() + 40);
    field_bytes(&mut out, 1, key);
    field_int(&mut out, 2, live.create);
    field_int(&mut out, 3, modified);
    field_int(&mut out, 4, live.version);
    field_bytes(&mut out, 5, value);
    field_int(&mut out, 6, lease);
    out
}

/// A tombstone's value: a `KeyValue` holding only the key.
fn tombstone_value(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 4);
    field_bytes(&mut out, 1, key);
    out
}

/// etcd's `leasepb.Lease` for a granted lease.
pub fn lease_value(id: i64, ttl: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    field_int(&mut out, 1, id);
    field_int(&mut out, 2, ttl);
    out
}

fn read_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut x = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        x |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(x);
        }
    }
    None
}

/// The key of an encoded `KeyValue`, and its creation revision and version.
pub fn read_key_value(b: &[u8]) -> Option<(&[u8], Live)> {
    let (mut at, mut key, mut live) = (
        0,
        None,
        Live {
            create: 0,
            version: 0,
        },
    );
    while at < b.len() {
        let tag = read_varint(b, &mut at)?;
        match tag & 7 {
            0 => {
                let x = read_varint(b, &mut at)? as i64;
                match tag >> 3 {
                    2 => live.create = x,
                    4 => live.version = x,
                    _ => {}
                }
            }
            2 => {
                let len = usize::try_from(read_varint(b, &mut at)?).ok()?;
                let field = b.get(at..at.checked_add(len)?)?;
                at += len;
                if tag >> 3 == 1 {
                    key = Some(field);
                }
            }
            _ => return None,
        }
    }
    Some((key.unwrap_or(&[]), live))
}

/// The entries etcd writes for archived revision `rev`, in order, given every touched key's
/// state before it (`None`: absent or deleted), which it updates. A delete of a key that is
/// not there is refused: etcd would not have made a revision of it.
pub fn entries(
    rev: &Revision,
    state: &mut HashMap<Vec<u8>, Option<Live>>,
) -> Result<Vec<LeafEntry>, String> {
    let mut out = Vec::with_capacity(rev.ops.len());
    for (sub, op) in rev.ops.iter().enumerate() {
        let sub = sub as i64;
        match op {
            Op::Put { key, value, lease } => {
                let slot = state.get_mut(key).ok_or_else(|| {
                    format!("key {:?} was not gathered", String::from_utf8_lossy(key))
                })?;
                let live = match slot {
                    Some(l) => Live {
                        create: l.create,
                        version: l.version + 1,
                    },
                    None => Live {
                        create: rev.revision,
                        version: 1,
                    },
                };
                *slot = Some(live);
                out.push(LeafEntry {
                    flags: 0,
                    key: revision_key(rev.revision, sub, false),
                    value: key_value(key, live, rev.revision, value, *lease),
                });
            }
            Op::Delete { key } => {
                let slot = state.get_mut(key).filter(|s| s.is_some()).ok_or_else(|| {
                    format!(
                        "archived revision {} deletes key {:?}, which the revisions before it do not hold",
                        rev.revision,
                        String::from_utf8_lossy(key)
                    )
                })?;
                *slot = None;
                out.push(LeafEntry {
                    flags: 0,
                    key: revision_key(rev.revision, sub, true),
                    value: tombstone_value(key),
                });
            }
        }
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

fn bucket(db: &Db, name: &[u8]) -> Result<Root, Unfit> {
    match db.bucket(name)? {
        Some(b) => Ok(b.root),
        None => Err(Unfit(format!(
            "the file has no {:?} bucket",
            String::from_utf8_lossy(name)
        ))),
    }
}

/// The segments fetched, checked and kept on the scratch disk, and what they touch.
struct Gathered {
    /// Each segment holding a revision to apply: its manifest and its compressed file.
    files: Vec<(SegmentManifest, PathBuf)>,
    /// Every key the revisions touch, each with its state before them once the file's
    /// `key` bucket was read (one map: the replay's memory is one copy of these keys).
    keys: HashMap<Vec<u8>, Option<Live>>,
    stopped: Option<EarlyStop>,
    /// The target was reached (a revision beyond it was seen).
    reached: bool,
    /// The last revision the replay will apply.
    last: i64,
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
            for op in &rev.ops {
                let (Op::Put { key, .. } | Op::Delete { key }) = op;
                if !g.keys.contains_key(key) {
                    g.keys.insert(key.clone(), None);
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

/// Entries of the file's `key` bucket: before the replay, and appended by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub before: u64,
    pub added: u64,
}

/// What the second pass wrote.
struct Written {
    appended: Option<Appended>,
    segments: Vec<String>,
    revisions: u64,
    last_revision: i64,
    last_time_unix_ms: Option<u64>,
    stopped: Option<EarlyStop>,
}

/// The second pass, blocking: learns the gathered keys' state from the file, then appends
/// every gathered revision (from `current` on, up to `target`) and the leases they name.
fn write(db: &Path, g: &mut Gathered, current: i64, target: Target) -> Result<Written, Unfit> {
    let mut db = Db::open(db)?;
    let keys_root = bucket(&db, KEY_BUCKET)?;
    let lease_root = bucket(&db, LEASE_BUCKET)?;
    let mut state = std::mem::take(&mut g.keys);
    let mut bad = None;
    let mut before = 0u64;
    db.for_each(&keys_root, &mut |_, k, v| {
        before += 1;
        let Some((_, tombstone)) = main_of(k) else {
            bad = Some(format!("a key bucket entry {k:?} is not a revision"));
            return Ok(());
        };
        let Some((key, live)) = read_key_value(v) else {
            bad = Some(format!("the value at revision key {k:?} does not decode"));
            return Ok(());
        };
        if let Some(slot) = state.get_mut(key) {
            *slot = (!tombstone).then_some(live);
        }
        Ok(())
    })?;
    if let Some(why) = bad {
        return Err(Unfit(why));
    }
    let mut existing: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    db.for_each(&lease_root, &mut |_, k, v| {
        existing.insert(k.to_vec(), v.to_vec());
        Ok(())
    })?;
    let mut known: HashSet<i64> = existing
        .keys()
        .filter_map(|k| <[u8; 8]>::try_from(k.as_slice()).ok())
        .map(i64::from_be_bytes)
        .collect();
    let mut w = Written {
        appended: None,
        segments: Vec::new(),
        revisions: 0,
        last_revision: current,
        last_time_unix_ms: None,
        stopped: g.stopped.clone(),
    };
    let mut granted: BTreeMap<i64, i64> = BTreeMap::new();
    let mut added = 0u64;
    let mut append = db.append()?;
    let key_root = append.extend(&keys_root, &mut |append, leaves| {
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
                let new = match entries(rev, &mut state) {
                    Ok(e) => e,
                    Err(why) => {
                        w.stopped = Some(EarlyStop::Unreplayable {
                            revision: rev.revision,
                            why,
                        });
                        break;
                    }
                };
                for (id, ttl) in leases_to_grant(rev, &segment.leases, &known) {
                    known.insert(id);
                    granted.insert(id, ttl);
                }
                for e in new {
                    append.push(leaves, e)?;
                    added += 1;
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
        Ok(())
    })?;
    let mut replaced: Vec<(&[u8], u64)> = vec![(KEY_BUCKET, key_root)];
    if !granted.is_empty() {
        for (id, ttl) in &granted {
            existing.insert(id.to_be_bytes().to_vec(), lease_value(*id, *ttl));
        }
        let leases = existing
            .into_iter()
            .map(|(key, value)| LeafEntry {
                flags: 0,
                key,
                value,
            })
            .collect();
        replaced.push((LEASE_BUCKET, append.rebuild(leases)?));
    }
    let root = crate::backup::bolt::root_entries_with(append.db(), &replaced)?;
    let root = append.rebuild(root)?;
    append.commit(root)?;
    w.appended = Some(Appended { before, added });
    Ok(w)
}

/// Replays the gathered segments into the restored file `db` (at revision `current`, as
/// [`file_revision`] says), keeping the fetched segments under `dir`. Returns the entries
/// appended (None: nothing to replay, the file untouched). `Ok(Err(_))`: the file cannot
/// take them and is as it was; the replay goes through etcd's API instead.
pub(super) async fn replay_into(
    store: &Store,
    db: &Path,
    current: i64,
    segments: &[SegmentManifest],
    target: Target,
    dir: &Path,
    done: &mut Replayed,
) -> Result<Result<Option<Appended>, Unfit>, ReplayError> {
    let started = Instant::now();
    let g = gather(store, segments, current, target, dir).await?;
    let path = db.to_path_buf();
    let (g, written) = tokio::task::spawn_blocking(move || {
        let mut g = g;
        let w = if g.last > current {
            write(&path, &mut g, current, target)
        } else {
            Ok(Written {
                appended: None,
                segments: Vec::new(),
                revisions: 0,
                last_revision: current,
                last_time_unix_ms: None,
                stopped: g.stopped.clone(),
            })
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
    Ok(Ok(w.appended))
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

    #[test]
    fn a_revision_becomes_the_entries_etcd_writes_versions_counted_and_lives_restarted() {
        let mut state: HashMap<Vec<u8>, Option<Live>> = HashMap::new();
        state.insert(
            b"a".to_vec(),
            Some(Live {
                create: 3,
                version: 2,
            }),
        );
        state.insert(b"b".to_vec(), None);
        let e = entries(
            &rev(10, vec![put("a", "x", 0), put("b", "y", 7)]),
            &mut state,
        )
        .unwrap();
        assert_eq!(e[0].key, revision_key(10, 0, false));
        assert_eq!(
            read_key_value(&e[0].value).unwrap(),
            (
                &b"a"[..],
                Live {
                    create: 3,
                    version: 3
                }
            )
        );
        assert_eq!(e[1].key, revision_key(10, 1, false));
        assert_eq!(
            read_key_value(&e[1].value).unwrap(),
            (
                &b"b"[..],
                Live {
                    create: 10,
                    version: 1
                }
            )
        );
        let e = entries(&rev(11, vec![del("a")]), &mut state).unwrap();
        assert_eq!(e[0].key, revision_key(11, 0, true));
        assert_eq!(main_of(&e[0].key), Some((11, true)));
        assert_eq!(state[&b"a".to_vec()], None);
        let e = entries(&rev(12, vec![put("a", "z", 0)]), &mut state).unwrap();
        assert_eq!(
            read_key_value(&e[0].value).unwrap().1,
            Live {
                create: 12,
                version: 1
            }
        );
        let refused = entries(&rev(13, vec![del("b"), del("b")]), &mut state).unwrap_err();
        assert!(
            refused.contains("revision 13 deletes key \"b\""),
            "{refused}"
        );
    }

    #[test]
    fn key_values_are_encoded_as_etcds_protobuf_encoder_does() {
        // mvccpb.KeyValue{Key:"k", CreateRevision:2, ModRevision:300, Version:1, Value:"v"}
        // as etcd marshals it: fields in order, zero lease left out, varints.
        let b = key_value(
            b"k",
            Live {
                create: 2,
                version: 1,
            },
            300,
            b"v",
            0,
        );
        assert_eq!(
            b,
            vec![0x0a, 1, b'k', 0x10, 2, 0x18, 0xac, 0x02, 0x20, 1, 0x2a, 1, b'v']
        );
        assert_eq!(tombstone_value(b"k"), vec![0x0a, 1, b'k']);
        assert_eq!(lease_value(0x1234, 60), vec![0x08, 0xb4, 0x24, 0x10, 60]);
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
