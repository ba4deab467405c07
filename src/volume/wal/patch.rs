//! Moving a WAL's commit index to its last entry, for a recovery's forced start: etcd's
//! commit on disk may lag what was acknowledged, and `--force-new-cluster` discards the
//! entries after it. One hard-state record, framed as etcd frames it, is written into the
//! last WAL file.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::{crc32c, scan, wal_files, Stop, WAL_RECORD_STATE};

/// Bytes to write into a WAL file at `offset`: one hard-state record that commits the
/// file's whole log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPatch {
    pub offset: u64,
    pub bytes: Vec<u8>,
    /// The commit index the file's newest hard state had, and the one the patch gives.
    pub from: u64,
    pub to: u64,
}

/// Why a WAL file's commit index is not moved to its last entry.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Unpatchable {
    #[error("the WAL's last records are torn or unreadable from byte {at}: only the entries up to the commit index on disk are kept")]
    TornTail { at: u64 },
    #[error("the WAL's CRC chain breaks at byte {at}: only the entries up to the commit index on disk are kept")]
    CrcMismatch { at: u64 },
    #[error("the last WAL file holds no hard state: only the entries up to the commit index on disk are kept")]
    NoHardState,
    #[error("the WAL's last entry has term {entry_term}, newer than its newest hard state's term {state_term}: only the entries up to the commit index on disk are kept")]
    EntryNewerThanState { entry_term: u64, state_term: u64 },
}

/// Pure: given the bytes of the newest WAL file, the hard-state record to write after its
/// last record so that the commit index on disk reaches the log's last entry (same term
/// and vote as the newest hard state), in etcd's own framing, continuing the file's CRC
/// chain; it goes where the scan stopped at the preallocated zeros (or the file's end).
/// `Ok(None)`: the commit index already reaches the last entry. A tail that is not read
/// cleanly to its end is not patched.
///
/// Why: etcd's raft writes a hard state whose only change is the commit index without an
/// fsync, so after a SIGKILL the commit index on disk lags what was acknowledged, and
/// `--force-new-cluster` discards every entry after it.
pub fn commit_patch(file: &[u8]) -> Result<Option<CommitPatch>, Unpatchable> {
    let s = scan(file);
    match s.stop {
        Stop::End => {}
        Stop::Torn => return Err(Unpatchable::TornTail { at: s.end }),
        Stop::Crc => return Err(Unpatchable::CrcMismatch { at: s.end }),
    }
    if !s.has_state {
        return Err(Unpatchable::NoHardState);
    }
    let t = s.tail;
    if t.commit >= t.last_index {
        return Ok(None);
    }
    if t.last_term > t.term {
        return Err(Unpatchable::EntryNewerThanState {
            entry_term: t.last_term,
            state_term: t.term,
        });
    }
    let mut state = Vec::with_capacity(32);
    for (field, value) in [(1u8, t.term), (2, s.vote), (3, t.last_index)] {
        state.push(field << 3);
        put_varint(&mut state, value);
    }
    let crc = crc32c::extend(s.crc, &state);
    let mut rec = vec![0x08];
    put_varint(&mut rec, WAL_RECORD_STATE);
    rec.push(0x10);
    put_varint(&mut rec, u64::from(crc));
    rec.push(0x1a);
    put_varint(&mut rec, state.len() as u64);
    rec.extend_from_slice(&state);
    Ok(Some(CommitPatch {
        offset: s.end,
        bytes: frame(&rec),
        from: t.commit,
        to: t.last_index,
    }))
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// etcd's frame: a little-endian length word (low 56 bits: the record's length; when the
/// record is padded to 8-byte alignment, the top bit set and the pad count in bits 56..58),
/// the record, the zero padding.
pub fn frame(record: &[u8]) -> Vec<u8> {
    let pad = (8 - record.len() % 8) % 8;
    let mut word = record.len() as u64;
    if pad > 0 {
        word |= (0x80 | pad as u64) << 56;
    }
    let mut out = word.to_le_bytes().to_vec();
    out.extend_from_slice(record);
    out.extend(std::iter::repeat_n(0u8, pad));
    out
}

/// What [`patch_commit`] did to the newest WAL file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Patched {
    /// The commit index went from `from` to `to` (the log's last entry).
    Moved { file: PathBuf, from: u64, to: u64 },
    /// Nothing written: the commit index already reaches the last entry (also after a
    /// patch that already happened), the tail cannot be patched, the log's end is not the
    /// commit index asked for, or there is no WAL.
    Nothing,
}

/// The commit index a forced start from `wal_dir` begins from once its newest file is
/// patched ([`commit_patch`]): the last entry's index, or the commit index on disk and why
/// not the last entry. `None` without a WAL.
pub fn reachable_commit(wal_dir: &Path) -> std::io::Result<Option<(u64, Option<Unpatchable>)>> {
    let wals = wal_files(wal_dir)?;
    let Some(last) = wals.last() else {
        return Ok(None);
    };
    let bytes = std::fs::read(last)?;
    Ok(Some(match commit_patch(&bytes) {
        Ok(Some(p)) => (p.to, None),
        Ok(None) => (scan(&bytes[..]).tail.commit, None),
        Err(why) => (scan(&bytes[..]).tail.commit, Some(why)),
    }))
}

/// Moves the commit index of `wal_dir`'s newest WAL file to its last entry when that is
/// `target` ([`commit_patch`]): writes the record over the preallocated zeros and fsyncs
/// the file. Run again, it finds the commit index at the last entry and writes nothing.
pub fn patch_commit(wal_dir: &Path, target: u64) -> std::io::Result<Patched> {
    use std::io::{Seek, SeekFrom, Write};
    let wals = wal_files(wal_dir)?;
    let Some(last) = wals.last() else {
        return Ok(Patched::Nothing);
    };
    let bytes = std::fs::read(last)?;
    let patch = match commit_patch(&bytes) {
        Ok(Some(p)) if p.to == target => p,
        _ => return Ok(Patched::Nothing),
    };
    let mut f = std::fs::OpenOptions::new().write(true).open(last)?;
    f.seek(SeekFrom::Start(patch.offset))?;
    f.write_all(&patch.bytes)?;
    f.sync_all()?;
    Ok(Patched::Moved {
        file: last.clone(),
        from: patch.from,
        to: patch.to,
    })
}
