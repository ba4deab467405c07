//! What the backup store holds, as the restore choice reads it.

use crate::backup::catalog;
use crate::backup::store::Store;
use crate::facts::{BackupFacts, RestoreWanted, SnapshotContent, SnapshotFacts};

/// What the store holds, as the restore choice reads it (`decision`); a store that does
/// not answer is said so.
pub async fn list_backups(store: &Store, wanted: RestoreWanted) -> BackupFacts {
    match catalog::list_stored(store).await {
        Ok(stored) => BackupFacts::Listed {
            wanted,
            snapshots: stored
                .iter()
                .map(|(m, object)| SnapshotFacts {
                    name: m.name.clone(),
                    revision: m.revision,
                    time_unix: m.time_unix,
                    verified: m.verified,
                    drill_failed: m.drill.as_ref().is_some_and(|d| !d.passed),
                    content: SnapshotContent {
                        sha256: m.sha256.clone(),
                        size: object.as_ref().map(|o| o.size),
                        etag: object.as_ref().and_then(|o| o.e_tag.clone()),
                    },
                    key: m.encryption.as_ref().map(|e| e.key.clone()),
                })
                .collect(),
            keys: store.keys().fingerprints(),
        },
        Err(e) => BackupFacts::Unreachable {
            error: e.to_string(),
        },
    }
}

/// How old (seconds, at `now`) the store's newest verified snapshot is; `None` when it holds
/// none; the error when it cannot be listed.
pub async fn newest_snapshot_age(store: &Store, now: u64) -> Result<Option<u64>, String> {
    let all = catalog::list(store).await.map_err(|e| e.to_string())?;
    Ok(all
        .iter()
        .filter(|m| m.verified)
        .map(|m| now.saturating_sub(m.time_unix))
        .min())
}
