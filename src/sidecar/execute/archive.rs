//! The archive executor: archive rounds in the background, and the metrics they report.
//! The executor starts one (`Archiver::round` through a fresh connection to the local
//! member) in its own task, so a round that waits on a slow or unreachable store never
//! holds up the loop (`/healthz`, `/ready`); the loop drains the rounds that ended into the
//! next observation.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, Mutex};

use crate::backup::archive::writer::{Archiver, RoundReport};
use crate::backup::snapshot::{EtcdSource, EtcdTarget};
use crate::backup::Backups;
use crate::config::Config;
use crate::sidecar::http::metrics::{OptionalGauge, OptionalSeconds};
use crate::sidecar::plan::{ArchiveEnd, Outcome, Step};

/// Starts archive rounds and collects how they ended.
pub struct ArchiveRounds {
    /// The writer (what the last round reached), or why the store cannot be opened (each
    /// round then fails with it, counted like any other failure). A round holds it while
    /// it runs.
    archiver: Result<Arc<Mutex<Archiver>>, String>,
    target: EtcdTarget,
    ended_tx: mpsc::UnboundedSender<RoundReport>,
    ended_rx: mpsc::UnboundedReceiver<RoundReport>,
    metrics: ArchiveExport,
    /// The last round's error, so a failure that repeats is logged once.
    failing: Option<String>,
}

impl ArchiveRounds {
    /// `None` without `--backup-url` or with `--archive-interval=0` (and then no archive
    /// metric is registered).
    pub fn new(cfg: &Config, registry: &mut Registry) -> Option<ArchiveRounds> {
        let backup = cfg.backup.as_ref()?;
        backup.archive_interval?;
        let archiver = Backups::new(backup, cfg.etcd_bin.clone())
            .map(|b| Arc::new(Mutex::new(Archiver::new(b))))
            .map_err(|e| e.to_string());
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        Some(ArchiveRounds {
            archiver,
            target: EtcdTarget::local(&cfg.identity, cfg.local_ip(), &cfg.etcd),
            ended_tx,
            ended_rx,
            metrics: ArchiveExport::register(registry),
            failing: None,
        })
    }

    /// Starts one round in its own task; `from_store`: the first of a term (see
    /// `Step::ArchiveRound`).
    pub fn start(&self, from_store: bool) {
        let archiver = self.archiver.clone();
        let target = self.target.clone();
        let round = tokio::spawn(async move {
            let archiver = match archiver {
                Ok(a) => a,
                Err(error) => {
                    return RoundReport {
                        error: Some(error),
                        ..RoundReport::default()
                    }
                }
            };
            let mut archiver = archiver.lock().await;
            if from_store {
                archiver.forget();
            }
            match EtcdSource::connect(&target).await {
                Ok(source) => archiver.round(&source).await,
                Err(e) => {
                    archiver.forget();
                    RoundReport {
                        error: Some(e.to_string()),
                        ..RoundReport::default()
                    }
                }
            }
        });
        let tx = self.ended_tx.clone();
        tokio::spawn(async move {
            let report = round.await.unwrap_or_else(|e| RoundReport {
                error: Some(format!("archive round ended abnormally: {e}")),
                ..RoundReport::default()
            });
            // The loop may have stopped (SIGTERM): nobody is left to tell.
            let _ = tx.send(report);
        });
    }

    /// The rounds that ended since the last call, their reports exported; logs a failure
    /// once while it repeats.
    pub fn ended(&mut self) -> Vec<ArchiveEnd> {
        let mut ended = Vec::new();
        while let Ok(report) = self.ended_rx.try_recv() {
            self.log(&report);
            self.metrics.absorb(&report);
            ended.push(match report.error {
                Some(error) => ArchiveEnd::Failed { error },
                None => ArchiveEnd::Archived {
                    last_revision: report.last_revision.unwrap_or_default(),
                },
            });
        }
        ended
    }

    /// What came of a step (see [`ArchiveExport::record`]).
    pub fn record(&self, outcome: &Outcome) {
        self.metrics.record(outcome);
    }

    fn log(&mut self, report: &RoundReport) {
        match (&report.error, &self.failing) {
            (Some(e), Some(before)) if e == before => {
                tracing::debug!(error = %e, "archive round failed again; retrying at the next round");
            }
            (Some(e), _) => {
                tracing::warn!(error = %e, "archive round failed; counted in etcd_steward_archive_failures_total, retried at the next round from the store's last archived revision");
            }
            (None, Some(_)) => {
                tracing::info!(last_revision = ?report.last_revision, "archive round succeeded again");
            }
            (None, None) => {}
        }
        self.failing = report.error.clone();
    }
}

/// The archive metrics (names are a contract: the alerts and docs/reference.md read them).
#[derive(Debug, Clone, Default)]
pub struct ArchiveExport {
    last_revision: OptionalGauge,
    lag: OptionalSeconds,
    segments: Counter,
    failures: Counter,
    breaks: Counter,
}

impl ArchiveExport {
    /// Registers every archive metric in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = ArchiveExport::default();
        registry.register(
            "etcd_steward_archive_last_revision",
            "The last revision in the continuous archive (segments, or the snapshot they continue), as this sidecar last archived it as leader",
            m.last_revision.clone(),
        );
        registry.register(
            "etcd_steward_archive_lag_seconds",
            "How old the newest archived change is while newer ones are not archived yet (0: every change is archived): the writes a loss of every volume would cost right now",
            m.lag.clone(),
        );
        registry.register(
            "etcd_steward_archive_segments",
            "Archive segments this sidecar stored",
            m.segments.clone(),
        );
        registry.register(
            "etcd_steward_archive_failures",
            "Archive rounds of this sidecar that failed (etcd or the store unreachable, a snapshot after a break failed)",
            m.failures.clone(),
        );
        registry.register(
            "etcd_steward_archive_breaks",
            "Snapshots this sidecar took because the archive could not be continued (etcd had compacted the next revision away)",
            m.breaks.clone(),
        );
        m
    }

    /// What a round that ended counted and measured.
    pub fn absorb(&self, report: &RoundReport) {
        self.segments.inc_by(report.segments);
        self.breaks.inc_by(report.breaks);
        if report.error.is_some() {
            self.failures.inc();
        }
        if let Some(r) = report.last_revision {
            self.last_revision.set(u64::try_from(r).ok());
        }
        if let Some(lag) = report.lag_seconds {
            self.lag.set(lag);
        }
    }

    /// What came of a step: a round that could not even start counts as a failure.
    pub fn record(&self, outcome: &Outcome) {
        if let Outcome::Failed(Step::ArchiveRound { .. }, _) = outcome {
            self.failures.inc();
        }
    }
}
