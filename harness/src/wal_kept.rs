//! "No data deleted, only set aside", checked on the data itself: the WAL files of every
//! pod's etcd, recorded before each fault, must all still be on the pod's volume at the end —
//! in the live `member/wal/` or in a `set-aside/**/member/wal/` — unless the schedule lost
//! that volume on purpose. A sentinel file beside the data ([`crate::chaos::Sentinels`])
//! proves only that the folder survived; this proves its contents did.
//!
//! What may change, and why the comparison cannot flag it:
//! - A **closed** segment (every `.wal` but the newest) never changes again: it is compared
//!   by name, size and its first bytes.
//! - The **newest** segment is still written: etcd preallocates it (64 MiB) and truncates it
//!   to its written length when it cuts the next one, so its size may shrink; its first bytes
//!   (the CRC and metadata records, synced before the segment gets its `.wal` name: they
//!   carry the member's and the cluster's IDs) never change. It is compared by name and those
//!   bytes.
//! - etcd **purges** old segments itself (`--max-wals`, 5 by default, which the agent does
//!   not change): it removes the oldest only while more than 5 remain, and it only ever adds
//!   newer ones. So a segment may be missing only from a directory that holds at least 5
//!   segments named after it (names are `<sequence>-<index>.wal`, in order); short
//!   schedules never get there (a segment holds 64 MiB), and no other absence is excused.
//! - The **database** (`member/snap/db`) shrinks when it is defragmented: it must be there,
//!   not empty, beside the WAL; its size is recorded, not compared.

use std::path::{Path, PathBuf};

/// The bytes of a segment compared: the CRC record (16 bytes) and the start of the
/// metadata record, both written and synced before etcd names the segment `.wal`.
pub const HEAD: usize = 48;

/// etcd's `--max-wals` default: a segment is purged only while more than this many remain.
pub const MAX_WALS: usize = 5;

/// One WAL segment as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalFile {
    /// `<sequence>-<index>.wal`.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its first [`HEAD`] bytes.
    pub head: Vec<u8>,
}

/// What one data directory held at one moment: its segments, by name, and its database's
/// size (0: none yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSeen {
    /// The `.wal` segments, ordered by name (the newest last).
    pub wal: Vec<WalFile>,
    /// The size of `snap/db`.
    pub db: u64,
}

impl DataSeen {
    /// What `member` (a `member/` directory) holds; `None` when it holds no WAL segment.
    pub fn read(member: &Path) -> Option<DataSeen> {
        let mut wal = Vec::new();
        for e in std::fs::read_dir(member.join("wal")).ok()?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".wal") {
                continue;
            }
            let Ok(bytes) = read_head(&e.path()) else {
                continue;
            };
            let size = e.metadata().map(|m| m.len()).unwrap_or(0);
            wal.push(WalFile {
                name,
                size,
                head: bytes,
            });
        }
        if wal.is_empty() {
            return None;
        }
        wal.sort_by(|a, b| a.name.cmp(&b.name));
        let db = std::fs::metadata(member.join("snap/db")).map_or(0, |m| m.len());
        Some(DataSeen { wal, db })
    }

    /// Why `recorded` is not in this directory (`None`: it is, as far as etcd may have
    /// changed it since; see the module's doc).
    pub fn lacks(&self, recorded: &DataSeen) -> Option<String> {
        let newest = recorded.wal.len().saturating_sub(1);
        for (i, f) in recorded.wal.iter().enumerate() {
            let purgeable = self.wal.iter().filter(|n| n.name > f.name).count() >= MAX_WALS;
            let found = self.wal.iter().find(|n| n.name == f.name);
            match found {
                None if purgeable => {}
                None => return Some(format!("{} ({} bytes) is gone", f.name, f.size)),
                Some(n) if n.head != f.head => {
                    return Some(format!("{} is another segment now (its first bytes differ)", f.name))
                }
                Some(n) if i < newest && n.size != f.size => {
                    return Some(format!(
                        "{}, closed at {} bytes, now holds {}",
                        f.name, f.size, n.size
                    ))
                }
                Some(_) => {}
            }
        }
        (recorded.db > 0 && self.db == 0).then(|| {
            format!(
                "snap/db ({} bytes when recorded) is gone from beside the WAL",
                recorded.db
            )
        })
    }
}

fn read_head(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(HEAD);
    std::fs::File::open(path)?
        .take(HEAD as u64)
        .read_to_end(&mut head)?;
    Ok(head)
}

/// Every `member/` directory on a volume holding a WAL: the live one and those set aside.
fn data_dirs(volume: &Path) -> Vec<PathBuf> {
    let mut found = vec![volume.join("member")];
    let mut stack = vec![volume.join("set-aside")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name() == "member" {
                found.push(e.path());
            } else {
                stack.push(e.path());
            }
        }
    }
    found
}

/// The data each pod held before each fault, and whether the schedule lost its volume since.
#[derive(Debug, Default)]
pub struct WalRecords {
    recorded: Vec<(u32, DataSeen, bool)>,
}

impl WalRecords {
    /// Records what pod `o`'s live data directory (`volume/member`) holds, when it holds a
    /// WAL that differs from its last record.
    pub fn record(&mut self, o: u32, volume: &Path) {
        let Some(seen) = DataSeen::read(&volume.join("member")) else {
            return;
        };
        let last = self.recorded.iter().rev().find(|(p, _, _)| *p == o);
        if last.is_some_and(|(_, s, lost)| !lost && *s == seen) {
            return;
        }
        self.recorded.push((o, seen, false));
    }

    /// Pod `o`'s volume is lost on purpose: what it held is exempt.
    pub fn volume_lost(&mut self, o: u32) {
        for (p, _, lost) in &mut self.recorded {
            if *p == o {
                *lost = true;
            }
        }
    }

    /// How many records will be checked.
    pub fn count(&self) -> usize {
        self.recorded.iter().filter(|(_, _, lost)| !lost).count()
    }

    /// The records of volumes never lost that no data directory on their pod's volume
    /// still holds, each with what the first data directory found (the live one when it
    /// holds a WAL) lacks.
    pub fn missing(&self, volume_of: impl Fn(u32) -> PathBuf) -> Vec<(u32, String)> {
        let mut missing = Vec::new();
        for (o, recorded, lost) in &self.recorded {
            if *lost {
                continue;
            }
            let volume = volume_of(*o);
            let dirs: Vec<DataSeen> = data_dirs(&volume)
                .iter()
                .filter_map(|d| DataSeen::read(d))
                .collect();
            if dirs.iter().any(|d| d.lacks(recorded).is_none()) {
                continue;
            }
            let why = match dirs.first() {
                Some(d) => d.lacks(recorded).unwrap_or_default(),
                None => "no data directory with a WAL is left on the volume".into(),
            };
            let names: Vec<&str> = recorded.wal.iter().map(|f| f.name.as_str()).collect();
            missing.push((
                *o,
                format!(
                    "WAL {names:?} (and a {} byte snap/db) recorded before a fault is on no data directory of {}, live or set aside: {why}",
                    recorded.db,
                    volume.display()
                ),
            ));
        }
        missing
    }
}
