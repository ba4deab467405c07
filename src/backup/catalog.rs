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

/// Whether snapshot `m` can be restored, as far as a listing tells: verified when taken
/// (etcd's trailer matched) and its object in the store at the manifest's size. A manifest
/// whose object is missing or of another size is a torn or half-deleted backup.
pub fn restorable(m: &Manifest, object: Option<&Entry>) -> bool {
    m.verified && object.is_some_and(|o| o.size == m.size)
}

/// Whether snapshot `m`'s stored bytes have been read back and restored: verified, and its
/// last restore drill passed. Until a newer snapshot is, the last one that was stays.
pub fn proven(m: &Manifest) -> bool {
    m.verified && m.drill.as_ref().is_some_and(|d| d.passed)
}

/// The objects retention removes, manifests before their snapshot (so a half-done
/// deletion leaves an orphan snapshot, which the next pass removes):
/// - snapshots beyond the `keep` newest, except the newest verified one, the newest
///   [`restorable`] one and the newest [`proven`] one: a newer snapshot whose upload or
///   verification failed, whose object is gone or torn, or that is not drilled yet (the
///   round prunes before it drills) never lets the last good one go;
/// - snapshots without a manifest (incomplete uploads) older than the newest manifest,
///   so an upload still in progress is left alone.
///
/// `stored` newest first, each manifest with its snapshot object as listed (`None`: not
/// there); `objects` every object name under `snapshots/`. Every write to the store is
/// durable when it returns, so a manifest listed is a snapshot on disk.
pub fn plan_prune(
    stored: &[(Manifest, Option<Entry>)],
    objects: &[String],
    keep: usize,
) -> Vec<String> {
    let newest = |good: &dyn Fn(&Manifest, Option<&Entry>) -> bool| {
        stored
            .iter()
            .find(|(m, o)| good(m, o.as_ref()))
            .map(|(m, _)| m.name.as_str())
    };
    let kept = [
        newest(&|m, _| m.verified),
        newest(&restorable),
        newest(&|m, _| proven(m)),
    ];
    let mut out = Vec::new();
    for (m, _) in stored.iter().skip(keep.max(1)) {
        if kept.contains(&Some(m.name.as_str())) {
            continue;
        }
        out.push(m.json_object());
        out.push(m.db_object());
    }
    let with_manifest: BTreeSet<&str> = stored.iter().map(|(m, _)| m.name.as_str()).collect();
    if let Some((newest, _)) = stored.first() {
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
    let stored = list_stored(store).await?;
    let objects: Vec<String> = store
        .list(manifest::DIR)
        .await?
        .into_iter()
        .map(|e| e.name)
        .collect();
    let plan = plan_prune(&stored, &objects, keep);
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
    use proptest::prelude::*;

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

    /// The manifest with its snapshot object stored whole.
    fn whole(m: Manifest) -> (Manifest, Option<Entry>) {
        let object = Entry {
            name: m.db_object(),
            size: m.size,
            e_tag: None,
        };
        (m, Some(object))
    }

    fn all_whole(ms: impl IntoIterator<Item = Manifest>) -> Vec<(Manifest, Option<Entry>)> {
        ms.into_iter().map(whole).collect()
    }

    #[test]
    fn retention_keeps_the_newest_n() {
        let ms = all_whole([m("d", true), m("c", true), m("b", true), m("a", true)]);
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
        let ms = all_whole([m("d", false), m("c", false), m("b", true), m("a", true)]);
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
    fn a_newer_verified_snapshot_whose_object_is_missing_or_torn_never_lets_the_last_whole_one_go()
    {
        let (missing, _) = whole(m("d", true));
        let (torn, mut short) = whole(m("c", true));
        if let Some(o) = short.as_mut() {
            o.size = 3;
        }
        let ms = vec![
            (missing, None),
            (torn, short),
            whole(m("b", true)),
            whole(m("a", true)),
        ];
        let plan = plan_prune(&ms, &[], 1);
        assert_eq!(
            plan,
            [
                "snapshots/c.json",
                "snapshots/c.db",
                "snapshots/a.json",
                "snapshots/a.db"
            ],
            "d kept by count, b kept as the newest snapshot stored whole"
        );
    }

    #[test]
    fn the_newest_verified_snapshot_is_kept_even_when_its_listing_looks_torn() {
        // When in doubt, keep: a size the listing reports otherwise than the manifest may be
        // the store's, not the snapshot's; the restore checks the bytes themselves.
        let (torn, mut short) = whole(m("c", true));
        if let Some(o) = short.as_mut() {
            o.size = 3;
        }
        let ms = vec![whole(m("d", false)), (torn, short), whole(m("b", true))];
        assert_eq!(plan_prune(&ms, &[], 1), Vec::<String>::new());
    }

    fn drilled(mut m: Manifest, passed: bool) -> Manifest {
        m.drill = Some(manifest::DrillRecord {
            time: String::new(),
            time_unix: 0,
            passed,
            restored_revision: Some(1),
            hash_check: "match".into(),
            detail: String::new(),
            archive: None,
        });
        m
    }

    #[test]
    fn a_newer_snapshot_not_drilled_yet_or_failing_its_drill_never_lets_the_last_drilled_one_go() {
        // The round prunes before it drills: d is not drilled yet, c failed its drill (not
        // for corrupt bytes, so still verified), b passed.
        let ms = all_whole([
            m("d", true),
            drilled(m("c", true), false),
            drilled(m("b", true), true),
            drilled(m("a", true), true),
        ]);
        assert_eq!(
            plan_prune(&ms, &[], 1),
            [
                "snapshots/c.json",
                "snapshots/c.db",
                "snapshots/a.json",
                "snapshots/a.db"
            ]
        );
        let ms = all_whole([drilled(m("d", true), true), drilled(m("b", true), true)]);
        assert_eq!(
            plan_prune(&ms, &[], 1),
            ["snapshots/b.json", "snapshots/b.db"],
            "once the newer one passed its drill, the older one goes"
        );
    }

    #[test]
    fn a_newer_upload_that_never_got_its_manifest_lets_no_snapshot_go() {
        let ms = all_whole([m("b", true), m("a", true)]);
        let objects = [
            "snapshots/a.db".to_string(),
            "snapshots/a.json".to_string(),
            "snapshots/b.db".to_string(),
            "snapshots/b.json".to_string(),
            "snapshots/c.db".to_string(),
        ];
        assert_eq!(
            plan_prune(&ms, &objects, 1),
            ["snapshots/a.json", "snapshots/a.db"],
            "the failed upload c counts for nothing: b stays, only beyond it goes"
        );
    }

    #[test]
    fn incomplete_uploads_older_than_the_newest_manifest_are_pruned_newer_ones_kept() {
        let ms = all_whole([m("b", true)]);
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

    /// A store's snapshots, newest first: each verified or not, its object whole, short or
    /// missing, drilled (passed or failed) or not.
    fn stores() -> impl Strategy<Value = Vec<(Manifest, Option<Entry>)>> {
        let shape = (any::<bool>(), 0u8..3, proptest::option::of(any::<bool>()));
        proptest::collection::vec(shape, 0..8).prop_map(|shapes| {
            let n = shapes.len();
            shapes
                .into_iter()
                .enumerate()
                .map(|(i, (verified, object, drill))| {
                    let mut m = m(&format!("s{:02}", n - i), verified);
                    if let Some(passed) = drill {
                        m = drilled(m, passed);
                    }
                    let (m, entry) = whole(m);
                    let entry = match object {
                        0 => entry,
                        1 => entry.map(|e| Entry { size: 1, ..e }),
                        _ => None,
                    };
                    (m, entry)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn retention_never_leaves_fewer_than_one_restorable_and_one_proven_snapshot(
            stored in stores(),
            keep in 0usize..4,
        ) {
            let objects: Vec<String> = stored
                .iter()
                .flat_map(|(m, o)| {
                    std::iter::once(m.json_object()).chain(o.as_ref().map(|o| o.name.clone()))
                })
                .collect();
            let plan = plan_prune(&stored, &objects, keep);
            let gone = |m: &Manifest| plan.contains(&m.json_object()) || plan.contains(&m.db_object());
            let restorable_before = stored.iter().any(|(m, o)| restorable(m, o.as_ref()));
            let restorable_after = stored.iter().any(|(m, o)| restorable(m, o.as_ref()) && !gone(m));
            prop_assert_eq!(restorable_before, restorable_after, "plan {:?}", plan);
            let proven_before = stored.iter().any(|(m, _)| proven(m));
            let proven_after = stored.iter().any(|(m, _)| proven(m) && !gone(m));
            prop_assert_eq!(proven_before, proven_after, "plan {:?}", plan);
            let kept = stored
                .iter()
                .filter(|(m, _)| !plan.contains(&m.json_object()))
                .count();
            prop_assert!(kept >= keep.max(1).min(stored.len()));
        }
    }
}
