//! Reads a WAL's head: does the volume hold etcd data, and whose (member and cluster ID
//! from the WAL's metadata record). A strict, bounded parser: its input is whatever lies on
//! the volume.

use std::io::Read;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::facts::{WalIdentity, WalState, WalTail};

mod crc32c;
mod patch;
#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
use patch::put_varint;
pub use patch::{
    commit_patch, frame, patch_commit, reachable_commit, CommitPatch, Patched, Unpatchable,
};

const WAL_RECORD_METADATA: u64 = 1;
const WAL_RECORD_ENTRY: u64 = 2;
pub(super) const WAL_RECORD_STATE: u64 = 3;
pub(super) const WAL_RECORD_CRC: u64 = 4;
const WAL_RECORD_SNAPSHOT: u64 = 5;
/// A record longer than this is not a record but a torn or foreign tail: reading stops.
const WAL_MAX_RECORD_BYTES: usize = 64 * 1024 * 1024;
/// How much of the first WAL file is read to find its metadata record.
const WAL_HEAD_BYTES: u64 = 64 * 1024;

/// Why WAL bytes carry no usable metadata record.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WalParseError {
    #[error("WAL ends inside a record frame at byte {0}")]
    Truncated(usize),
    #[error("WAL record at byte {0} is not a valid record")]
    BadRecord(usize),
    #[error("no metadata record in the first records of the WAL")]
    NoMetadata,
}

/// Whether `wal_dir` holds a `*.wal` (etcd's own test for data) and, if so, whose.
pub fn inspect(wal_dir: &Path) -> std::io::Result<WalState> {
    let wals = wal_files(wal_dir)?;
    let Some(first) = wals.first() else {
        return Ok(WalState::None);
    };
    let mut head = Vec::new();
    let read =
        std::fs::File::open(first).and_then(|f| f.take(WAL_HEAD_BYTES).read_to_end(&mut head));
    Ok(WalState::Present(match read {
        Ok(_) => parse_wal_metadata(&head).map_err(|e| format!("{}: {e}", first.display())),
        Err(e) => Err(format!("{}: {e}", first.display())),
    }))
}

pub(super) fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// A protobuf field's value: a number (varint; fixed-width values read as 0) or bytes.
type FieldValue<'a> = Result<u64, &'a [u8]>;

/// Reads the protobuf fields of one message as (field number, value).
fn fields(msg: &[u8]) -> Option<Vec<(u64, FieldValue<'_>)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < msg.len() {
        let key = varint(msg, &mut pos)?;
        let value = match key & 7 {
            0 => Ok(varint(msg, &mut pos)?),
            2 => {
                let len = usize::try_from(varint(msg, &mut pos)?).ok()?;
                let end = pos.checked_add(len).filter(|e| *e <= msg.len())?;
                let bytes = &msg[pos..end];
                pos = end;
                Err(bytes)
            }
            5 => {
                pos = pos.checked_add(4).filter(|e| *e <= msg.len())?;
                Ok(0)
            }
            1 => {
                pos = pos.checked_add(8).filter(|e| *e <= msg.len())?;
                Ok(0)
            }
            _ => return None,
        };
        out.push((key >> 3, value));
    }
    Some(out)
}

