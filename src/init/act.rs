//! Performs one decided action: write a marker, set data aside, make one membership change,
//! or say how etcd starts. Each act is followed by a fresh observation (or by exec), so the
//! agent can be killed at any point and run again.

use std::path::Path;
use std::time::Duration;

use thiserror::Error;

use crate::backup::catalog;
use crate::backup::manifest::Manifest;
use crate::backup::restore::{self, RestoreError};
use crate::backup::store::Store;
use crate::config::Config;
use crate::etcd::{Connector, Etcd, EtcdError};
use crate::facts::{ActionKind, Facts};
use crate::volume::{self, journal, marker, VolumeError};

use super::decide::{Action, Bootstrap, Decision, SetAsideWhy};
use super::etcd_args::StartMode;

/// After writing the formation marker: long enough for peers started at the same moment
/// to write theirs, short next to etcd's own start.
const PREPARE_PAUSE: Duration = Duration::from_millis(25);
/// How long a formation member other than ordinal 0 waits for ordinal 0's etcd to serve
/// its peer API before it starts etcd anyway (the others can form a quorum without it).
const SEED_WAIT: Duration = Duration::from_secs(2);
const SEED_POLL: Duration = Duration::from_millis(10);
/// One look at ordinal 0's peer API: a serving etcd answers on loopback or a pod network
/// in a few milliseconds.
const SEED_ANSWER_TIMEOUT: Duration = Duration::from_millis(100);

/// What the loop does after an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Exec etcd, started this way.
    Exec(StartMode),
    /// Observe again.
    LookAgain(Pause),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// At once: the action changed what the next round will see.
    Now,
    For(Duration),
    /// The back-off's next delay: nothing changed, the round waits for the world.
    Backoff,
}

#[derive(Debug, Error)]
pub enum ActError {
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// Downloading or restoring the backup a new cluster starts from.
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// The snapshot the formation agreed on is not in the store (any more), or there is no
    /// store to restore it from.
    #[error("snapshot {name} cannot be restored: {why}")]
    SnapshotMissing { name: String, why: &'static str },
    #[error("{action} through {via}: {source}")]
    Membership {
        action: ActionKind,
        via: String,
        source: EtcdError,
    },
}

fn record(dir: &Path, facts: &Facts, d: &Decision, ts: u64) -> Result<(), VolumeError> {
    journal::append(
        dir,
        &journal::Entry {
            ts,
            action: d.action.kind(),
            reason: d.reason(),
            vouch: facts.vouch(ts),
        },
    )
}

/// What actions reach: the configuration, etcd, and the backup store when a new cluster
/// may restore from it.
pub struct World<'a, C> {
    pub cfg: &'a Config,
    pub connector: &'a C,
    pub store: Option<&'a Store>,
}

