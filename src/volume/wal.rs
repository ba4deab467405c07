//! Reads a WAL's head: does the volume hold etcd data, and whose (member and cluster ID
//! from the WAL's metadata record). A strict, bounded parser: its input is whatever lies on
//! the volume.

use std::io::Read;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::facts::{WalIdentity, WalState, WalTail};

const WAL_RECORD_METADATA: u64 = 1;
const WAL_RECORD_ENTRY: u64 = 2;
const WAL_RECORD_STATE: u64 = 3;
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

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
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
fn wal_files(wal_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
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

/// Scans WAL frames to their end (a zero length word: etcd preallocates files with
/// zeros) or to the first frame that is torn or not a record. Entries overwrite on a
/// conflict, so the last entry record read is the end of the log.
pub fn scan_tail(mut r: impl Read) -> WalTail {
    let mut tail = WalTail::default();
    let mut record = Vec::new();
    loop {
        let mut word = [0u8; 8];
        if r.read_exact(&mut word).is_err() {
            break;
        }
        let word = u64::from_le_bytes(word);
        let Ok(len) = usize::try_from(word & 0x00ff_ffff_ffff_ffff) else {
            break;
        };
        let pad = if word & (0x80 << 56) != 0 {
            ((word >> 56) & 0x7) as usize
        } else {
            0
        };
        if len == 0 || len > WAL_MAX_RECORD_BYTES {
            break;
        }
        // The length word counts the record; its padding follows it.
        // Read what is there (a torn or lying length word allocates no more than that).
        record.clear();
        let want = len + pad;
        match (&mut r).take(want as u64).read_to_end(&mut record) {
            Ok(n) if n == want => {}
            _ => break,
        }
        let Some(rec) = fields(&record[..len]) else {
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
            break;
        };
        match number(&rec, 1) {
            WAL_RECORD_ENTRY => {
                // raftpb.Entry: Term = 2, Index = 3.
                tail.last_term = number(&inner, 2);
                tail.last_index = number(&inner, 3);
            }
            WAL_RECORD_STATE => {
                // raftpb.HardState: term = 1, commit = 3.
                tail.term = number(&inner, 1);
                tail.commit = number(&inner, 3);
            }
            WAL_RECORD_SNAPSHOT => {
                // walpb.Snapshot: index = 1, term = 2; the log goes on from there.
                let index = number(&inner, 1);
                if index > tail.last_index {
                    tail.last_index = index;
                    tail.last_term = number(&inner, 2);
                }
            }
            _ => {}
        }
    }
    tail
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn frame(record: &[u8]) -> Vec<u8> {
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

    fn varint_bytes(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    /// A WAL head as etcd writes it: a crc record, then the metadata record.
    pub(crate) fn wal_head(member: u64, cluster: u64) -> Vec<u8> {
        let mut meta = vec![0x08];
        meta.extend(varint_bytes(member));
        meta.push(0x10);
        meta.extend(varint_bytes(cluster));
        let mut rec = vec![0x08, 0x01, 0x10, 0x05, 0x1a];
        rec.extend(varint_bytes(meta.len() as u64));
        rec.extend(meta);
        let mut out = frame(&[0x08, 0x04, 0x10, 0x00]);
        out.extend(frame(&rec));
        out
    }

    fn record(rtype: u64, data: &[u8]) -> Vec<u8> {
        let mut rec = vec![0x08];
        rec.extend(varint_bytes(rtype));
        rec.push(0x1a);
        rec.extend(varint_bytes(data.len() as u64));
        rec.extend_from_slice(data);
        frame(&rec)
    }

    fn message(fields: &[(u8, u64)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, v) in fields {
            out.push(n << 3);
            out.extend(varint_bytes(*v));
        }
        out
    }

    #[test]
    fn tail_reads_the_last_entry_and_the_newest_hard_state() {
        let mut wal = wal_head(7, 9);
        wal.extend(record(
            WAL_RECORD_STATE,
            &message(&[(1, 2), (2, 1), (3, 10)]),
        ));
        for index in 11..=14 {
            wal.extend(record(WAL_RECORD_ENTRY, &message(&[(2, 3), (3, index)])));
        }
        wal.extend(record(
            WAL_RECORD_STATE,
            &message(&[(1, 3), (2, 1), (3, 13)]),
        ));
        // A conflict: entry 14 is overwritten at term 4, the log now ends at 14 of term 4.
        wal.extend(record(WAL_RECORD_ENTRY, &message(&[(2, 4), (3, 14)])));
        wal.extend([0u8; 4096]);
        assert_eq!(
            scan_tail(&wal[..]),
            WalTail {
                last_index: 14,
                last_term: 4,
                commit: 13,
                term: 3
            }
        );
    }

    #[test]
    fn a_torn_last_record_ends_the_scan_with_what_came_before() {
        let mut wal = wal_head(7, 9);
        wal.extend(record(WAL_RECORD_STATE, &message(&[(1, 2), (3, 5)])));
        wal.extend(record(WAL_RECORD_ENTRY, &message(&[(2, 2), (3, 6)])));
        let whole = wal.len();
        wal.extend(record(WAL_RECORD_ENTRY, &message(&[(2, 2), (3, 7)])));
        let torn = &wal[..whole + 9];
        let t = scan_tail(torn);
        assert_eq!((t.last_index, t.commit), (6, 5));
    }

    #[test]
    fn a_snapshot_record_moves_the_log_start() {
        let mut wal = wal_head(7, 9);
        wal.extend(record(WAL_RECORD_SNAPSHOT, &message(&[(1, 100), (2, 5)])));
        wal.extend(record(WAL_RECORD_STATE, &message(&[(1, 5), (3, 100)])));
        let t = scan_tail(&wal[..]);
        assert_eq!((t.last_index, t.last_term, t.commit), (100, 5, 100));
    }

    #[test]
    fn a_file_just_cut_ends_the_log_before_its_first_index() -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let mut wal = wal_head(7, 9);
        wal.extend(record(WAL_RECORD_STATE, &message(&[(1, 5), (3, 41)])));
        std::fs::write(
            tmp.path().join("0000000000000000-0000000000000000.wal"),
            wal_head(7, 9),
        )?;
        std::fs::write(
            tmp.path().join("0000000000000001-000000000000002a.wal"),
            &wal,
        )?;
        let t = tail(tmp.path())?;
        assert_eq!(t.map(|t| (t.last_index, t.commit)), Some((41, 41)));
        assert_eq!(tail(&tmp.path().join("missing"))?, None);
        Ok(())
    }

    #[test]
    fn wal_metadata_gives_member_and_cluster_id() {
        let head = wal_head(0xfca2_43bc_c8d8_f651, 0x64f3_ae8b_1535_4f88);
        assert_eq!(
            parse_wal_metadata(&head),
            Ok(WalIdentity {
                member_id: 0xfca2_43bc_c8d8_f651,
                cluster_id: 0x64f3_ae8b_1535_4f88
            })
        );
    }

    #[test]
    fn truncated_or_garbage_wal_is_reported_not_trusted() {
        let head = wal_head(7, 9);
        assert!(matches!(
            parse_wal_metadata(&head[..20]),
            Err(WalParseError::Truncated(_))
        ));
        assert!(parse_wal_metadata(b"garbage garbage garbage!").is_err());
        assert_eq!(
            parse_wal_metadata(&[0u8; 64]),
            Err(WalParseError::NoMetadata)
        );
    }
}
