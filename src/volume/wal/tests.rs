//! The WAL parser and the commit patch, on WAL files written as etcd writes them.

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
