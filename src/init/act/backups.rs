//! The acts that reach the backup store: the snapshot taken before the first member of a
//! new minor release starts, downloading and checking the snapshot a formation agreed on
//! (what a failed download says about it), replaying the archive onto it when the
//! formation's point names a revision past it, and restoring it into the empty volume.

use std::path::Path;
use std::time::Duration;

use super::{ActError, World};
use crate::backup::archive::replay::{self, ReplaySetup, Target};
use crate::backup::catalog;
use crate::backup::crypt::CryptError;
use crate::backup::manifest::Manifest;
use crate::backup::restore::{self, RestoreError};
use crate::backup::store::Store;
use crate::config::Config;
use crate::decision::parse_restore_point;
use crate::facts::{Failed, PointAt, SnapshotContent};
use crate::volume::journal;

/// How long the snapshot before a new minor release may take.
const SNAPSHOT_LIMIT: Duration = Duration::from_secs(300);

/// Takes a snapshot of the cluster through the member at `via` into `store`, checked as the
/// sidecar's are (an unverified one is an error: it stays in the store, marked, and counts
/// for nothing), within [`SNAPSHOT_LIMIT`].
pub(super) async fn snapshot_through(
    cfg: &Config,
    store: Option<&Store>,
    via: &crate::facts::Endpoint,
) -> Result<(), ActError> {
    use crate::backup::snapshot::{self, EtcdSource, EtcdTarget};
    let failed = |detail: String| ActError::Snapshot {
        via: via.host.clone(),
        detail,
    };
    let store = store.ok_or_else(|| failed("no backup store configured (--backup-url)".into()))?;
    let target = EtcdTarget {
        host: via.host.clone(),
        ip: via.ip,
        port: cfg.identity.client_port,
        tls: cfg.etcd.tls.clone(),
        auth: cfg.etcd.auth.clone(),
    };
    let take = async {
        let source = EtcdSource::connect(&target)
            .await
            .map_err(|e| e.to_string())?;
        snapshot::take(&source, store, std::time::SystemTime::now())
            .await
            .map_err(|e| e.to_string())
    };
    let m = tokio::time::timeout(SNAPSHOT_LIMIT, take)
        .await
        .map_err(|_| failed(format!("no snapshot within {}s", SNAPSHOT_LIMIT.as_secs())))?
        .map_err(failed)?;
    if !m.verified {
        return Err(failed(format!(
            "snapshot {} is stored but not verified: {}",
            m.name,
            m.unverified_reason
                .as_deref()
                .unwrap_or("no reason recorded")
        )));
    }
    tracing::info!(snapshot = %m.name, revision = m.revision, etcd_version = %m.etcd_version, via = %via.host, "snapshot of the cluster taken before the first member of a newer minor release starts");
    Ok(())
}

/// What a failed download says about the snapshot, when it says something that holds until
/// the content or the keys change: bytes that fail a checksum (or, encrypted, their
/// authentication) are remembered with `content`; a key that does not open them with the
/// keys tried. A store, disk or key-file error says nothing about the snapshot: `None`.
pub(super) fn rejection(e: &RestoreError, content: SnapshotContent) -> Option<Failed> {
    match e {
        RestoreError::Checksum { detail, .. } => Some(Failed::Checksum {
            content,
            detail: detail.clone(),
        }),
        RestoreError::Decrypt(CryptError::Corrupt { detail, .. }) => Some(Failed::Checksum {
            content,
            detail: format!("the ciphertext fails its authentication: {detail}"),
        }),
        RestoreError::Decrypt(CryptError::NoKey {
            fingerprint, have, ..
        }) => Some(Failed::Key {
            content,
            encrypted_to: fingerprint.clone(),
            configured: have.clone(),
        }),
        RestoreError::Decrypt(CryptError::Missing { fingerprint, .. }) => Some(Failed::Key {
            content,
            encrypted_to: fingerprint.clone(),
            configured: vec![],
        }),
        RestoreError::Decrypt(CryptError::KeyFile { .. } | CryptError::Local { .. })
        | RestoreError::HasData { .. }
        | RestoreError::Store(_)
        | RestoreError::Tool { .. }
        | RestoreError::Io { .. } => None,
    }
}

/// The store and the manifest of snapshot `name`.
pub(super) async fn find_snapshot<'a, C>(
    world: &World<'a, C>,
    name: &str,
) -> Result<(&'a Store, Manifest), ActError> {
    let missing = |why| ActError::SnapshotMissing {
        name: name.to_string(),
        why,
    };
    let store = world
        .store
        .ok_or_else(|| missing("no --backup-url (or --restore never) to restore it from"))?;
    let (snapshot, _) = parse_restore_point(name);
    let manifest = catalog::list(store)
        .await
        .map_err(RestoreError::from)?
        .into_iter()
        .find(|m| m.name == snapshot)
        .ok_or_else(|| missing("it is not in the backup store"))?;
    Ok((store, manifest))
}

/// Where the snapshot a new cluster restores is downloaded, inside the volume.
pub(super) fn download_path(dir: &Path, name: &str) -> std::path::PathBuf {
    restore::staging_dir(dir).join(format!("{name}.db"))
}