/// Finds the member and cluster ID in the head of a WAL file: a sequence of frames
/// (little-endian u64 length word, the top byte flagging padding, then a `walpb.Record`
/// whose metadata record carries an `etcdserverpb.Metadata`).
pub fn parse_wal_metadata(bytes: &[u8]) -> Result<WalIdentity, WalParseError> {
    let mut pos = 0usize;
    for _ in 0..16 {
        let frame_start = pos;
        let word = bytes
            .get(pos..pos + 8)
            .ok_or(WalParseError::Truncated(frame_start))?;
        let mut le = [0u8; 8];
        le.copy_from_slice(word);
        let word = u64::from_le_bytes(le);
        pos += 8;
        let len = usize::try_from(word & 0x00ff_ffff_ffff_ffff)
            .map_err(|_| WalParseError::BadRecord(frame_start))?;
        let pad = if word & (0x80 << 56) != 0 {
            ((word >> 56) & 0x7) as usize
        } else {
            0
        };
        if len == 0 {
            return Err(WalParseError::NoMetadata);
        }
        let end = pos
            .checked_add(len)
            .filter(|e| *e <= bytes.len())
            .ok_or(WalParseError::Truncated(frame_start))?;
        let record = fields(&bytes[pos..end]).ok_or(WalParseError::BadRecord(frame_start))?;
        pos = end + pad;
        let rtype = record.iter().find_map(|(f, v)| (*f == 1).then_some(v));
        if !matches!(rtype, Some(Ok(WAL_RECORD_METADATA))) {
            continue;
        }
        let data = record
            .iter()
            .find_map(|(f, v)| match (f, v) {
                (3, Err(b)) => Some(*b),
                _ => None,
            })
            .unwrap_or(&[]);
        let meta = fields(data).ok_or(WalParseError::BadRecord(frame_start))?;
        let get = |n| {
            meta.iter().find_map(|(f, v)| match v {
                Ok(x) if *f == n => Some(*x),
                _ => None,
            })
        };
        return match (get(1), get(2)) {
            (Some(member_id), Some(cluster_id)) if member_id != 0 => Ok(WalIdentity {
                member_id,
                cluster_id,
            }),
            _ => Err(WalParseError::BadRecord(frame_start)),
        };
    }
    Err(WalParseError::NoMetadata)
}

/// The WAL files of `wal_dir`, in etcd's order (their names: sequence, then first index).
pub(super) fn wal_files(wal_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(wal_dir) {
        Ok(entries) => entries,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(vec![])
        }
        Err(e) => return Err(e),
    };
    let mut wals: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    wals.sort();
    Ok(wals)
}

/// The raft index a WAL file's name says its first entry has (`<seq>-<index>.wal`).
fn first_index_of(path: &Path) -> Option<u64> {
    let stem = path.file_stem()?.to_str()?;
    let (_, index) = stem.split_once('-')?;
    u64::from_str_radix(index, 16).ok()
}

/// How far the log on this volume goes, read from its last WAL file (etcd starts every
/// file with the hard state, so the last one holds the newest commit index). `None` when
/// there is no WAL. Reads while etcd runs are fine: a torn tail ends the scan.
pub fn tail(wal_dir: &Path) -> std::io::Result<Option<WalTail>> {
    let wals = wal_files(wal_dir)?;
    let Some(last) = wals.last() else {
        return Ok(None);
    };
    let file = std::fs::File::open(last)?;
    let mut tail = scan_tail(std::io::BufReader::with_capacity(256 * 1024, file));
    if let Some(first) = first_index_of(last) {
        // A file just cut holds no entry yet: the log ends right before its first index.
        if tail.last_index < first.saturating_sub(1) {
            tail.last_index = first.saturating_sub(1);
        }
    }
    Ok(Some(tail))
}

fn number(fields: &[(u64, FieldValue<'_>)], n: u64) -> u64 {
    fields
        .iter()
        .rev()
        .find_map(|(f, v)| match v {
            Ok(x) if *f == n => Some(*x),
            _ => None,
        })
        .unwrap_or(0)
}

/// Where a scan of one WAL file stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// At a zero length word (etcd's preallocated zeros) or the file's end: every record
    /// before `end` was read whole.
    End,
    /// At something that is not a whole record (a torn write, or garbage).
    Torn,
    /// At a record whose CRC does not continue the file's chain.
    Crc,
}

/// One WAL file, scanned: the log's tail as that file has it, and what a record appended
/// after its last one must carry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scan {
    tail: WalTail,
    /// The vote of the newest hard state.
    vote: u64,
    /// Whether the file holds a hard state at all (etcd writes one at each file's start).
    has_state: bool,
    /// The byte offset right after the last whole record.
    end: u64,
    /// The CRC chain's value after the last whole record.
    crc: u32,
    stop: Stop,
}

