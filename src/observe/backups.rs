//! What the backup store holds, as the restore choice reads it.

use crate::backup::archive::{chain, stored};
use crate::backup::catalog;
use crate::backup::store::Store;
use crate::facts::{ArchiveReach, BackupFacts, RestoreWanted, SnapshotContent, SnapshotFacts};

/// What the store holds, as the restore choice reads it (`decision`): the snapshots and how
/// far the archive's segments continue each; a store that does not answer is said so.
pub async fn list_backups(store: &Store, wanted: RestoreWanted) -> BackupFacts {
    let listed = match catalog::list_stored(store).await {
        Ok(snapshots) => stored::list(store)
            .await
            .map(|segments| (snapshots, segments)),
        Err(e) => Err(e),
    };
    match listed {
        Ok((stored, segments)) => BackupFacts::Listed {
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
                    archive: {
                        let c = chain::chain(m.revision, &m.cluster_id, &segments);
                        c.last_time_unix_ms.map(|t| ArchiveReach {
                            last_revision: c.last_revision,
                            last_time_unix_ms: t,
                            segments: c.segments.len(),
                            broken: c.broken.clone(),
                        })
                    },
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
