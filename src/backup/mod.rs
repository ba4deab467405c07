//! Backups: checked etcd snapshots streamed into an object store, listed and pruned, restored
//! into an empty data directory, and proven restorable by a drill.
//!
//! The pieces, each callable on its own: [`store`] (the object store behind a narrow API),
//! [`snapshot`] (take one: etcd's stream → multipart upload, checksum verified on the way),
//! [`catalog`] (list manifests, prune), [`restore`] (fetch, verify, `etcdutl snapshot restore`,
//! move into place), [`drill`] (restore the newest into scratch and compare with the live
//! cluster), [`schedule`] (pure: take one now? drill now? and the metric values).

pub mod archive;
pub mod bolt;
pub mod catalog;
pub mod compress;
pub mod crypt;
pub mod drill;
pub mod fetch;
pub mod manifest;
pub mod offline_hash;
pub mod restore;
pub mod schedule;
pub mod scratch;
pub mod snapshot;
pub mod store;
pub mod tool;

use std::path::PathBuf;
use std::time::Duration;

pub use tool::EtcdTool;

/// Which snapshot `init` restores when every volume is lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreChoice {
    /// The newest snapshot that is verified and whose download passes its checksums.
    Latest,
    /// Never restore: form an empty cluster as without backups.
    Never,
    /// This snapshot (its name as `backup --list` prints it).
    Named(String),
    /// `revision:N`: the cluster as it was at revision N: the newest usable snapshot at or
    /// before it, with the archive replayed onto it up to N.
    Revision(i64),
    /// `time:RFC3339` (Unix milliseconds): the cluster as it was at that moment: the last
    /// revision the archive received at or before it, on the newest usable snapshot taken
    /// at or before it.
    Time(u64),
}

/// The validated backup options (`Config::backup`, present when `--backup-url` is given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupConfig {
    /// `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix` or `file:///path`.
    pub url: String,
    pub interval: Duration,
    /// How often the leader's sidecar writes an archive segment (`--archive-interval`);
    /// `None`: archiving is off.
    pub archive_interval: Option<Duration>,
    /// How many of the newest snapshots to keep (the newest verified one is always kept).
    pub keep: usize,
    /// etcd's offline tool: `etcdutl` (3.5+) or `etcdctl` (3.4).
    pub tool: EtcdTool,
    /// Where the drill restores and runs its throw-away etcd (an emptyDir in the manifests).
    pub scratch_dir: PathBuf,
    pub restore: RestoreChoice,
    /// The encryption key (and older keys, for reading).
    pub keys: crypt::Keys,
    /// How new snapshots are compressed (`--backup-compression`).
    pub compression: compress::Compression,
}

use std::time::SystemTime;

use thiserror::Error;

use manifest::Manifest;
use schedule::{BackupMetrics, Take};
use snapshot::SnapshotSource;
use store::{Store, StoreError};