/// Downloads and checks `manifest`'s snapshot into the volume, unless an earlier round of
/// this process did (a file left by an earlier process may be torn: it is not synced).
pub(super) async fn download(
    store: &Store,
    manifest: &Manifest,
    dir: &Path,
) -> Result<std::path::PathBuf, RestoreError> {
    let file = download_path(dir, &manifest.name);
    if !restore::verified_here(&file) {
        restore::create_private_dir(&restore::staging_dir(dir))?;
        restore::fetch_verified(store, manifest, &file).await?;
    }
    Ok(file)
}

/// The file restore point `name` restores from, made unless an earlier round made it: the
/// snapshot `manifest`, downloaded and checked, with (for `<snapshot>+r<revision>` and
/// `<snapshot>+t<unix_ms>`) the archive replayed onto it up to that revision or moment. Every pod replays the same segments onto
/// the same snapshot, so every pod's keyspace is the same.
pub(super) async fn point_file<C>(
    world: &World<'_, C>,
    store: &Store,
    manifest: &Manifest,
    name: &str,
) -> Result<std::path::PathBuf, ActError> {
    let dir = &world.cfg.data_dir;
    let out = download_path(dir, name);
    if out.exists() {
        return Ok(out);
    }
    let base = download(store, manifest, dir).await?;
    let target = match parse_restore_point(name) {
        (_, None) => return Ok(base),
        (_, Some(PointAt::Revision(revision))) => Target::Revision(revision),
        (_, Some(PointAt::Time { unix_ms })) => Target::Time { unix_ms },
    };
    let Some(backup) = &world.cfg.backup else {
        return Err(ActError::SnapshotMissing {
            name: name.to_string(),
            why: "no --backup-url to restore it from",
        });
    };
    let setup = ReplaySetup {
        tool: backup.tool.clone(),
        etcd_bin: world.cfg.etcd_bin.clone(),
        work_dir: restore::staging_dir(dir).join("replay"),
        start_timeout: Duration::from_secs(60),
        auth: world.cfg.etcd.auth.clone(),
        method: replay::Method::default(),
        // The restore marks every earlier revision compacted: the file needs only each
        // key's last write (etcd would delete the rest when it starts).
        history: match backup.tool.jump() {
            crate::backup::tool::Jump::By(_) => replay::History::Latest,
            crate::backup::tool::Jump::Off | crate::backup::tool::Jump::Unsupported => {
                replay::History::Full
            }
        },
    };
    replay::fold(store, manifest, &base, target, &setup, &out).await?;
    let _ = std::fs::remove_file(&base);
    Ok(out)
}

/// Restores snapshot `name` into this empty volume as this pod's member of the new cluster
/// `token`. Every initial pod restores the same snapshot with the same initial cluster and
/// token, so their member IDs agree. Idempotent: a restore already committed (its WAL in
/// place) is only cleaned up.
pub(super) async fn restore<C>(
    world: &World<'_, C>,
    name: &str,
    token: &str,
) -> Result<journal::Restored, ActError> {
    let cfg = world.cfg;
    let Some(backup) = &cfg.backup else {
        return Err(ActError::SnapshotMissing {
            name: name.to_string(),
            why: "no --backup-url to restore it from",
        });
    };
    let (store, manifest) = find_snapshot(world, name).await?;
    let file = if restore::has_wal(&cfg.data_dir)? {
        download_path(&cfg.data_dir, name)
    } else {
        point_file(world, store, &manifest, name).await?
    };
    let member = restore::formation_member(&cfg.identity, cfg.replicas, token);
    restore::restore_into(&backup.tool, &file, name, &member, &cfg.data_dir).await?;
    let point = parse_restore_point(name).1;
    let revisions = restore::log_restored(
        &manifest,
        &backup.tool,
        match point {
            None => "this member is restored from a backup (every volume lost, or an operator's restore); writes after this snapshot are not in it",
            Some(_) => "this member is restored from a backup with the archive replayed onto it (every volume lost, or an operator's restore); the next line says how far",
        },
        match point {
            None => restore::Held::Snapshot,
            Some(PointAt::Revision(r)) => restore::Held::Replayed(Some(r)),
            Some(PointAt::Time { .. }) => restore::Held::Replayed(None),
        },
    );
    match point {
        Some(PointAt::Revision(revision)) => {
            tracing::warn!(point = %name, snapshot = %manifest.name, last_revision = revision,
            "restore point: the snapshot with the archive replayed onto it; writes archived up to the last revision are in it")
        }
        Some(PointAt::Time { unix_ms }) => {
            tracing::warn!(point = %name, snapshot = %manifest.name, moment = %crate::backup::archive::rfc3339_ms(unix_ms),
            "restore point: the snapshot with the archive replayed onto it up to the last revision archived at or before the moment; writes archived after it are not in it")
        }
        None => {}
    }
    Ok(journal::Restored {
        snapshot: name.to_string(),
        revision: revisions.map(|(before, _)| before),
        revision_after: revisions.map(|(_, after)| after),
    })
}
