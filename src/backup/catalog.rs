//! What the store holds: manifests newest first, and which objects retention removes.
//! Retention only ever deletes backups in the store, never anything on a volume.

use std::collections::BTreeSet;

use super::manifest::{self, Manifest};
use super::store::{Entry, Store, StoreError};

/// Every readable manifest, newest first. An unreadable one is logged and left out.
pub async fn list(store: &Store) -> Result<Vec<Manifest>, StoreError> {
    Ok(list_stored(store)
        .await?
        .into_iter()
        .map(|(m, _)| m)
        .collect())
}

/// Every readable manifest, newest first, with its snapshot object as the store lists it
/// (`None`: no such object, an incomplete or removed upload).
pub async fn list_stored(store: &Store) -> Result<Vec<(Manifest, Option<Entry>)>, StoreError> {
    let entries = store.list(manifest::DIR).await?;
    let mut names: Vec<&str> = entries
        .iter()
        .filter_map(|e| manifest::parse_object(&e.name))
        .filter(|(_, is_manifest)| *is_manifest)
        .map(|(name, _)| name)
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let bytes = match store.get(&manifest::json_object(name)).await {
            Ok(b) => b,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        match serde_json::from_slice::<Manifest>(&bytes) {
            Ok(m) => {
                let object = entries.iter().find(|e| e.name == m.db_object()).cloned();
                out.push((m, object));
            }
            Err(e) => tracing::warn!(name, error = %e, "unreadable backup manifest, ignored"),
        }
    }
    Ok(out)
}

/// The objects retention removes, manifests before their snapshot (so a half-done
/// deletion leaves an orphan snapshot, which the next pass removes):
/// - snapshots beyond the `keep` newest, except the newest verified one;
/// - snapshots without a manifest (incomplete uploads) older than the newest manifest,
///   so an upload still in progress is left alone.
///
/// `manifests` newest first; `objects` every object name under `snapshots/`.
pub fn plan_prune(manifests: &[Manifest], objects: &[String], keep: usize) -> Vec<String> {
    let newest_verified = manifests.iter().find(|m| m.verified).map(|m| &m.name);
    let mut out = Vec::new();
    for m in manifests.iter().skip(keep.max(1)) {
        if Some(&m.name) == newest_verified {
            continue;
        }
        out.push(m.json_object());
        out.push(m.db_object());
    }
    let with_manifest: BTreeSet<&str> = manifests.iter().map(|m| m.name.as_str()).collect();
    if let Some(newest) = manifests.first() {
        for object in objects {
            if let Some((name, false)) = manifest::parse_object(object) {
                if !with_manifest.contains(name) && name < newest.name.as_str() {
                    out.push(object.clone());
                }
            }
        }
    }
    out
}

/// Applies [`plan_prune`]; returns the objects deleted.
pub async fn prune(store: &Store, keep: usize) -> Result<Vec<String>, StoreError> {
    let manifests = list(store).await?;
    let objects: Vec<String> = store
        .list(manifest::DIR)
        .await?
        .into_iter()
        .map(|e| e.name)
        .collect();
    let plan = plan_prune(&manifests, &objects, keep);
    for object in &plan {
        store.delete(object).await?;
        tracing::info!(object = %object, store = %store.url(), "old backup deleted by retention");
    }
    Ok(plan)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn m(name: &str, verified: bool) -> Manifest {
        Manifest {
            name: name.into(),
            cluster_id: "1".into(),
            member_id: "2".into(),
            revision: 1,
            etcd_version: "3.5.1".into(),
            size: 10,
            sha256: String::new(),
            time: String::new(),
            time_unix: 0,
            verified,
            unverified_reason: None,
            encryption: None,
            compression: None,
            drill: None,
        }
    }

    #[test]
    fn retention_keeps_the_newest_n() {
        let ms = [m("d", true), m("c", true), m("b", true), m("a", true)];
        let plan = plan_prune(&ms, &[], 2);
        assert_eq!(
            plan,
            [
                "snapshots/b.json",
                "snapshots/b.db",
                "snapshots/a.json",
                "snapshots/a.db"
            ]
        );
    }

    #[test]
    fn retention_never_deletes_the_newest_verified_snapshot() {
        let ms = [m("d", false), m("c", false), m("b", true), m("a", true)];
        let plan = plan_prune(&ms, &[], 1);
        assert_eq!(
            plan,
            [
                "snapshots/c.json",
                "snapshots/c.db",
                "snapshots/a.json",
                "snapshots/a.db"
            ]
        );
    }

    #[test]
    fn incomplete_uploads_older_than_the_newest_manifest_are_pruned_newer_ones_kept() {
        let ms = [m("b", true)];
        let objects = [
            "snapshots/a.db".to_string(),
            "snapshots/b.db".to_string(),
            "snapshots/b.json".to_string(),
            "snapshots/c.db".to_string(),
        ];
        assert_eq!(plan_prune(&ms, &objects, 5), ["snapshots/a.db"]);
    }

    #[test]
    fn an_empty_store_prunes_nothing() {
        assert!(plan_prune(&[], &["snapshots/a.db".to_string()], 1).is_empty());
    }
}
