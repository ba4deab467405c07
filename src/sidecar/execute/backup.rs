//! The backup executor: rounds in the background, and the metrics they report. The executor starts one (`Backups::take_due`, then `drill_due`, through a
//! fresh connection to the local member) in its own task, so a round that streams a large
//! snapshot or runs the drill's throw-away etcd for minutes never holds up the loop
//! (`/healthz`, `/ready`); the loop drains the rounds that ended into the next observation.

use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use crate::backup::schedule::BackupMetrics;
use crate::backup::snapshot::{EtcdSource, EtcdTarget};
use crate::backup::Backups;
use crate::config::Config;
use crate::sidecar::http::metrics::{OptionalGauge, OptionalSeconds};
pub use crate::sidecar::plan::observation::RoundEnd;
use crate::sidecar::plan::snapshot_guard::TAKE_LIMIT;
use crate::sidecar::plan::{Outcome, Step};

/// How a round ended, and what it counted (failures) and measured (the values it set).
#[derive(Debug, Clone, PartialEq)]
pub struct RoundReport {
    /// What the planner is told.
    pub end: RoundEnd,
    /// What the metrics take.
    pub metrics: BackupMetrics,
}

/// Starts backup rounds and collects how they ended.
pub struct BackupRounds {
    /// The store and the drill's setup, or why the store cannot be opened (each round then
    /// fails with it, counted like any other failure).
    backups: Result<Backups, String>,
    target: EtcdTarget,
    ended_tx: mpsc::UnboundedSender<RoundReport>,
    ended_rx: mpsc::UnboundedReceiver<RoundReport>,
    metrics: BackupExport,
    /// The last round's error, so a failure that repeats is logged once.
    failing: Option<String>,
    /// Where a new failure is posted (a `BackupFailing` Event on this pod).
    pub events: crate::kube_api::events::Events,
}

impl BackupRounds {
    /// `None` without `--backup-url` (and then no backup metric is registered).
    pub fn new(cfg: &Config, registry: &mut Registry) -> Option<BackupRounds> {
        let backup = cfg.backup.as_ref()?;
        let backups = Backups::new(backup, cfg.etcd_bin.clone())
            .map(|b| b.with_etcd_auth(cfg.etcd.auth.clone()))
            .map_err(|e| e.to_string());
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        Some(BackupRounds {
            backups,
            target: EtcdTarget::local(&cfg.identity, cfg.local_ip(), &cfg.etcd),
            ended_tx,
            ended_rx,
            metrics: BackupExport::register(registry),
            failing: None,
            events: crate::kube_api::events::Events::off(),
        })
    }

    /// Starts one round in its own task. Once its snapshot step is done (before its
    /// drills), it says so ([`RoundEnd::Stored`]); then how it ended.
    pub fn start(&self) {
        let stored = self.ended_tx.clone();
        let round = tokio::spawn(round(self.backups.clone(), self.target.clone(), stored));
        let tx = self.ended_tx.clone();
        tokio::spawn(async move {
            let end = match round.await {
                Ok(end) => end,
                Err(e) => failed(
                    BackupMetrics::default(),
                    Duration::ZERO,
                    format!("backup round ended abnormally: {e}"),
                ),
            };
            // The loop may have stopped (SIGTERM): nobody is left to tell.
            let _ = tx.send(end);
        });
    }

    /// Takes one snapshot now from the local member, in its own task (request `request` of
    /// `plan::snapshot_guard`), given up after `TAKE_LIMIT`; it ends as
    /// [`RoundEnd::Requested`]. No prune, no drill: the next round does both.
    pub fn snapshot_now(&self, request: u64) {
        let backups = self.backups.clone();
        let target = self.target.clone();
        let tx = self.ended_tx.clone();
        tokio::spawn(async move {
            let mut metrics = BackupMetrics::default();
            let taken =
                match tokio::time::timeout(TAKE_LIMIT, snapshot(backups, target, &mut metrics))
                    .await
                {
                    Ok(taken) => taken,
                    Err(_) => {
                        metrics.snapshot_failed(TAKE_LIMIT);
                        Err(format!(
                            "the snapshot took longer than {}s",
                            TAKE_LIMIT.as_secs()
                        ))
                    }
                };
            let _ = tx.send(RoundReport {
                end: RoundEnd::Requested { request, taken },
                metrics,
            });
        });
    }

    /// The rounds that ended since the last call, their reports exported; logs a failure
    /// once while it repeats.
    pub fn ended(&mut self) -> Vec<RoundEnd> {
        let mut ended = Vec::new();
        while let Ok(report) = self.ended_rx.try_recv() {
            self.log(&report.end);
            self.metrics.absorb(&report);
            ended.push(report.end);
        }
        ended
    }