/// Scans WAL frames to their end (a zero length word: etcd preallocates files with
/// zeros) or to the first frame that is torn or not a record. Entries overwrite on a
/// conflict, so the last entry record read is the end of the log.
pub fn scan_tail(r: impl Read) -> WalTail {
    scan(r).tail
}

pub(super) fn scan(mut r: impl Read) -> Scan {
    let mut s = Scan {
        tail: WalTail::default(),
        vote: 0,
        has_state: false,
        end: 0,
        crc: 0,
        stop: Stop::End,
    };
    let mut record = Vec::new();
    loop {
        let mut word = [0u8; 8];
        match read_full(&mut r, &mut word) {
            0 => break,
            8 => {}
            _ => {
                s.stop = Stop::Torn;
                break;
            }
        }
        let word = u64::from_le_bytes(word);
        if word == 0 {
            break;
        }
        let Ok(len) = usize::try_from(word & 0x00ff_ffff_ffff_ffff) else {
            s.stop = Stop::Torn;
            break;
        };
        let pad = if word & (0x80 << 56) != 0 {
            ((word >> 56) & 0x7) as usize
        } else {
            0
        };
        if len == 0 || len > WAL_MAX_RECORD_BYTES {
            s.stop = Stop::Torn;
            break;
        }
        // The length word counts the record; its padding follows it.
        // Read what is there (a torn or lying length word allocates no more than that).
        record.clear();
        let want = len + pad;
        match (&mut r).take(want as u64).read_to_end(&mut record) {
            Ok(n) if n == want => {}
            _ => {
                s.stop = Stop::Torn;
                break;
            }
        }
        let Some(rec) = fields(&record[..len]) else {
            s.stop = Stop::Torn;
            break;
        };
        let data = rec
            .iter()
            .find_map(|(f, v)| match (f, v) {
                (3, Err(b)) => Some(*b),
                _ => None,
            })
            .unwrap_or(&[]);
        let Some(inner) = fields(data) else {
            s.stop = Stop::Torn;
            break;
        };
        let rtype = number(&rec, 1);
        let stored = u32::try_from(number(&rec, 2)).unwrap_or(u32::MAX);
        if rtype == WAL_RECORD_CRC {
            // A file's first record carries the chain's value at the end of the file
            // before it; the chain goes on from there.
            if s.crc != 0 && stored != s.crc {
                s.stop = Stop::Crc;
                break;
            }
            s.crc = stored;
        } else {
            let crc = crc32c::extend(s.crc, data);
            if crc != stored {
                s.stop = Stop::Crc;
                break;
            }
            s.crc = crc;
        }
        match rtype {
            WAL_RECORD_ENTRY => {
                // raftpb.Entry: Term = 2, Index = 3.
                s.tail.last_term = number(&inner, 2);
                s.tail.last_index = number(&inner, 3);
            }
            WAL_RECORD_STATE => {
                // raftpb.HardState: term = 1, vote = 2, commit = 3.
                s.tail.term = number(&inner, 1);
                s.vote = number(&inner, 2);
                s.tail.commit = number(&inner, 3);
                s.has_state = true;
            }
            WAL_RECORD_SNAPSHOT => {
                // walpb.Snapshot: index = 1, term = 2; the log goes on from there.
                let index = number(&inner, 1);
                if index > s.tail.last_index {
                    s.tail.last_index = index;
                    s.tail.last_term = number(&inner, 2);
                }
            }
            _ => {}
        }
        s.end += (8 + want) as u64;
    }
    s.tail.clean_end = s.stop == Stop::End;
    s
}

/// Reads into `buf` until it is full or the reader ends; returns how many bytes it read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n
}
