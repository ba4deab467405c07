//! A peer's report is bootstrap evidence from the network: any bytes must parse to a
//! checked report or an error, never panic, and a report that claims data carries it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(report) = etcd_steward::report::parse_report(data, "etcd-1") {
        assert_eq!(report.name, "etcd-1");
        assert!(report.has_data || report.wal.is_none());
    }
});
