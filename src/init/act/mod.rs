//! Performs one decided action: write a marker, set data aside, make one membership change,
//! or say how etcd starts. Each act is followed by a fresh observation (or by exec), so the
//! agent can be killed at any point and run again.

use std::path::Path;
use std::time::Duration;

use thiserror::Error;

use crate::backup::archive::replay::ReplayError;
use crate::backup::restore::RestoreError;
use crate::backup::store::Store;
use crate::config::Config;
use crate::etcd::{Connector, Etcd, EtcdError};
use crate::facts::{ActionKind, Facts, Failed, Rejection, SnapshotContent};
use crate::volume::{self, journal, marker, VolumeError};

use super::etcd_args::StartMode;
use backups::{download, find_snapshot, point_file, rejection, restore, snapshot_through};

mod backups;
use crate::decision::{Action, Bootstrap, Decision, SetAsideWhy};

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
    /// Replaying the archive onto the snapshot of a restore point.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// The snapshot the formation agreed on is not in the store (any more), or there is no
    /// store to restore it from.
    #[error("snapshot {name} cannot be restored: {why}")]
    SnapshotMissing { name: String, why: &'static str },
    /// The snapshot before the first member of a newer minor release starts.
    #[error("snapshot through {via} before etcd starts the new minor release: {detail}")]
    Snapshot { via: String, detail: String },
    #[error("{action} through {via}: {source}")]
    Membership {
        action: ActionKind,
        via: String,
        source: EtcdError,
    },
}

fn record(dir: &Path, facts: &Facts, d: &Decision, ts: u64) -> Result<(), VolumeError> {
    journal::append(dir, &entry(facts, d, ts))
}