    /// What came of a step (see [`BackupExport::record`]).
    pub fn record(&self, outcome: &Outcome) {
        self.metrics.record(outcome);
    }

    fn log(&mut self, end: &RoundEnd) {
        let error = match end {
            RoundEnd::Failed { error, .. } => Some(error),
            RoundEnd::Ran { take_error, .. } => take_error.as_ref(),
            // Said again, with its drills, when the round ends.
            RoundEnd::Stored { .. } => return,
            RoundEnd::Requested { request, taken } => {
                match taken {
                    Ok((time, revision)) => {
                        tracing::info!(
                            request,
                            snapshot_unix = time,
                            revision,
                            "snapshot taken before a risky act"
                        )
                    }
                    Err(error) => {
                        tracing::warn!(request, %error, "the snapshot before a risky act failed; counted in etcd_steward_backup_failures_total; the act waits")
                    }
                }
                return;
            }
        };
        match (error, &self.failing) {
            (Some(e), Some(before)) if e == before => {
                tracing::debug!(error = %e, "backup round failed again; retrying at the next round");
            }
            (Some(e), _) => {
                tracing::warn!(error = %e, "backup round failed; counted in etcd_steward_backup_failures_total, retried at the next round");
                self.events.post(
                    crate::kube_api::events::Reason::BackupFailing,
                    format!("backup round failed (retried at the next round; counted in etcd_steward_backup_failures_total): {e}"),
                );
            }
            (None, Some(_)) => tracing::info!("backup round succeeded again"),
            (None, None) => {}
        }
        self.failing = error.cloned();
    }
}

fn failed(mut metrics: BackupMetrics, took: Duration, error: String) -> RoundReport {
    // Every failed round counts once, whatever step failed.
    if metrics.failures == 0 && metrics.drill_failures == 0 {
        metrics.snapshot_failed(took);
    }
    RoundReport {
        end: RoundEnd::Failed { error },
        metrics,
    }
}

/// One snapshot: connect to the local member, then `Backups::take_now` (verified, or an
/// error); its Unix time and revision. Counted in `metrics` either way.
async fn snapshot(
    backups: Result<Backups, String>,
    target: EtcdTarget,
    metrics: &mut BackupMetrics,
) -> Result<(u64, i64), String> {
    let started = tokio::time::Instant::now();
    let taken = async {
        let source = EtcdSource::connect(&target)
            .await
            .map_err(|e| e.to_string())?;
        let now = SystemTime::now();
        let m = backups?
            .take_now(&source, now)
            .await
            .map_err(|e| e.to_string())?;
        metrics.snapshot_taken(&m, started.elapsed(), now);
        Ok((m.time_unix, m.revision))
    }
    .await;
    if taken.is_err() {
        metrics.snapshot_failed(started.elapsed());
    }
    taken
}

/// One round: connect to the local member, then as leader `Backups::take_due`, said on
/// `stored` at once (the archive waits for it, not for the drills), then
/// `Backups::drill_due`.
async fn round(
    backups: Result<Backups, String>,
    target: EtcdTarget,
    stored: mpsc::UnboundedSender<RoundReport>,
) -> RoundReport {
    let mut metrics = BackupMetrics::default();
    let started = tokio::time::Instant::now();
    let backups = match backups {
        Ok(b) => b,
        Err(e) => return failed(metrics, Duration::ZERO, e),
    };
    let source = match EtcdSource::connect(&target).await {
        Ok(s) => s,
        Err(e) => return failed(metrics, started.elapsed(), e.to_string()),
    };
    let now = SystemTime::now();
    let (mut report, manifests) = match backups.take_due(&source, true, now, &mut metrics).await {
        Ok(taken) => taken,
        Err(e) => return failed(metrics, started.elapsed(), e.to_string()),
    };
    let _ = stored.send(RoundReport {
        end: RoundEnd::Stored {
            newest_verified: report
                .newest_verified
                .as_ref()
                .map(|m| (m.time_unix, m.revision)),
        },
        metrics: BackupMetrics::default(),
    });
    match backups
        .drill_due(&source, true, &manifests, now, &mut metrics, &mut report)
        .await
    {
        Ok(()) => {
            // Retention follows the snapshots: after the snapshots' (which runs after each
            // attempt), the archive segments wholly before the oldest kept snapshot.
            if report.taken.is_some() || report.take_error.is_some() {
                if let Err(e) = crate::backup::archive::writer::prune(&backups).await {
                    tracing::warn!(error = %e, "archive retention failed; retried after the next snapshot");
                }
            }
            // Stored but failing etcd's checksum: counted as a failure, and said as one.
            let unverified = report.taken.as_ref().filter(|m| !m.verified).map(|m| {
                format!(
                    "snapshot {} is stored but not verified: {}",
                    m.name,
                    m.unverified_reason
                        .as_deref()
                        .unwrap_or("no reason recorded")
                )
            });
            RoundReport {
                end: RoundEnd::Ran {
                    newest_verified: report.newest_verified.map(|m| (m.time_unix, m.revision)),
                    take_error: report.take_error.or(unverified),
                },
                metrics,
            }
        }
        Err(e) => failed(metrics, started.elapsed(), e.to_string()),
    }
}

