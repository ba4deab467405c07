//! A restore point's file holding, of each key the archive replay touches, only its **last
//! write**: for a restore that moves the revision forward and marks every earlier revision
//! compacted (`etcdutl snapshot restore --bump-revision --mark-compacted`), nothing but
//! each key's latest state is ever read again, and etcd deletes every older revision when
//! it starts. Written whole, such a file would carry every superseded revision of the
//! archive through the restore's copies and into etcd's compaction at start; this one is
//! a new file holding the snapshot's entries of the keys the replay does not touch, then,
//! in revision order, each touched key's last write at its original revision, creation
//! revision and version (a delete as its tombstone, which etcd's compaction removes).
//!
//! Every other bucket is copied as it is, the `lease` bucket with the leases the replay
//! grants. The file is then checked and sealed as a whole-history one is
//! ([`super::sealed`]).

use std::path::Path;

use super::direct::{
    apply, bucket, learn, Appended, Gathered, LeaseBucket, Unfit, Write, Written, KEY_BUCKET,
    LEASE_BUCKET,
};
use super::plan::{EarlyStop, Target};
use crate::backup::bolt::page::{self, LeafEntry, BUCKET_FLAG};
use crate::backup::bolt::{Db, Root};

/// The second pass into a new file `to` from the snapshot file `from`. A revision that
/// cannot be replayed ends this file: the keys written after it would be lost with their
/// earlier writes, so the caller writes the whole history instead.
pub(super) fn write(from: &Path, to: &Path) -> Write {
    let (from, to) = (from.to_path_buf(), to.to_path_buf());
    Box::new(move |g, current, target| write_into(&from, &to, g, current, target))
}

fn write_into(
    from: &Path,
    to: &Path,
    g: &mut Gathered,
    current: i64,
    target: Target,
) -> Result<Written, Unfit> {
    let src = Db::open(from)?;
    let keys_root = bucket(&src, KEY_BUCKET)?;
    let mut leases = LeaseBucket::read(&src)?;
    let mut roots: Vec<LeafEntry> = Vec::new();
    src.for_each(&Root::Page(src.meta.root), &mut |flags, k, v| {
        roots.push(LeafEntry {
            flags,
            key: k.to_vec(),
            value: v.to_vec(),
        });
        Ok(())
    })?;
    let mut dst = Db::create(to, &src.meta)?;
    let mut append = dst.append()?;
    let mut state = std::mem::take(&mut g.keys);
    let (mut kept, mut added) = (0u64, 0u64);
    let mut w = None;
    let key_root = append.build(&mut |append, leaves| {
        learn(&src, &keys_root, &mut state, &mut |k, v| {
            kept += 1;
            append.push(leaves, entry(k, v))
        })?;
        w = Some(apply(
            g,
            &mut state,
            current,
            target,
            &mut leases,
            &mut |e| {
                if !e.last {
                    return Ok(());
                }
                added += 1;
                append.push(leaves, e.leaf)
            },
        )?);
        Ok(())
    })?;
    let mut w = w.ok_or_else(|| Unfit("the replay's revisions were not walked".into()))?;
    if let Some(EarlyStop::Unreplayable { revision, why }) = &w.stopped {
        return Err(Unfit(format!(
            "archived revision {revision} cannot be replayed ({why}): a file of last writes would lose every key written after it"
        )));
    }
    let mut lease_entries = leases.all();
    let mut root = Vec::with_capacity(roots.len());
    for e in roots {
        if e.flags & BUCKET_FLAG == 0 {
            root.push(e);
            continue;
        }
        let (page_root, sequence, _) = page::bucket_value(&e.value).ok_or_else(|| {
            Unfit(format!(
                "bucket {:?}'s value is shorter than its header",
                e.key
            ))
        })?;
        let new_root = if e.key == KEY_BUCKET {
            key_root
        } else if e.key == LEASE_BUCKET {
            append.rebuild(std::mem::take(&mut lease_entries))?
        } else if page_root == 0 {
            // Inline: the bucket's leaf is in its value, which holds no page number.
            root.push(e);
            continue;
        } else {
            let mut entries = Vec::new();
            src.for_each(&Root::Page(page_root), &mut |flags, k, v| {
                // A nested bucket on pages of its own would point into the snapshot's
                // file (etcd's buckets hold none).
                if flags & BUCKET_FLAG != 0
                    && page::bucket_value(v).is_none_or(|(root, _, _)| root != 0)
                {
                    return Err(crate::backup::bolt::BoltError::Unexpected {
                        path: from.to_path_buf(),
                        what: format!("bucket {:?} holds a nested bucket", e.key),
                    });
                }
                entries.push(LeafEntry {
                    flags,
                    ..entry(k, v)
                });
                Ok(())
            })?;
            append.rebuild(entries)?
        };
        root.push(LeafEntry {
            flags: e.flags,
            key: e.key,
            value: page::bucket_value_of(new_root, sequence),
        });
    }
    let root = append.rebuild(root)?;
    append.commit(root)?;
    w.appended = Some(Appended {
        before: kept,
        added,
    });
    Ok(w)
}

fn entry(k: &[u8], v: &[u8]) -> LeafEntry {
    LeafEntry {
        flags: 0,
        key: k.to_vec(),
        value: v.to_vec(),
    }
}
