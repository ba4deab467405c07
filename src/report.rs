//! The peer report: what a pod's sidecar tells other pods about its data directory.
//! It is bootstrap evidence, so parsing it is strict and bounded.

use thiserror::Error;

pub use crate::facts::{hex_id, Formation, PeerReport, WalIdentity};

/// The largest peer report accepted; a real one is a few hundred bytes.
pub const MAX_REPORT_BYTES: usize = 16 * 1024;

/// Why a peer's answer is not a report we can use as evidence.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ReportError {
    #[error("peer report is {0} bytes, more than the {MAX_REPORT_BYTES} allowed")]
    TooLarge(usize),
    #[error("peer report is not valid JSON of the expected shape: {0}")]
    Malformed(String),
    #[error("peer report names pod {got:?}, expected {expected:?}")]
    WrongPod { expected: String, got: String },
    #[error("peer report says it has no data but carries WAL identity")]
    Inconsistent,
}

/// Parses and checks a report that `expected` pod's sidecar sent.
pub fn parse_report(bytes: &[u8], expected: &str) -> Result<PeerReport, ReportError> {
    if bytes.len() > MAX_REPORT_BYTES {
        return Err(ReportError::TooLarge(bytes.len()));
    }
    let report: PeerReport =
        serde_json::from_slice(bytes).map_err(|e| ReportError::Malformed(e.to_string()))?;
    if report.name != expected {
        return Err(ReportError::WrongPod {
            expected: expected.to_string(),
            got: report.name,
        });
    }
    if !report.has_data && report.wal.is_some() {
        return Err(ReportError::Inconsistent);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> PeerReport {
        PeerReport {
            name: "etcd-1".into(),
            has_data: true,
            wal: Some(WalIdentity {
                member_id: 0xfca243bcc8d8f651,
                cluster_id: 0x1,
            }),
            wal_error: None,
            formation: Some(Formation {
                nonce: "ab".into(),
                initial_cluster: "etcd-0=http://x:2380".into(),
                token: None,
                snapshot: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_report_round_trips_with_hex_ids() {
        let text = serde_json::to_string(&report()).unwrap_or_default();
        assert!(
            text.contains("\"member_id\":\"fca243bcc8d8f651\""),
            "{text}"
        );
        assert_eq!(parse_report(text.as_bytes(), "etcd-1"), Ok(report()));
    }

    #[test]
    fn a_report_for_another_pod_is_not_evidence() {
        let text = serde_json::to_string(&report()).unwrap_or_default();
        assert!(matches!(
            parse_report(text.as_bytes(), "etcd-2"),
            Err(ReportError::WrongPod { .. })
        ));
    }

    #[test]
    fn garbage_and_oversized_answers_are_refused() {
        assert!(matches!(
            parse_report(b"<html>", "etcd-1"),
            Err(ReportError::Malformed(_))
        ));
        assert!(matches!(
            parse_report(b"{}", "etcd-1"),
            Err(ReportError::Malformed(_))
        ));
        let big = vec![b' '; MAX_REPORT_BYTES + 1];
        assert!(matches!(
            parse_report(&big, "etcd-1"),
            Err(ReportError::TooLarge(_))
        ));
        let mut r = report();
        r.has_data = false;
        let text = serde_json::to_string(&r).unwrap_or_default();
        assert_eq!(
            parse_report(text.as_bytes(), "etcd-1"),
            Err(ReportError::Inconsistent)
        );
    }
}
