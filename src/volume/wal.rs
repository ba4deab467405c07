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
const WAL_RECORD_CRC: u64 = 4;
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

/// Where a scan of one WAL file stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
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
struct Scan {
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

fn scan(mut r: impl Read) -> Scan {
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

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
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

/// CRC-32C (Castagnoli), the checksum etcd chains through its WAL records.
mod crc32c {
    const POLY: u32 = 0x82f6_3b78;

    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };

    /// Continues a CRC-32C whose value so far is `crc` over `data`.
    pub fn extend(crc: u32, data: &[u8]) -> u32 {
        let mut c = !crc;
        for b in data {
            c = TABLE[((c ^ u32::from(*b)) & 0xff) as usize] ^ (c >> 8);
        }
        !c
    }

    #[test]
    fn the_check_value_of_crc32c_is_e3069283() {
        assert_eq!(extend(0, b"123456789"), 0xe306_9283);
        assert_eq!(extend(extend(0, b"1234"), b"56789"), 0xe306_9283);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A WAL file as etcd writes it: frames whose records chain a CRC-32C.
    pub(crate) struct WalFile {
        pub(crate) bytes: Vec<u8>,
        crc: u32,
    }

    impl WalFile {
        /// A file's start: the crc record carrying `prev_crc`, then the metadata record.
        pub(crate) fn head(member: u64, cluster: u64, prev_crc: u32) -> WalFile {
            let mut f = WalFile {
                bytes: Vec::new(),
                crc: prev_crc,
            };
            f.raw(WAL_RECORD_CRC, prev_crc, &[]);
            let mut meta = vec![0x08];
            put_varint(&mut meta, member);
            meta.push(0x10);
            put_varint(&mut meta, cluster);
            f.record(WAL_RECORD_METADATA, &meta);
            f
        }

        fn raw(&mut self, rtype: u64, crc: u32, data: &[u8]) {
            let mut rec = vec![0x08];
            put_varint(&mut rec, rtype);
            rec.push(0x10);
            put_varint(&mut rec, u64::from(crc));
            if rtype != WAL_RECORD_CRC {
                rec.push(0x1a);
                put_varint(&mut rec, data.len() as u64);
                rec.extend_from_slice(data);
            }
            self.bytes.extend(frame(&rec));
        }

        pub(crate) fn record(&mut self, rtype: u64, data: &[u8]) -> &mut Self {
            self.crc = crc32c::extend(self.crc, data);
            self.raw(rtype, self.crc, data);
            self
        }

        pub(crate) fn state(&mut self, term: u64, vote: u64, commit: u64) -> &mut Self {
            self.record(
                WAL_RECORD_STATE,
                &message(&[(1, term), (2, vote), (3, commit)]),
            )
        }

        pub(crate) fn entry(&mut self, term: u64, index: u64) -> &mut Self {
            self.record(WAL_RECORD_ENTRY, &message(&[(2, term), (3, index)]))
        }
    }

    /// A WAL head as etcd writes it: a crc record, then the metadata record.
    pub(crate) fn wal_head(member: u64, cluster: u64) -> Vec<u8> {
        WalFile::head(member, cluster, 0).bytes
    }

    fn message(fields: &[(u8, u64)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, v) in fields {
            out.push(n << 3);
            put_varint(&mut out, *v);
        }
        out
    }

    /// etcd's preallocated zeros after the records.
    const PREALLOCATED: [u8; 4096] = [0u8; 4096];

    #[test]
    fn tail_reads_the_last_entry_and_the_newest_hard_state() {
        let mut wal = WalFile::head(7, 9, 0);
        wal.state(2, 1, 10);
        for index in 11..=14 {
            wal.entry(3, index);
        }
        wal.state(3, 1, 13);
        // A conflict: entry 14 is overwritten at term 4, the log now ends at 14 of term 4.
        wal.entry(4, 14);
        wal.bytes.extend(PREALLOCATED);
        assert_eq!(
            scan_tail(&wal.bytes[..]),
            WalTail {
                last_index: 14,
                last_term: 4,
                commit: 13,
                term: 3,
                clean_end: true,
            }
        );
    }

    #[test]
    fn a_torn_last_record_ends_the_scan_with_what_came_before() {
        let mut wal = WalFile::head(7, 9, 0);
        wal.state(2, 0, 5).entry(2, 6);
        let whole = wal.bytes.len();
        wal.entry(2, 7);
        let torn = &wal.bytes[..whole + 9];
        let t = scan_tail(torn);
        assert_eq!((t.last_index, t.commit, t.clean_end), (6, 5, false));
    }

    #[test]
    fn a_snapshot_record_moves_the_log_start() {
        let mut wal = WalFile::head(7, 9, 0);
        wal.record(WAL_RECORD_SNAPSHOT, &message(&[(1, 100), (2, 5)]));
        wal.state(5, 0, 100);
        let t = scan_tail(&wal.bytes[..]);
        assert_eq!((t.last_index, t.last_term, t.commit), (100, 5, 100));
    }

    #[test]
    fn a_file_just_cut_ends_the_log_before_its_first_index() -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let mut wal = WalFile::head(7, 9, 0x1234);
        wal.state(5, 0, 41);
        std::fs::write(
            tmp.path().join("0000000000000000-0000000000000000.wal"),
            wal_head(7, 9),
        )?;
        std::fs::write(
            tmp.path().join("0000000000000001-000000000000002a.wal"),
            &wal.bytes,
        )?;
        let t = tail(tmp.path())?;
        assert_eq!(t.map(|t| (t.last_index, t.commit)), Some((41, 41)));
        assert_eq!(tail(&tmp.path().join("missing"))?, None);
        Ok(())
    }

    /// A file whose log ends at 14 while its newest hard state commits 12.
    fn lagging(prev_crc: u32) -> WalFile {
        let mut wal = WalFile::head(7, 9, prev_crc);
        wal.state(3, 2, 10);
        for index in 11..=14 {
            wal.entry(3, index);
        }
        wal.state(3, 2, 12);
        wal
    }

    #[test]
    fn a_commit_index_behind_the_last_entry_is_moved_to_it_with_term_and_vote_kept() {
        let mut wal = lagging(0);
        let end = wal.bytes.len();
        let mut file = wal.bytes.clone();
        file.extend(PREALLOCATED);
        let patch = commit_patch(&file).ok().flatten();
        let Some(patch) = patch else {
            panic!("no patch for a lagging commit index");
        };
        assert_eq!((patch.offset, patch.from, patch.to), (end as u64, 12, 14));
        // Exactly the record etcd would write for HardState{term 3, vote 2, commit 14}.
        wal.state(3, 2, 14);
        assert_eq!(patch.bytes, wal.bytes[end..]);
        // Written over the preallocated zeros, the file reads as committed to its end.
        file[end..end + patch.bytes.len()].copy_from_slice(&patch.bytes);
        let s = scan(&file[..]);
        assert_eq!(
            (s.stop, s.tail.commit, s.tail.term, s.vote),
            (Stop::End, 14, 3, 2)
        );
        assert_eq!(s.end, wal.bytes.len() as u64);
        // Once patched there is nothing left to do: a rerun writes nothing.
        assert_eq!(commit_patch(&file), Ok(None));
    }

    #[test]
    fn the_patch_frame_is_padded_to_eight_bytes_and_says_so_in_its_length_word() {
        for commit in [14u64, 200, 70_000, u64::from(u32::MAX) + 7] {
            let mut wal = WalFile::head(7, 9, 0);
            wal.state(3, 2, 10).entry(3, commit);
            let Ok(Some(patch)) = commit_patch(&wal.bytes) else {
                panic!("no patch");
            };
            assert_eq!(patch.bytes.len() % 8, 0, "aligned");
            let word = u64::from_le_bytes(patch.bytes[..8].try_into().unwrap_or_default());
            let len = (word & 0x00ff_ffff_ffff_ffff) as usize;
            let pad = patch.bytes.len() - 8 - len;
            if pad == 0 {
                assert_eq!(word >> 56, 0);
            } else {
                assert_eq!(word >> 56, 0x80 | pad as u64);
                assert!(patch.bytes[8 + len..].iter().all(|b| *b == 0));
            }
            assert_eq!(patch.to, commit);
        }
    }

    #[test]
    fn the_patch_continues_the_crc_chain_of_a_file_that_starts_from_an_earlier_one() {
        // A second file starts with the first file's final CRC: the patch chains from it.
        let mut wal = lagging(0xdead_beef);
        let end = wal.bytes.len();
        let Ok(Some(patch)) = commit_patch(&wal.bytes) else {
            panic!("no patch");
        };
        wal.state(3, 2, 14);
        assert_eq!(patch.bytes, wal.bytes[end..]);
        // The same records after another starting CRC give another record.
        let Ok(Some(other)) = commit_patch(&lagging(0x0bad_cafe).bytes) else {
            panic!("no patch");
        };
        assert_ne!(other.bytes, patch.bytes);
    }

    #[test]
    fn a_torn_tail_is_not_patched() {
        let wal = lagging(0);
        let mut torn = wal.bytes.clone();
        // A record cut short: its length word promises more than there is.
        let mut half = lagging(0);
        half.entry(3, 15);
        torn.extend_from_slice(&half.bytes[wal.bytes.len()..wal.bytes.len() + 12]);
        assert_eq!(
            commit_patch(&torn),
            Err(Unpatchable::TornTail {
                at: wal.bytes.len() as u64
            })
        );
        // Garbage after the records (not the preallocated zeros).
        let mut garbage = wal.bytes.clone();
        garbage.extend([0xffu8; 16]);
        assert!(matches!(
            commit_patch(&garbage),
            Err(Unpatchable::TornTail { .. })
        ));
    }

    #[test]
    fn a_broken_crc_chain_is_not_patched() {
        let mut wal = lagging(0);
        let at = wal.bytes.len();
        wal.entry(3, 15);
        // Flip one byte of the last record's data.
        let last = wal.bytes.len() - 1;
        let flip = (at..=last)
            .rev()
            .find(|i| wal.bytes[*i] != 0)
            .unwrap_or(last);
        wal.bytes[flip] ^= 0x01;
        assert_eq!(
            commit_patch(&wal.bytes),
            Err(Unpatchable::CrcMismatch { at: at as u64 })
        );
    }

    #[test]
    fn a_commit_index_at_the_last_entry_needs_nothing() {
        let mut wal = WalFile::head(7, 9, 0);
        wal.state(3, 2, 10)
            .entry(3, 11)
            .entry(3, 12)
            .state(3, 2, 12);
        wal.bytes.extend(PREALLOCATED);
        assert_eq!(commit_patch(&wal.bytes), Ok(None));
    }

    #[test]
    fn a_last_entry_of_a_newer_term_than_the_hard_state_is_not_patched() {
        let mut wal = WalFile::head(7, 9, 0);
        wal.state(3, 2, 10).entry(4, 11);
        assert_eq!(
            commit_patch(&wal.bytes),
            Err(Unpatchable::EntryNewerThanState {
                entry_term: 4,
                state_term: 3
            })
        );
    }

    #[test]
    fn patching_a_wal_directory_writes_once_and_fsyncs() -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let mut first = WalFile::head(7, 9, 0);
        first.state(2, 1, 3);
        let mut newest = lagging(first.crc);
        let end = newest.bytes.len();
        newest.bytes.extend(PREALLOCATED);
        std::fs::write(
            tmp.path().join("0000000000000000-0000000000000000.wal"),
            &first.bytes,
        )?;
        let path = tmp.path().join("0000000000000001-000000000000000a.wal");
        std::fs::write(&path, &newest.bytes)?;
        assert_eq!(reachable_commit(tmp.path())?, Some((14, None)));
        assert_eq!(
            patch_commit(tmp.path(), 15)?,
            Patched::Nothing,
            "not the log's end"
        );
        let moved = patch_commit(tmp.path(), 14)?;
        assert_eq!(
            moved,
            Patched::Moved {
                file: path.clone(),
                from: 12,
                to: 14
            }
        );
        let after = std::fs::read(&path)?;
        assert_eq!(after.len(), newest.bytes.len(), "written over the zeros");
        assert_eq!(after[..end], newest.bytes[..end]);
        assert_eq!(tail(tmp.path())?.map(|t| t.commit), Some(14));
        assert_eq!(patch_commit(tmp.path(), 14)?, Patched::Nothing);
        assert_eq!(std::fs::read(&path)?, after, "a rerun writes nothing");
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
