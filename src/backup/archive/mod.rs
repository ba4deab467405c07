//! The continuous archive: between two snapshots, every change etcd made, in segments
//! (`archive/<first>-<last>.seg`, each with a JSON manifest beside it written last, as the
//! snapshots are). A snapshot plus the segments that continue it is a restorable point at
//! any revision up to the last archived one.
//!
//! [`segment`] is the stored form of one segment (pure); [`chain`] picks, from the
//! manifests alone, which segments continue a snapshot and where the chain ends (pure);
//! [`stored`] puts and gets them in the store; [`drill`] proves the archive continuing a
//! snapshot replays to the live cluster's hash and leases ([`leases`], pure, compares them;
//! [`lease_read`] asks an etcd for them); [`watch`] holds the etcd calls the
//! [`writer`] makes to archive the changes of the local member, round after round.

pub mod chain;
pub mod drill;
pub mod lease_read;
pub mod leases;
pub mod replay;
pub mod segment;
pub mod stored;
pub mod watch;
pub mod writer;

use serde::{Deserialize, Serialize};

use super::manifest::Encryption;

/// Where segments live, under the store's prefix.
pub const DIR: &str = "archive";

/// Digits of a revision in a segment's name, so names sort by revision.
const REVISION_DIGITS: usize = 20;

/// A segment's manifest (`archive/<name>.json` beside `archive/<name>.seg`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentManifest {
    /// `<first revision>-<last revision>`, zero-padded: sorts by revision.
    pub name: String,
    /// The cluster's ID, hexadecimal: a chain never mixes clusters.
    pub cluster_id: String,
    pub first_revision: i64,
    pub last_revision: i64,
    /// Revisions and events (puts and deletes) it holds.
    pub revisions: u64,
    pub events: u64,
    /// Leases whose TTL it records.
    pub leases: u64,
    /// Bytes stored, and the SHA-256 of the stored object, hexadecimal.
    pub size: u64,
    pub sha256: String,
    /// Bytes once decompressed (a bound for the decompression).
    pub plain_size: u64,
    /// When the archiver received its first and last revision, RFC 3339 UTC (millis).
    pub first_time: String,
    pub first_time_unix_ms: u64,
    pub last_time: String,
    pub last_time_unix_ms: u64,
    /// `zstd`.
    pub compression: String,
    /// How the stored object is encrypted (absent: it is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
}

impl SegmentManifest {
    pub fn seg_object(&self) -> String {
        seg_object(&self.name)
    }

    pub fn json_object(&self) -> String {
        json_object(&self.name)
    }
}

/// A segment's name for its revisions.
pub fn segment_name(first: i64, last: i64) -> String {
    format!(
        "{first:0w$}-{last:0w$}",
        w = REVISION_DIGITS,
        first = first.max(0),
        last = last.max(0)
    )
}

pub fn seg_object(name: &str) -> String {
    format!("{DIR}/{name}.seg")
}

pub fn json_object(name: &str) -> String {
    format!("{DIR}/{name}.json")
}

/// The name from an object's path under `archive/`, and whether it is the manifest.
pub fn parse_object(object: &str) -> Option<(&str, bool)> {
    let file = object.strip_prefix(DIR)?.strip_prefix('/')?;
    if let Some(name) = file.strip_suffix(".json") {
        Some((name, true))
    } else {
        file.strip_suffix(".seg").map(|name| (name, false))
    }
}

/// RFC 3339 UTC with milliseconds, from Unix milliseconds.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_sort_by_revision_and_parse_back() {
        let (a, b) = (segment_name(9, 120), segment_name(121, 1_000_000));
        assert_eq!(a, "00000000000000000009-00000000000000000120");
        assert!(a < b);
        assert_eq!(parse_object(&seg_object(&a)), Some((a.as_str(), false)));
        assert_eq!(parse_object(&json_object(&a)), Some((a.as_str(), true)));
        assert_eq!(parse_object("snapshots/x.db"), None);
    }
}