#[derive(Debug, Error)]
pub enum BackupError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Take(#[from] snapshot::TakeError),
    #[error(transparent)]
    Source(#[from] snapshot::SourceError),
    /// Stored and listed, marked `verified: false`; never restored.
    #[error("snapshot {} is stored but not verified: {}", .0.name, .0.unverified_reason.as_deref().unwrap_or("no reason recorded"))]
    Unverified(Box<Manifest>),
}

/// What one round ([`Backups::tick`], or its halves `take_due` and `drill_due`) did.
#[derive(Debug, Default)]
pub struct TickReport {
    pub taken: Option<Manifest>,
    pub pruned: Vec<String>,
    pub drilled: Option<drill::DrillOutcome>,
    /// The archive drill of the snapshot before the newest, when one ran.
    pub archive_drilled: Option<archive::drill::ArchiveDrill>,
    /// The snapshot attempt's failure, already counted in the metrics.
    pub take_error: Option<String>,
    /// The store's newest verified snapshot after this tick (whoever took it): what the
    /// cluster could be restored from now.
    pub newest_verified: Option<Manifest>,
}

/// Backups for one running agent: the store and what the drill needs.
#[derive(Debug, Clone)]
pub struct Backups {
    pub config: BackupConfig,
    pub store: Store,
    pub drill: drill::DrillSetup,
}

impl Backups {
    /// Opens the store (no network call yet). `etcd_bin` runs the drill's throw-away etcd.
    pub fn new(config: &BackupConfig, etcd_bin: PathBuf) -> Result<Backups, StoreError> {
        Ok(Backups {
            store: Store::open(&config.url)?
                .with_keys(config.keys.clone())
                .with_compression(config.compression),
            drill: drill::DrillSetup {
                tool: config.tool.clone(),
                etcd_bin,
                scratch_dir: config.scratch_dir.clone(),
                start_timeout: Duration::from_secs(30),
                auth: None,
            },
            config: config.clone(),
        })
    }

    /// The cluster's etcd credentials, for the drill's throw-away etcd: a snapshot taken
    /// with etcd's authentication on restores with it on.
    pub fn with_etcd_auth(mut self, auth: Option<crate::etcd::Auth>) -> Backups {
        self.drill.auth = auth;
        self
    }

    /// Takes one snapshot now from `source` and checks it; an unverified one is an error
    /// (it stays in the store, marked, and is never restored).
    pub async fn take_now<S: SnapshotSource>(
        &self,
        source: &S,
        now: SystemTime,
    ) -> Result<Manifest, BackupError> {
        let m = snapshot::take(source, &self.store, now).await?;
        if !m.verified {
            return Err(BackupError::Unverified(Box::new(m)));
        }
        Ok(m)
    }

    /// Every snapshot's manifest, newest first.
    pub async fn list(&self) -> Result<Vec<Manifest>, StoreError> {
        catalog::list(&self.store).await
    }

    /// Drills the newest verified snapshot against `live`; `None` when there is none.
    pub async fn drill_newest<S: SnapshotSource>(
        &self,
        live: &S,
        now: SystemTime,
    ) -> Result<Option<drill::DrillOutcome>, StoreError> {
        let manifests = self.list().await?;
        match manifests.iter().find(|m| m.verified) {
            Some(m) => Ok(Some(
                drill::drill(&self.store, m, &self.drill, live, now).await?,
            )),
            None => Ok(None),
        }
    }

    /// The sidecar's periodic round whole: [`Self::take_due`], then [`Self::drill_due`] (the
    /// sidecar runs the halves itself, to tell the archive between them).
    pub async fn tick<S: SnapshotSource>(
        &self,
        source: &S,
        is_leader: bool,
        now: SystemTime,
        metrics: &mut BackupMetrics,
    ) -> Result<TickReport, StoreError> {
        let (mut report, manifests) = self.take_due(source, is_leader, now, metrics).await?;
        self.drill_due(source, is_leader, &manifests, now, metrics, &mut report)
            .await?;
        Ok(report)
    }

    /// The sidecar's periodic round, first half: when this member leads and a snapshot is
    /// due (by the store's newest one), take it from `source` (the local member) and apply
    /// retention. Returns what it did (`newest_verified`: what the cluster could be
    /// restored from now) and the store's manifests, for [`Self::drill_due`]. A follower
    /// makes no call at all; a leader lists the store's manifests (one GET each) every
    /// call, so call it every 10–30 s, not every loop turn. Updates `metrics`; a failed
    /// snapshot is counted and retried at the next round.
    pub async fn take_due<S: SnapshotSource>(
        &self,
        source: &S,
        is_leader: bool,
        now: SystemTime,
        metrics: &mut BackupMetrics,
    ) -> Result<(TickReport, Vec<Manifest>), StoreError> {
        let mut report = TickReport::default();
        if !is_leader {
            return Ok((report, Vec::new()));
        }
        let mut manifests = match self.list().await {
            Ok(m) => m,
            Err(e) => {
                metrics.snapshot_failed(Duration::ZERO);
                return Err(e);
            }
        };
        let newest = manifests.first().map(Manifest::time);
        if let Take::Now(why) = schedule::should_take(is_leader, newest, now, self.config.interval)
        {
            let started = tokio::time::Instant::now();
            match snapshot::take(source, &self.store, now).await {
                Ok(m) => {
                    metrics.snapshot_taken(&m, started.elapsed(), now);
                    tracing::info!(snapshot = %m.name, revision = m.revision, size = m.size,
                        verified = m.verified, why = ?why, "snapshot taken");
                    report.taken = Some(m);
                }
                Err(e) => {
                    metrics.snapshot_failed(started.elapsed());
                    tracing::warn!(error = %e, "snapshot failed; retried at the next tick");
                    report.take_error = Some(e.to_string());
                }
            }
            // Retention runs after each attempt (it also clears failed uploads' leftovers).
            report.pruned = catalog::prune(&self.store, self.config.keep).await?;
            manifests = self.list().await?;
        }
        report.newest_verified = manifests.iter().find(|m| m.verified).cloned();
        Ok((report, manifests))
    }

    /// The round's second half, after [`Self::take_due`] (its `manifests`): drill the
    /// newest verified snapshot if it has not been drilled, and (archiving on) the archive
    /// continuing the one before it if not drilled yet, into `report`. A drill runs a
    /// throw-away etcd and can take minutes on a large database: the archive does not wait
    /// for it (`sidecar::plan::archive`).
    pub async fn drill_due<S: SnapshotSource>(
        &self,
        source: &S,
        is_leader: bool,
        manifests: &[Manifest],
        now: SystemTime,
        metrics: &mut BackupMetrics,
        report: &mut TickReport,
    ) -> Result<(), StoreError> {
        if let Some(m) = schedule::should_drill(is_leader, manifests) {
            match drill::drill(&self.store, m, &self.drill, source, now).await {
                Ok(outcome) => {
                    metrics.drilled(&outcome, now);
                    tracing::info!(snapshot = %outcome.snapshot, passed = outcome.passed,
                        detail = %outcome.detail,
                        archive = ?outcome.archive.as_ref().map(|a| &a.detail), "restore drill");
                    report.drilled = Some(outcome);
                }
                Err(e) => {
                    metrics.drill_failed();
                    return Err(e);
                }
            }
        }
        let archiving = self.config.archive_interval.is_some();
        if let Some(m) = schedule::should_drill_archive(is_leader, archiving, manifests) {
            match drill::drill_archive(&self.store, m, manifests, &self.drill, source, now).await {
                Ok(a) => {
                    metrics.archive_drilled(&a, true);
                    if a.passed {
                        tracing::info!(snapshot = %m.name, last_revision = a.last_revision,
                            hash_check = a.check.word(), detail = %a.detail, "archive drill");
                    } else {
                        tracing::warn!(snapshot = %m.name, last_revision = a.last_revision,
                            hash_check = a.check.word(), detail = %a.detail,
                            "archive drill failed; counted in etcd_steward_backup_drill_archive_failures_total");
                    }
                    report.archive_drilled = Some(a);
                }
                Err(e) => {
                    metrics.drill_failed();
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}