/// The journal entry for `d`, decided on `facts` at `ts` (the sidecar posts it as a
/// Kubernetes Event: init itself never waits on the API before it execs etcd).
fn entry(facts: &Facts, d: &Decision, ts: u64) -> journal::Entry {
    journal::Entry {
        vouch: facts.vouch(ts),
        ..journal::Entry::new(ts, d.action.kind(), d.reason())
    }
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
            let forced_from = prepare_forced_start(dir, id, *commit, *first, now)?;
            // Journaled once per recovery, also when the start that wrote the marker was
            // killed before its journal entry (the sidecar counts recoveries from it). A
            // journal that cannot be read is an error, never "not journaled yet": that
            // would count the recovery twice.
            let journaled = journal::read(dir)
                .map_err(VolumeError::from)?
                .iter()
                .any(|e| e.action == ActionKind::Recover && e.reason.contains(id.as_str()));
            if !journaled {
                record(dir, facts, d, now)?;
            }
            tracing::warn!(recovery = %id, commit_index = forced_from, "recovery: starting etcd with --force-new-cluster on this volume's data; the other pods join it as new learners");
            Ok(Next::Exec(StartMode::ForceNewCluster))
        }
        Action::Bootstrap(step @ Bootstrap::Prepare { marker: m }) => {
            if let Some(point) = &m.snapshot {
                // Download and check the snapshot before offering it to the formation: a
                // corrupt one is noted and the next round chooses another. A restore point
                // (a snapshot and archived segments) is replayed now, into the file Start
                // restores.
                let (store, manifest) = find_snapshot(world, point).await?;
                let name = &manifest.name;
                if let Err(e) = download(store, &manifest, dir).await {
                    // Remembered only for what cannot change by itself: these bytes, or
                    // these keys. A store or disk error is not remembered: it is retried.
                    let content = match facts.backups.snapshot(name) {
                        Some(s) => s.content.clone(),
                        None => SnapshotContent {
                            sha256: manifest.sha256.clone(),
                            ..SnapshotContent::default()
                        },
                    };
                    let Some(failed) = rejection(&e, content) else {
                        return Err(e.into());
                    };
                    marker::reject_snapshot(
                        dir,
                        &Rejection {
                            name: name.clone(),
                            failed: failed.clone(),
                        },
                    )?;
                    match failed {
                        Failed::Key {
                            encrypted_to,
                            configured,
                            ..
                        } => {
                            tracing::warn!(snapshot = %name, encrypted_to = %encrypted_to, configured_keys = ?configured, reason = %e, "no configured key opens this backup; it is tried again once the configured keys change; the next round chooses another")
                        }
                        _ => {
                            tracing::warn!(snapshot = %name, reason = %e, "backup fails its checksum; it is tried again once its stored object changes; the next round chooses another")
                        }
                    }
                    return Ok(Next::LookAgain(Pause::Now));
                }
                point_file(world, store, &manifest, point).await?;
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
            let (mode, restored) = match snapshot {
                Some(name) => {
                    // A restore etcd's tool cannot do fails the same at every try: the
                    // loop notes it for /ready and status while it waits (retry::policy).
                    let restored = restore(world, name, token).await?;
                    (StartMode::Restored, Some(restored))
                }
                None => (
                    StartMode::New {
                        initial_cluster: initial_cluster.clone(),
                        token: token.clone(),
                    },
                    None,
                ),
            };
            journal::append(
                dir,
                &journal::Entry {
                    restored,
                    ..entry(facts, d, now)
                },
            )?;
            // A restored member starts on its WAL: etcd asks no peer whether the cluster
            // is bootstrapped, so there is nothing to wait for.
            if facts.ordinal != 0 && matches!(mode, StartMode::New { .. }) {
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
                // Once per request: this volume is not set aside for it again. Before the
                // journal, whose write may fail (a full disk): without the marker the data
                // restored next would go aside again for the same request.
                marker::write_restored_for(dir, &r.id)?;
            }
            if let Some(to) = &moved {
                // Journaled after the move, so into the fresh member directory: the journal
                // before it went aside with the data. Killed in between, the set-aside is
                // not journaled (nor posted as an Event); the data is aside either way.
                let to = to.strip_prefix(dir).unwrap_or(to).display().to_string();
                let set_aside = journal::SetAside {
                    why: why.slug().to_string(),
                    to,
                };
                journal::append(
                    dir,
                    &journal::Entry {
                        set_aside: Some(set_aside),
                        // The cluster's word was about the data that went aside.
                        ..journal::Entry::new(now, d.action.kind(), d.reason())
                    },
                )?;
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
        Action::Snapshot { via } => {
            snapshot_through(cfg, world.store, via).await?;
            record(dir, facts, d, now)?;
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

/// Before the forced start of recovery `id`: copy the member directory aside (once per
/// recovery), record the marker, and move the WAL's commit index to its last entry, so that
/// `--force-new-cluster` keeps every entry (etcd writes a commit-only hard state without an
/// fsync, and discards the entries after the commit index on disk). Returns the commit
/// index etcd starts from.
///
/// Exactly once, wherever it is killed: on the first start (`first`) the marker records the
/// commit index the patch will give, before the patch; a later start patches to the
/// marker's index only. Right before etcd starts, the marker always holds the commit index
/// on disk, so the forced start (which commits its configuration change after the last
/// entry) is what moves the commit index past it, and `RecoveryMarker::applied` holds.
fn prepare_forced_start(
    dir: &Path,
    id: &str,
    commit: u64,
    first: bool,
    now: u64,
) -> Result<u64, VolumeError> {
    let unreadable = |source| VolumeError::Unreadable {
        path: dir.to_path_buf(),
        source,
    };
    let wal_dir = dir.join("member").join("wal");
    match volume::copy_aside(dir, BEFORE_RECOVERY, id, now)? {
        Some((to, true)) => {
            tracing::warn!(recovery = %id, copied_to = %to.display(), "recovery: this volume's member directory copied aside before the forced start (the forced start runs on the data in place)")
        }
        Some((to, false)) => {
            tracing::info!(recovery = %id, copied_to = %to.display(), "recovery: the copy made before the forced start is already there")
        }
        None => {}
    }
    let target = if first {
        let (target, why) = volume::wal::reachable_commit(&wal_dir)
            .map_err(unreadable)?
            .unwrap_or((commit, None));
        if let Some(why) = why {
            tracing::warn!(recovery = %id, commit_index = target, "recovery: {why}");
        }
        marker::write_recovery(
            dir,
            &crate::facts::RecoveryMarker {
                id: id.to_string(),
                commit: target,
            },
        )?;
        target
    } else {
        commit
    };
    if let volume::wal::Patched::Moved { file, from, to } =
        volume::wal::patch_commit(&wal_dir, target).map_err(unreadable)?
    {
        tracing::warn!(recovery = %id, wal = %file.display(), from, to, "recovery: the WAL's commit index moved to its last entry, so the forced start keeps every entry written");
    }
    let on_disk = volume::log_tail(dir)?.map_or(target, |t| t.commit);
    if on_disk != target {
        // The patch could not be made as planned: the marker says what etcd starts from.
        tracing::warn!(recovery = %id, planned = target, commit_index = on_disk, "recovery: the WAL's commit index is not the one planned; the marker records the one on disk");
        marker::write_recovery(
            dir,
            &crate::facts::RecoveryMarker {
                id: id.to_string(),
                commit: on_disk,
            },
        )?;
    }
    Ok(on_disk)
}

/// The suffix of the copy made before a forced start (`set-aside/<time>-before-recovery`).
const BEFORE_RECOVERY: &str = "before-recovery";

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
        let answer = crate::http_client::etcd_peer_version(
            &cfg.identity,
            cfg.peer_tls.as_ref(),
            0,
            ip,
            SEED_ANSWER_TIMEOUT,
        )
        .await;
        if answer.is_ok() {
            tracing::info!(seed = %host, waited = ?started.elapsed(), "ordinal 0's etcd serves; starting etcd");
            return;
        }
        tokio::time::sleep(SEED_POLL).await;
    }
    tracing::info!(seed = %host, waited = ?started.elapsed(), "ordinal 0's etcd does not serve yet; starting etcd anyway (the other members can form a quorum)");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::crypt::CryptError;
    use crate::backup::store::StoreError;
    use crate::facts::RecoveryMarker;
    use crate::volume::wal::tests::WalFile;

    fn content() -> SnapshotContent {
        SnapshotContent {
            sha256: "ab".into(),
            size: Some(10),
            etag: Some("e1".into()),
        }
    }

    #[test]
    fn a_store_or_disk_error_is_never_remembered_as_a_rejection() {
        let store = RestoreError::Store(StoreError::Io {
            store: "s3://b".into(),
            op: "get",
            name: "snapshots/s1.db".into(),
            detail: "connection reset".into(),
        });
        let gone = RestoreError::Store(StoreError::NotFound {
            store: "s3://b".into(),
            name: "snapshots/s1.db".into(),
        });
        let disk = RestoreError::Decrypt(CryptError::Local {
            name: "s1".into(),
            detail: "No space left on device".into(),
        });
        for e in [store, gone, disk] {
            assert_eq!(rejection(&e, content()), None, "{e}");
        }
    }

    #[test]
    fn bad_bytes_are_remembered_with_their_content_and_a_key_that_does_not_open_with_the_keys() {
        let torn = RestoreError::Checksum {
            name: "s1".into(),
            detail: "sha256 mismatch".into(),
        };
        assert_eq!(
            rejection(&torn, content()),
            Some(Failed::Checksum {
                content: content(),
                detail: "sha256 mismatch".into()
            })
        );
        let wrong_key = RestoreError::Decrypt(CryptError::NoKey {
            name: "s1".into(),
            fingerprint: "sha256:right".into(),
            have: vec!["sha256:wrong".into()],
        });
        assert_eq!(
            rejection(&wrong_key, content()),
            Some(Failed::Key {
                content: content(),
                encrypted_to: "sha256:right".into(),
                configured: vec!["sha256:wrong".into()],
            })
        );
    }

    const WAL: &str = "member/wal/0000000000000000-0000000000000000.wal";

    /// A volume whose log ends at 14 while its newest hard state commits 12.
    fn lagging_volume() -> std::io::Result<tempfile::TempDir> {
        let tmp = tempfile::tempdir()?;
        let mut wal = WalFile::head(7, 9, 0);
        wal.state(3, 2, 10);
        for index in 11..=14 {
            wal.entry(3, index);
        }
        wal.state(3, 2, 12);
        wal.bytes.extend([0u8; 4096]);
        std::fs::create_dir_all(tmp.path().join("member/wal"))?;
        std::fs::write(tmp.path().join(WAL), &wal.bytes)?;
        Ok(tmp)
    }

    fn commit_on_disk(dir: &Path) -> Option<u64> {
        volume::log_tail(dir).ok().flatten().map(|t| t.commit)
    }

    /// A recovery marker for "r1" planned to start from `commit`.
    fn mark_recovery(dir: &Path, commit: u64) -> Result<(), VolumeError> {
        marker::write_recovery(
            dir,
            &RecoveryMarker {
                id: "r1".into(),
                commit,
            },
        )
    }

    fn marker_commit(dir: &Path) -> Option<u64> {
        marker::recovery(dir).ok().flatten().map(|m| m.commit)
    }

    #[test]
    fn a_first_forced_start_copies_aside_patches_and_records_the_commit_it_starts_from(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = lagging_volume()?;
        let dir = tmp.path();
        assert_eq!(prepare_forced_start(dir, "r1", 12, true, 100)?, 14);
        assert_eq!(commit_on_disk(dir), Some(14));
        assert_eq!(marker_commit(dir), Some(14));
        // The copy holds the WAL as it was before the patch.
        let copy = dir.join("set-aside/100-before-recovery").join(WAL);
        let tail = volume::wal::tail(copy.parent().ok_or("no parent")?)?;
        assert_eq!(tail.map(|t| t.commit), Some(12));
        // Killed before etcd started: the next start is forced again, and writes nothing.
        let m = marker::recovery(dir)?.ok_or("no marker")?;
        assert!(!m.applied(volume::log_tail(dir)?.as_ref()));
        let before = std::fs::read(dir.join(WAL))?;
        assert_eq!(prepare_forced_start(dir, "r1", m.commit, false, 101)?, 14);
        assert_eq!(std::fs::read(dir.join(WAL))?, before);
        assert!(!dir.join("set-aside/101-before-recovery").exists());
        Ok(())
    }

    #[test]
    fn a_start_killed_between_the_marker_and_the_patch_patches_to_the_marker_then_forces(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = lagging_volume()?;
        let dir = tmp.path();
        mark_recovery(dir, 14)?;
        assert_eq!(prepare_forced_start(dir, "r1", 14, false, 100)?, 14);
        assert_eq!(commit_on_disk(dir), Some(14));
        Ok(())
    }

    #[test]
    fn a_patch_that_cannot_be_made_leaves_the_marker_at_the_commit_index_on_disk(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let tmp = lagging_volume()?;
        let dir = tmp.path();
        // The marker planned 14, but the tail is torn now: etcd starts from 12 and the
        // forced start's own entries (13 on) must count as "applied".
        let mut bytes = std::fs::read(dir.join(WAL))?;
        let end = bytes.iter().rposition(|b| *b != 0).ok_or("empty")? + 1;
        let end = end.next_multiple_of(8);
        bytes[end..end + 8].copy_from_slice(&[0xff; 8]);
        std::fs::write(dir.join(WAL), &bytes)?;
        mark_recovery(dir, 14)?;
        assert_eq!(prepare_forced_start(dir, "r1", 14, false, 100)?, 12);
        assert_eq!(marker_commit(dir), Some(12));
        assert_eq!(commit_on_disk(dir), Some(12));
        Ok(())
    }
}