/// Performs `d`, decided on `facts`; `now` is the unix time (for the journal and the
/// set-aside directory's name).
pub async fn act<C: Connector>(
    world: &World<'_, C>,
    facts: &Facts,
    d: &Decision,
    now: u64,
) -> Result<Next, ActError> {
    let (cfg, connector) = (world.cfg, world.connector);
    let dir = &cfg.data_dir;
    match &d.action {
        Action::Wait => Ok(Next::LookAgain(Pause::Backoff)),
        Action::Restart => {
            record(dir, facts, d, now)?;
            Ok(Next::Exec(StartMode::Restart))
        }
        Action::Recover { id, commit, first } => {
            if *first {
                // The marker first: a start killed from here on is recognised and, while
                // the commit index has not moved, forced again (never twice once it moved).
                marker::write_recovery(
                    dir,
                    &crate::facts::RecoveryMarker {
                        id: id.clone(),
                        commit: *commit,
                    },
                )?;
            }
            // Journaled once per recovery, also when the start that wrote the marker was
            // killed before its journal entry (the sidecar counts recoveries from it).
            let journaled = journal::read(dir)
                .iter()
                .any(|e| e.action == ActionKind::Recover && e.reason.contains(id.as_str()));
            if !journaled {
                record(dir, facts, d, now)?;
            }
            tracing::warn!(recovery = %id, commit_index = commit, "recovery: starting etcd with --force-new-cluster on this volume's data; the other pods join it as new learners");
            Ok(Next::Exec(StartMode::ForceNewCluster))
        }
        Action::Bootstrap(step @ Bootstrap::Prepare { marker: m }) => {
            if let Some(name) = &m.snapshot {
                // Download and check the snapshot before offering it to the formation: a
                // corrupt one is noted and the next round chooses another.
                let (store, manifest) = find_snapshot(world, name).await?;
                match download(store, &manifest, dir).await {
                    Ok(_) => {}
                    Err(RestoreError::Checksum { detail, .. }) => {
                        marker::reject_snapshot(dir, name, &detail)?;
                        tracing::warn!(snapshot = %name, reason = %detail, "backup fails its checksum; the next round chooses another");
                        return Ok(Next::LookAgain(Pause::Now));
                    }
                    Err(RestoreError::Decrypt(e)) => {
                        let detail = e.to_string();
                        marker::reject_snapshot(dir, name, &detail)?;
                        tracing::warn!(snapshot = %name, reason = %detail, "backup cannot be decrypted with the configured keys; the next round chooses another");
                        return Ok(Next::LookAgain(Pause::Now));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if let Some(r) = &facts.restore_request {
                marker::write_restored_for(dir, &r.id)?;
            }
            marker::write(dir, &step.marker())?;
            tracing::info!(nonce = %m.nonce, snapshot = ?m.snapshot, "formation marker written; waiting for every initial pod to prepare");
            Ok(Next::LookAgain(Pause::For(PREPARE_PAUSE)))
        }
        Action::Bootstrap(
            step @ Bootstrap::Start {
                initial_cluster,
                token,
                snapshot,
                ..
            },
        ) => {
            marker::write(dir, &step.marker())?;
            let mode = match snapshot {
                Some(name) => {
                    restore(world, name, token).await?;
                    StartMode::Restart
                }
                None => StartMode::New {
                    initial_cluster: initial_cluster.clone(),
                    token: token.clone(),
                },
            };
            record(dir, facts, d, now)?;
            if facts.ordinal != 0 {
                wait_for_seed(cfg, facts).await;
            }
            Ok(Next::Exec(mode))
        }
        Action::Resume { members, .. } => {
            record(dir, facts, d, now)?;
            Ok(Next::Exec(StartMode::Existing {
                members: members.clone(),
            }))
        }
        Action::SetAside { why } => {
            let moved = volume::set_aside(dir, why.slug(), now)?;
            if let (SetAsideWhy::RestoreRequested, Some(r)) = (why, &facts.restore_request) {
                // Once per request: this volume is not set aside for it again.
                marker::write_restored_for(dir, &r.id)?;
            }
            match moved {
                Some(to) if *why == SetAsideWhy::Left => {
                    tracing::warn!(moved_to = %to.display(), why = why.slug(), "data set aside (renamed, not deleted); this pod left the cluster and waits for etcd-steward rejoin")
                }
                Some(to) => {
                    tracing::warn!(moved_to = %to.display(), why = why.slug(), "data set aside (renamed, not deleted); this pod now joins as a new member")
                }
                None => tracing::info!("nothing to set aside"),
            }
            Ok(Next::LookAgain(Pause::Now))
        }
        Action::Join { via } | Action::Replace { via, .. } | Action::UpdatePeerUrls { via, .. } => {
            let failed = |source| ActError::Membership {
                action: d.action.kind(),
                via: via.host.clone(),
                source,
            };
            let member = connector
                .connect(&via.host, via.ip, cfg.identity.client_port)
                .await
                .map_err(failed)?;
            match &d.action {
                Action::Replace { stale, .. } => {
                    member.remove(stale.id).await.map_err(failed)?;
                    tracing::warn!(removed = %format!("{:x}", stale.id), via = %via.host, "stale member entry removed; joining as a new learner next");
                }
                Action::UpdatePeerUrls { member: id, .. } => {
                    member
                        .update_peer_urls(*id, std::slice::from_ref(&facts.peer_url))
                        .await
                        .map_err(failed)?;
                    tracing::warn!(member_id = %format!("{id:x}"), peer_url = %facts.peer_url, via = %via.host, "member entry updated to this pod's peer URL (MemberUpdate); restarting etcd on its data next");
                }
                _ => {
                    let added = member.add_learner(&facts.peer_url).await.map_err(failed)?;
                    tracing::info!(member_id = %format!("{:x}", added.id), via = %via.host, "added as a learner; starting etcd next");
                }
            }
            record(dir, facts, d, now)?;
            Ok(Next::LookAgain(Pause::Now))
        }
    }
}

/// The store and the manifest of snapshot `name`.
async fn find_snapshot<'a, C>(
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
    let manifest = catalog::list(store)
        .await
        .map_err(RestoreError::from)?
        .into_iter()
        .find(|m| m.name == name)
        .ok_or_else(|| missing("it is not in the backup store"))?;
    Ok((store, manifest))
}

/// Where the snapshot a new cluster restores is downloaded, inside the volume.
fn download_path(dir: &Path, name: &str) -> std::path::PathBuf {
    restore::staging_dir(dir).join(format!("{name}.db"))
}

/// Downloads and checks `manifest`'s snapshot into the volume, unless an earlier round did.
async fn download(
    store: &Store,
    manifest: &Manifest,
    dir: &Path,
) -> Result<std::path::PathBuf, RestoreError> {
    let file = download_path(dir, &manifest.name);
    if !file.exists() {
        restore::create_private_dir(&restore::staging_dir(dir))?;
        restore::fetch_verified(store, manifest, &file).await?;
    }
    Ok(file)
}

/// Restores snapshot `name` into this empty volume as this pod's member of the new cluster
/// `token`. Every initial pod restores the same snapshot with the same initial cluster and
/// token, so their member IDs agree. Idempotent: a restore already committed (its WAL in
/// place) is only cleaned up.
async fn restore<C>(world: &World<'_, C>, name: &str, token: &str) -> Result<(), ActError> {
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
        download(store, &manifest, &cfg.data_dir).await?
    };
    let member = restore::formation_member(cfg, token);
    restore::restore_into(&backup.tool, &file, name, &member, &cfg.data_dir).await?;
    let age = std::time::SystemTime::now()
        .duration_since(manifest.time())
        .unwrap_or_default();
    tracing::warn!(
        snapshot = %manifest.name,
        revision = manifest.revision,
        taken = %manifest.time,
        age = %humantime::format_duration(Duration::from_secs(age.as_secs())),
        "every volume was lost: this member is restored from a backup; writes after this snapshot are not in it"
    );
    Ok(())
}

/// Before a new cluster's member other than ordinal 0 starts etcd: wait (bounded) until
/// ordinal 0's etcd serves its peer API.
///
/// Why: etcd starting a new cluster first asks its peers' `/members` whether the cluster
/// was already bootstrapped, one peer after another in URL order, allowing each a second.
/// A peer whose port is bound but does not serve yet (it is busy with the same question)
/// holds the question for that whole second, so members started at the same instant often
/// stall each other for 1–2 s. Ordinal 0's URL sorts first: once its etcd serves, every
/// other member's question is answered at once, and ordinal 0's own question, asked of
/// peers not yet listening, is refused at once.
async fn wait_for_seed(cfg: &Config, facts: &Facts) {
    let Some(ip) = facts
        .peers
        .iter()
        .find(|p| p.ordinal == 0)
        .and_then(|p| p.dns.first())
    else {
        return;
    };
    let host = cfg.identity.host(0);
    let started = tokio::time::Instant::now();
    tracing::info!(seed = %host, limit = ?SEED_WAIT, "forming a new cluster: waiting for ordinal 0's etcd to serve its peer API, so etcd's bootstrap check is answered at once");
    while started.elapsed() < SEED_WAIT {
        let answer = crate::http_get::etcd_peer_version(cfg, 0, ip, SEED_ANSWER_TIMEOUT).await;
        if answer.is_ok() {
            tracing::info!(seed = %host, waited = ?started.elapsed(), "ordinal 0's etcd serves; starting etcd");
            return;
        }
        tokio::time::sleep(SEED_POLL).await;
    }
    tracing::info!(seed = %host, waited = ?started.elapsed(), "ordinal 0's etcd does not serve yet; starting etcd anyway (the other members can form a quorum)");
}
