//! The data directory: does it hold etcd data (a `*.wal` under `member/wal`, as etcd
//! itself decides), whose member and cluster it is, and etcd-steward's own small files
//! under `member/steward/`. Data is never deleted here: what must go is renamed aside.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::report::{Formation, WalIdentity};

const WAL_RECORD_METADATA: u64 = 1;
/// How much of the first WAL file is read to find its metadata record.
const WAL_HEAD_BYTES: u64 = 64 * 1024;

/// What the data directory holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDirState {
    pub wal: WalState,
    /// Our formation marker, when a formation is (or was) under way for this volume.
    pub formation: Option<Formation>,
    /// Anomalies worth a line in the decision log (an unreadable marker, …).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalState {
    /// No `*.wal` file: etcd would treat this directory as empty.
    None,
    /// A WAL exists: etcd has data here. Its identity, or why it could not be read.
    Present(Result<WalIdentity, String>),
}

impl DataDirState {
    pub fn has_data(&self) -> bool {
        matches!(self.wal, WalState::Present(_))
    }

    pub fn wal_identity(&self) -> Option<WalIdentity> {
        match &self.wal {
            WalState::Present(Ok(id)) => Some(*id),
            _ => None,
        }
    }
}

#[derive(Debug, Error)]
pub enum DataDirError {
    #[error("data directory {path:?} is not a directory; point --data-dir at the etcd volume")]
    NotADirectory { path: PathBuf },
    #[error("cannot read data directory {path:?}: {source}; check the volume and its permissions")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write in data directory {path:?}: {source}; check the volume is writable and not full")]
    Unwritable {
        path: PathBuf,
        source: std::io::Error,
    },
}

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

fn member_dir(dir: &Path) -> PathBuf {
    dir.join("member")
}

fn steward_dir(dir: &Path) -> PathBuf {
    dir.join("member").join("steward")
}

fn formation_path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("formation.json")
}

fn decisions_path(dir: &Path) -> PathBuf {
    steward_dir(dir).join("decisions.jsonl")
}

