//! What the backup store offers a cluster formed anew (the snapshots, how far the archive
//! continues each, which one is wanted) and what this volume remembers of a snapshot it
//! could not use.

use serde::{Deserialize, Serialize};

/// A snapshot this pod downloaded to restore a new cluster from and could not use. It is
/// remembered only for what cannot change by itself: the same bytes, or the same keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub name: String,
    #[serde(flatten)]
    pub failed: Failed,
}

/// What a rejected snapshot failed, and on what: the content it was found wanting in, and
/// for a key that does not open it, the keys tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "failed", rename_all = "kebab-case")]
pub enum Failed {
    /// The downloaded bytes did not match the manifest's SHA-256 and size, etcd's own
    /// checksum, or (encrypted) the ciphertext's authentication: those bytes never will.
    Checksum {
        content: SnapshotContent,
        detail: String,
    },
    /// No configured key opens it: it is encrypted to `encrypted_to`, and `configured` are
    /// the fingerprints of the keys that were tried (none: no key was configured).
    Key {
        content: SnapshotContent,
        encrypted_to: String,
        configured: Vec<String>,
    },
    /// Written by an etcd-steward that recorded only the name and a sentence (a list of
    /// `[name, detail]` pairs): neither the content nor the keys are known.
    Unrecorded { detail: String },
}

/// What a stored snapshot's bytes are, as far as the store and the manifest say: another
/// object uploaded under the same name (another ETag or size) or a rewritten manifest
/// (another SHA-256) is other content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotContent {
    /// The SHA-256 the manifest gives for the stored object.
    pub sha256: String,
    /// The stored object's size, as the store lists it (`None`: not listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The stored object's ETag (`None`: not listed, or the store gives none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

/// What the backup store offers a cluster that must be formed anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackupFacts {
    /// No `--backup-url`, or `--restore never`: a new cluster starts empty.
    Off,
    /// Not asked this round (a cluster answered, or this volume holds data).
    NotAsked,
    /// The store could not be listed: no proof that there is nothing to restore.
    Unreachable { error: String },
    /// The store's snapshots, newest first, which one `--restore` wants, and the
    /// fingerprints of the decryption keys configured now (sorted; empty: none).
    Listed {
        wanted: RestoreWanted,
        snapshots: Vec<SnapshotFacts>,
        keys: Vec<String>,
    },
}

impl BackupFacts {
    /// Snapshot `name`, when the store listed it this round.
    pub fn snapshot(&self, name: &str) -> Option<&SnapshotFacts> {
        match self {
            BackupFacts::Listed { snapshots, .. } => snapshots.iter().find(|s| s.name == name),
            _ => None,
        }
    }
}

/// `--restore`: `latest` or a snapshot's name (`never` is [`BackupFacts::Off`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestoreWanted {
    Latest,
    Named(String),
    /// `revision:N`.
    Revision(i64),
    /// `time:RFC3339`, as Unix milliseconds: the last revision archived at or before it.
    Time(u64),
}

/// How far a restore point replays the archive onto its snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointAt {
    /// Up to and including this revision (`<snapshot>+r<revision>`).
    Revision(i64),
    /// Up to the last revision archived at or before this moment (`<snapshot>+t<unix_ms>`).
    Time { unix_ms: u64 },
}

/// One snapshot in the store, as its manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotFacts {
    pub name: String,
    pub revision: i64,
    /// When it was taken, unix seconds.
    pub time_unix: u64,
    /// etcd's checksum matched while it streamed into the store.
    pub verified: bool,
    /// A restore drill of it failed.
    pub drill_failed: bool,
    /// The stored object's identity: a rejection holds only for the same content.
    pub content: SnapshotContent,
    /// The fingerprint of the key it is encrypted to (`None`: not encrypted).
    pub key: Option<String>,
    /// How far archived segments continue it (`None`: none does).
    pub archive: Option<ArchiveReach>,
}

/// How far the archive's segments continue a snapshot without a hole (the store's chain):
/// its last revision, when the archiver received it (Unix ms), and why it stops, if it does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveReach {
    pub last_revision: i64,
    pub last_time_unix_ms: u64,
    pub segments: usize,
    pub broken: Option<String>,
}
