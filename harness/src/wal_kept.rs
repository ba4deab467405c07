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
                    return Some(format!(
                        "{} is another segment now (its first bytes differ)",
                        f.name
                    ))
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const FIRST: &str = "0000000000000000-0000000000000000.wal";
    const SECOND: &str = "0000000000000001-00000000000000a0.wal";

    /// A segment of `len` bytes whose first bytes say `member`.
    fn segment(path: &Path, member: u8, len: usize) {
        let mut bytes = vec![member; HEAD];
        bytes.resize(len, 0);
        std::fs::write(path, bytes).unwrap();
    }

    /// A live data directory: a closed segment, the newest one, and a database.
    fn data(volume: &Path, member: u8) {
        let wal = volume.join("member/wal");
        std::fs::create_dir_all(&wal).unwrap();
        std::fs::create_dir_all(volume.join("member/snap")).unwrap();
        segment(&wal.join(FIRST), member, 1000);
        segment(&wal.join(SECOND), member + 1, 4096);
        std::fs::write(volume.join("member/snap/db"), vec![1; 300]).unwrap();
        std::fs::write(wal.join("0.tmp"), vec![0; 4096]).unwrap();
    }

    #[test]
    fn wal_files_set_aside_are_found_and_wal_files_deleted_beside_a_kept_folder_are_missing() {
        let root = tempfile::tempdir().unwrap();
        let vol = |o: u32| root.path().join(format!("pod-{o}"));
        let mut r = WalRecords::default();
        for o in 0..4 {
            r.record(o, &vol(o)); // nothing yet: nothing recorded
            data(&vol(o), 10 * o as u8 + 1);
            r.record(o, &vol(o));
            r.record(o, &vol(o)); // the same again: one record
        }
        assert_eq!(r.count(), 4);
        assert!(r.missing(vol).is_empty(), "{:?}", r.missing(vol));
        // Pod 0's data set aside the way the agent does it, and a new member's data live,
        // with a segment of the same name.
        std::fs::create_dir_all(vol(0).join("set-aside/7-removed-member")).unwrap();
        std::fs::rename(
            vol(0).join("member"),
            vol(0).join("set-aside/7-removed-member/member"),
        )
        .unwrap();
        data(&vol(0), 99);
        // Pod 1's WAL and database deleted, its folder kept (a sentinel there survives).
        std::fs::remove_dir_all(vol(1).join("member/wal")).unwrap();
        std::fs::remove_dir_all(vol(1).join("member/snap")).unwrap();
        std::fs::create_dir_all(vol(1).join("member/wal")).unwrap();
        // Pod 2's newest segment cut short by etcd (it truncates a segment when it cuts the
        // next), its database defragmented smaller: both as etcd may leave them.
        let wal2 = vol(2).join("member/wal");
        segment(&wal2.join(SECOND), 22, 2000);
        std::fs::write(vol(2).join("member/snap/db"), vec![1; 100]).unwrap();
        // Pod 3's volume lost on purpose.
        std::fs::remove_dir_all(vol(3)).unwrap();
        r.volume_lost(3);
        let missing = r.missing(vol);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert_eq!(missing[0].0, 1);
        assert!(missing[0].1.contains(FIRST), "{missing:?}");
        // The new live data of pod 0 is recorded in turn.
        r.record(0, &vol(0));
        assert_eq!(r.count(), 4);
    }

    #[test]
    fn a_closed_segment_changed_a_segment_replaced_or_a_database_gone_is_missing() {
        let root = tempfile::tempdir().unwrap();
        let vol = |o: u32| root.path().join(format!("pod-{o}"));
        let mut r = WalRecords::default();
        for o in 0..3 {
            data(&vol(o), 1);
            r.record(o, &vol(o));
        }
        // A closed segment is never written again.
        segment(&vol(0).join("member/wal").join(FIRST), 1, 500);
        // Another member's segment of the same name (a volume emptied and joined again).
        segment(&vol(1).join("member/wal").join(SECOND), 77, 4096);
        // The database gone from beside the WAL.
        std::fs::remove_file(vol(2).join("member/snap/db")).unwrap();
        let missing: Vec<u32> = r.missing(vol).into_iter().map(|(o, _)| o).collect();
        assert_eq!(missing, vec![0, 1, 2]);
    }

    #[test]
    fn a_segment_is_excused_only_where_etcd_could_have_purged_it() {
        let root = tempfile::tempdir().unwrap();
        let vol = |o: u32| root.path().join(format!("pod-{o}"));
        let mut r = WalRecords::default();
        for o in 0..2 {
            data(&vol(o), 1);
            r.record(o, &vol(o));
        }
        // Pod 0: five segments newer than the first, which etcd then purged; pod 1: four.
        for (o, newer) in [(0u32, 5u64), (1, 4)] {
            let wal = vol(o).join("member/wal");
            for k in 0..newer - 1 {
                segment(
                    &wal.join(format!("{:016x}-{:016x}.wal", k + 2, 0x100 * k)),
                    3,
                    10,
                );
            }
            std::fs::remove_file(wal.join(FIRST)).unwrap();
        }
        let missing: Vec<u32> = r.missing(vol).into_iter().map(|(o, _)| o).collect();
        assert_eq!(missing, vec![1]);
    }
}
