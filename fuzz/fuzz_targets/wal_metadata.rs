//! The data directory's WAL can be truncated or garbage: reading its head (and scanning its
//! tail for a recovery's evidence) must never panic, and a member ID it yields is never zero.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = etcd_steward::volume::wal::parse_wal_metadata(data) {
        assert_ne!(id.member_id, 0);
    }
    let _ = etcd_steward::volume::wal::scan_tail(data);
});