/// The backup metrics (names are a contract: the alerts and docs/reference.md read them): what
/// the rounds report, exported here rather than by the planner.
#[derive(Debug, Clone, Default)]
pub struct BackupExport {
    last_success: OptionalSeconds,
    last_revision: OptionalGauge,
    failures: Counter,
    duration: OptionalSeconds,
    size: OptionalGauge,
    verified_revision: OptionalGauge,
    drill_last_success: OptionalSeconds,
    drill_failures: Counter,
    drill_archive_last_revision: OptionalGauge,
    drill_archive_failures: Counter,
}

impl BackupExport {
    /// Registers every backup metric in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = BackupExport::default();
        registry.register(
            "etcd_steward_backup_last_success_timestamp_seconds",
            "Unix time of the newest verified snapshot in the store, as this sidecar last saw it as leader",
            m.last_success.clone(),
        );
        registry.register(
            "etcd_steward_backup_last_revision",
            "Revision of the newest verified snapshot in the store, as this sidecar last saw it as leader",
            m.last_revision.clone(),
        );
        registry.register(
            "etcd_steward_backup_failures",
            "Backup rounds of this sidecar that failed (snapshot not taken or not verified, store or etcd unreachable)",
            m.failures.clone(),
        );
        registry.register(
            "etcd_steward_backup_duration_seconds",
            "How long this sidecar's last snapshot attempt took",
            m.duration.clone(),
        );
        registry.register(
            "etcd_steward_backup_size_bytes",
            "Size of the last verified snapshot this sidecar took",
            m.size.clone(),
        );
        registry.register(
            "etcd_steward_backup_verified_revision",
            "Revision of the newest snapshot a restore drill of this sidecar proved restorable",
            m.verified_revision.clone(),
        );
        registry.register(
            "etcd_steward_backup_drill_last_success_timestamp_seconds",
            "Unix time of this sidecar's last passing restore drill",
            m.drill_last_success.clone(),
        );
        registry.register(
            "etcd_steward_backup_drill_failures",
            "Restore drills of this sidecar that failed or could not run",
            m.drill_failures.clone(),
        );
        registry.register(
            "etcd_steward_backup_drill_archive_last_revision",
            "The last revision a passing archive drill of this sidecar replayed (the archive continuing a snapshot, its HashKV compared with the live cluster's)",
            m.drill_archive_last_revision.clone(),
        );
        registry.register(
            "etcd_steward_backup_drill_archive_failures",
            "Archive drills of this sidecar that failed (a mismatch, a hole, a segment failing its checks; also counted in etcd_steward_backup_drill_failures_total)",
            m.drill_archive_failures.clone(),
        );
        m
    }

    /// What a round that ended counted and measured.
    pub fn absorb(&self, report: &RoundReport) {
        let d = &report.metrics;
        self.failures.inc_by(d.failures);
        self.drill_failures.inc_by(d.drill_failures);
        self.drill_archive_failures.inc_by(d.drill_archive_failures);
        if let Some(v) = d.drill_archive_last_revision {
            self.drill_archive_last_revision.set(u64::try_from(v).ok());
        }
        if let Some(v) = d.duration {
            self.duration.set(v);
        }
        if let Some(v) = d.size {
            self.size.set(Some(v));
        }
        if let Some(v) = d.verified_revision {
            self.verified_revision.set(u64::try_from(v).ok());
        }
        if let Some(v) = d.drill_last_success {
            self.drill_last_success.set(v);
        }
        // The newest verified snapshot in the store (whoever took it): a new leader exports
        // the cluster's last backup at its first round, not nothing until its own.
        if let RoundEnd::Ran {
            newest_verified: Some((time, revision)),
            ..
        }
        | RoundEnd::Requested {
            taken: Ok((time, revision)),
            ..
        } = report.end
        {
            self.last_success.set(time as f64);
            self.last_revision.set(u64::try_from(revision).ok());
        }
    }

    /// What came of a step: a round that could not even start counts as a failure.
    pub fn record(&self, outcome: &Outcome) {
        if let Outcome::Failed(Step::BackupRound, _) = outcome {
            self.failures.inc();
        }
    }
}