/// Looks at the data directory without changing it. A missing directory is empty.
pub fn inspect(dir: &Path) -> Result<DataDirState, DataDirError> {
    let unreadable = |source| DataDirError::Unreadable {
        path: dir.to_path_buf(),
        source,
    };
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(DataDirError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        Ok(_) => {
            std::fs::read_dir(dir).map_err(unreadable)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(DataDirState {
                wal: WalState::None,
                formation: None,
                notes: vec![],
            });
        }
        Err(e) => return Err(unreadable(e)),
    }
    let mut notes = Vec::new();
    let wal = inspect_wal(&member_dir(dir).join("wal")).map_err(unreadable)?;
    let formation = match std::fs::read(formation_path(dir)) {
        Ok(bytes) => match serde_json::from_slice::<Formation>(&bytes) {
            Ok(f) => Some(f),
            Err(e) => {
                notes.push(format!("formation marker unreadable, ignored: {e}"));
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            notes.push(format!("formation marker unreadable, ignored: {e}"));
            None
        }
    };
    Ok(DataDirState {
        wal,
        formation,
        notes,
    })
}

fn inspect_wal(wal_dir: &Path) -> std::io::Result<WalState> {
    let entries = match std::fs::read_dir(wal_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(WalState::None),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Ok(WalState::None);
        }
        Err(e) => return Err(e),
    };
    let mut wals: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    wals.sort();
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

/// Creates the data directory (mode 0700, as etcd wants it) and checks it is writable.
pub fn prepare(dir: &Path) -> Result<(), DataDirError> {
    let unwritable = |source| DataDirError::Unwritable {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(unwritable)?;
    let probe = dir.join(".etcd-steward-write-test");
    std::fs::write(&probe, b"ok").map_err(unwritable)?;
    std::fs::remove_file(&probe).map_err(unwritable)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Writes (or replaces) our formation marker, durably.
pub fn write_formation(dir: &Path, formation: &Formation) -> Result<(), DataDirError> {
    let bytes = serde_json::to_vec(formation).unwrap_or_default();
    write_atomically(&formation_path(dir), &bytes).map_err(|source| DataDirError::Unwritable {
        path: dir.to_path_buf(),
        source,
    })
}

/// Moves `member/` (WAL, snapshots, our marker) to `set-aside/<stamp>-<why>/member`
/// inside the data directory and returns where it went; `None` when there was nothing.
pub fn set_aside(dir: &Path, why: &str, stamp: u64) -> Result<Option<PathBuf>, DataDirError> {
    let unwritable = |source| DataDirError::Unwritable {
        path: dir.to_path_buf(),
        source,
    };
    let member = member_dir(dir);
    if !member.exists() {
        return Ok(None);
    }
    let target_dir = dir.join("set-aside").join(format!("{stamp}-{why}"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&target_dir)
        .map_err(unwritable)?;
    let target = target_dir.join("member");
    std::fs::rename(&member, &target).map_err(unwritable)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(unwritable)?;
    Ok(Some(target))
}

/// Appends one decision (a JSON object) to `member/steward/decisions.jsonl`.
pub fn record_decision(dir: &Path, line: &serde_json::Value) -> Result<(), DataDirError> {
    let path = decisions_path(dir);
    let append = || -> std::io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(steward_dir(dir))?;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)?;
        writeln!(f, "{line}")?;
        f.sync_data()
    };
    append().map_err(|source| DataDirError::Unwritable {
        path: dir.to_path_buf(),
        source,
    })
}

/// The action of the last decision `init` recorded on this volume, if any.
pub fn last_decision(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(decisions_path(dir)).ok()?;
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let v = serde_json::from_str::<serde_json::Value>(line).ok()?;
    v.get("action")?.as_str().map(str::to_string)
}

/// How many times `init` took each action on this volume (read by the sidecar's metrics).
pub fn decision_counts(dir: &Path) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(decisions_path(dir)) else {
        return counts;
    };
    for line in text.lines() {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            if let Some(action) = v.get("action").and_then(|a| a.as_str()) {
                *counts.entry(action.to_string()).or_insert(0) += 1;
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
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

    fn temp() -> Result<tempfile::TempDir, DataDirError> {
        tempfile::tempdir().map_err(|source| DataDirError::Unreadable {
            path: "/tmp".into(),
            source,
        })
    }

    /// A data directory whose first WAL names `member` of `cluster`.
    fn temp_with_wal(member: u64, cluster: u64) -> Result<tempfile::TempDir, DataDirError> {
        let tmp = temp()?;
        let wal = tmp.path().join("member/wal");
        std::fs::create_dir_all(&wal).ok();
        std::fs::write(
            wal.join("0000000000000000-0000000000000000.wal"),
            wal_head(member, cluster),
        )
        .ok();
        Ok(tmp)
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

    #[test]
    fn a_directory_without_a_wal_is_empty_even_with_other_files() -> Result<(), DataDirError> {
        let tmp = temp()?;
        std::fs::create_dir_all(tmp.path().join("member/snap")).ok();
        std::fs::write(tmp.path().join("lost+found"), b"").ok();
        let state = inspect(tmp.path())?;
        assert_eq!(state.wal, WalState::None);
        assert!(!state.has_data());
        Ok(())
    }

    #[test]
    fn a_wal_file_means_data_and_names_its_member() -> Result<(), DataDirError> {
        let tmp = temp_with_wal(5, 6)?;
        let wal = tmp.path().join("member/wal");
        std::fs::write(wal.join("0.tmp"), b"preallocated").ok();
        let state = inspect(tmp.path())?;
        assert_eq!(
            state.wal_identity(),
            Some(WalIdentity {
                member_id: 5,
                cluster_id: 6
            })
        );
        Ok(())
    }

    #[test]
    fn set_aside_renames_member_and_keeps_every_byte() -> Result<(), DataDirError> {
        let tmp = temp_with_wal(5, 6)?;
        let moved = set_aside(tmp.path(), "removed-member", 42)?;
        let expected = tmp.path().join("set-aside/42-removed-member/member");
        assert_eq!(moved.as_deref(), Some(expected.as_path()));
        assert!(expected
            .join("wal/0000000000000000-0000000000000000.wal")
            .exists());
        assert!(!inspect(tmp.path())?.has_data());
        assert_eq!(set_aside(tmp.path(), "again", 43)?, None);
        Ok(())
    }

    #[test]
    fn formation_marker_and_decisions_round_trip() -> Result<(), DataDirError> {
        let tmp = temp()?;
        let f = Formation {
            nonce: "n".into(),
            initial_cluster: "a=b".into(),
            token: Some("t".into()),
        };
        write_formation(tmp.path(), &f)?;
        assert_eq!(inspect(tmp.path())?.formation, Some(f));
        assert_eq!(last_decision(tmp.path()), None);
        record_decision(tmp.path(), &serde_json::json!({"action": "resume"}))?;
        assert_eq!(last_decision(tmp.path()).as_deref(), Some("resume"));
        record_decision(tmp.path(), &serde_json::json!({"action": "restart"}))?;
        record_decision(tmp.path(), &serde_json::json!({"action": "restart"}))?;
        assert_eq!(decision_counts(tmp.path()).get("restart"), Some(&2));
        assert_eq!(last_decision(tmp.path()).as_deref(), Some("restart"));
        assert!(!inspect(tmp.path())?.has_data());
        Ok(())
    }

    #[test]
    fn a_file_in_place_of_the_directory_is_an_error() {
        let tmp = tempfile::NamedTempFile::new().ok();
        let path = tmp
            .as_ref()
            .map(|t| t.path().to_path_buf())
            .unwrap_or_default();
        assert!(matches!(
            inspect(&path),
            Err(DataDirError::NotADirectory { .. })
        ));
    }
}
