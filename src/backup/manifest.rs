//! What is stored beside each snapshot: a small JSON manifest, written after the snapshot
//! itself, so a snapshot without one is an incomplete upload. Names sort by time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Where snapshots live, under the store's prefix.
pub const DIR: &str = "snapshots";

/// A snapshot's manifest (`snapshots/<name>.json` beside `snapshots/<name>.db`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// `<UTC time>-r<revision>`, e.g. `20261123T033912.123Z-r42`: sorts by time.
    pub name: String,
    /// The cluster's ID, hexadecimal.
    pub cluster_id: String,
    /// The member the snapshot was taken from, hexadecimal.
    pub member_id: String,
    /// The member's revision just before the snapshot: the snapshot holds at least this
    /// revision (the drill records the exact one it restored).
    pub revision: i64,
    pub etcd_version: String,
    /// Bytes stored, etcd's 32-byte SHA-256 trailer included.
    pub size: u64,
    /// SHA-256 of the stored object, hexadecimal.
    pub sha256: String,
    /// When the snapshot was taken, RFC 3339 UTC.
    pub time: String,
    pub time_unix: u64,
    /// etcd's own SHA-256 trailer matched the database while streaming. A snapshot that is
    /// not verified is never restored.
    pub verified: bool,
    /// Why it is not verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unverified_reason: Option<String>,
    /// How the stored object is encrypted (absent: it is the plain database). `sha256` and
    /// `size` are the stored object's; etcd's trailer proves the plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
    /// How the database is compressed before any encryption: `zstd`, or absent for the
    /// plain database (every snapshot taken before compression existed, or with
    /// `--backup-compression none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// What the last restore drill of this snapshot found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill: Option<DrillRecord>,
}

/// A snapshot's encryption, as recorded in its manifest: never the key itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encryption {
    /// `age-x25519`.
    pub scheme: String,
    /// The fingerprint of the key it was encrypted to (`sha256:…` of the public key).
    pub key: String,
}

/// A restore drill's outcome, as recorded in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrillRecord {
    pub time: String,
    pub time_unix: u64,
    pub passed: bool,
    /// The revision etcd's tool read from the restored database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_revision: Option<i64>,
    /// `match`, `mismatch`, `skipped` or `not_run`.
    pub hash_check: String,
    /// A sentence: what was checked, or what failed.
    pub detail: String,
    /// The archive drill of the archive that continues this snapshot, when one ran
    /// (absent in manifests written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveDrillRecord>,
}

/// An archive drill's outcome, as recorded in the manifest of the snapshot it continues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveDrillRecord {
    pub time: String,
    pub time_unix: u64,
    pub passed: bool,
    /// The last revision the replay applied (the snapshot's when none was).
    pub last_revision: i64,
    /// Segments at least one revision was replayed from, and revisions replayed.
    pub segments: u64,
    pub revisions: u64,
    /// `match`, `mismatch`, `skipped`, `not_run` or `none` (nothing archived continues it).
    pub hash_check: String,
    /// A sentence: what was proven, or what failed (the segment or revision).
    pub detail: String,
}

impl Manifest {
    /// The snapshot object's name in the store.
    pub fn db_object(&self) -> String {
        db_object(&self.name)
    }

    pub fn json_object(&self) -> String {
        json_object(&self.name)
    }

    pub fn time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.time_unix)
    }
}

pub fn db_object(name: &str) -> String {
    format!("{DIR}/{name}.db")
}

pub fn json_object(name: &str) -> String {
    format!("{DIR}/{name}.json")
}

/// RFC 3339 UTC with seconds, and the Unix time.
pub fn timestamps(t: SystemTime) -> (String, u64) {
    let unix = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    (humantime::format_rfc3339_seconds(t).to_string(), unix)
}

/// `20261123T033912.123Z-r42`: fixed width up to the revision, so names sort by time.
pub fn snapshot_name(t: SystemTime, revision: i64) -> String {
    let stamp: String = humantime::format_rfc3339_millis(t)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    format!("{stamp}-r{revision}")
}

/// The name from an object's path under `snapshots/`, and whether it is the manifest.
pub fn parse_object(object: &str) -> Option<(&str, bool)> {
    let file = object.strip_prefix(DIR)?.strip_prefix('/')?;
    if let Some(name) = file.strip_suffix(".json") {
        Some((name, true))
    } else {
        file.strip_suffix(".db").map(|name| (name, false))
    }
}

/// The one line `backup --list` prints for a snapshot (the command adds how far it
/// restores through the archive).
pub fn list_line(m: &Manifest) -> serde_json::Value {
    serde_json::json!({
        "name": m.name,
        "cluster_id": m.cluster_id,
        "revision": m.revision,
        "size": m.size,
        "sha256": m.sha256,
        "verified": m.verified,
        "time": m.time,
        "encrypted": m.encryption.is_some(),
        "key": m.encryption.as_ref().map(|e| e.key.clone()),
        "compression": m.compression,
        "drill": m.drill.as_ref().map(|d| d.passed),
        "archive_drill": m.drill.as_ref().and_then(|d| d.archive.as_ref()).map(|a| a.passed),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_time_whatever_the_revision() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_000_000_123);
        let a = snapshot_name(t, 999_999);
        let b = snapshot_name(t + Duration::from_millis(1), 3);
        assert_eq!(a, "20261118T110640.123Z-r999999");
        assert!(a < b, "{a} sorts before {b}");
    }

    #[test]
    fn object_paths_parse_back_to_names() {
        assert_eq!(parse_object("snapshots/x-r1.json"), Some(("x-r1", true)));
        assert_eq!(parse_object("snapshots/x-r1.db"), Some(("x-r1", false)));
        assert_eq!(parse_object("snapshots/x-r1.db.tmp"), None);
        assert_eq!(parse_object("other/x.db"), None);
    }
}
