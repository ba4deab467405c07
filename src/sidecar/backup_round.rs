//! Backup rounds in the background: the executor starts one (`Backups::tick` through a
//! fresh connection to the local member) in its own task, so a round that streams a large
//! snapshot or runs the drill's throw-away etcd for minutes never holds up the loop
//! (`/healthz`, `/ready`); the loop drains the rounds that ended into the next observation.

use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::plan::backup::RoundEnd;
use crate::backup::schedule::BackupMetrics;
use crate::backup::snapshot::{EtcdSource, EtcdTarget};
use crate::backup::Backups;
use crate::config::Config;

/// Starts backup rounds and collects how they ended.
pub struct BackupRounds {
    /// The store and the drill's setup, or why the store cannot be opened (each round then
    /// fails with it, counted like any other failure).
    backups: Result<Backups, String>,
    target: EtcdTarget,
    ended_tx: mpsc::UnboundedSender<RoundEnd>,
    ended_rx: mpsc::UnboundedReceiver<RoundEnd>,
    /// The last round's error, so a failure that repeats is logged once.
    failing: Option<String>,
}

impl BackupRounds {
    /// `None` without `--backup-url`.
    pub fn new(cfg: &Config) -> Option<BackupRounds> {
        let backup = cfg.backup.as_ref()?;
        let backups = Backups::new(backup, cfg.etcd_bin.clone()).map_err(|e| e.to_string());
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        Some(BackupRounds {
            backups,
            target: EtcdTarget::local(&cfg.identity, cfg.local_ip(), &cfg.etcd),
            ended_tx,
            ended_rx,
            failing: None,
        })
    }

    /// Starts one round in its own task.
    pub fn start(&self) {
        let round = tokio::spawn(round(self.backups.clone(), self.target.clone()));
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

    /// The rounds that ended since the last call; logs a failure once while it repeats.
    pub fn ended(&mut self) -> Vec<RoundEnd> {
        let mut ended = Vec::new();
        while let Ok(end) = self.ended_rx.try_recv() {
            self.log(&end);
            ended.push(end);
        }
        ended
    }

    fn log(&mut self, end: &RoundEnd) {
        let error = match end {
            RoundEnd::Failed { error, .. } => Some(error),
            RoundEnd::Ran { take_error, .. } => take_error.as_ref(),
        };
        match (error, &self.failing) {
            (Some(e), Some(before)) if e == before => {
                tracing::debug!(error = %e, "backup round failed again; retrying at the next round");
            }
            (Some(e), _) => {
                tracing::warn!(error = %e, "backup round failed; counted in etcd_steward_backup_failures_total, retried at the next round");
            }
            (None, Some(_)) => tracing::info!("backup round succeeded again"),
            (None, None) => {}
        }
        self.failing = error.cloned();
    }
}

fn failed(mut metrics: BackupMetrics, took: Duration, error: String) -> RoundEnd {
    // Every failed round counts once, whatever step failed.
    if metrics.failures == 0 && metrics.drill_failures == 0 {
        metrics.snapshot_failed(took);
    }
    RoundEnd::Failed { metrics, error }
}

/// One round: connect to the local member, then `Backups::tick` as leader.
async fn round(backups: Result<Backups, String>, target: EtcdTarget) -> RoundEnd {
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
    match backups
        .tick(&source, true, SystemTime::now(), &mut metrics)
        .await
    {
        Ok(report) => {
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
            RoundEnd::Ran {
                metrics,
                newest_verified: report.newest_verified.map(|m| (m.time_unix, m.revision)),
                take_error: report.take_error.or(unverified),
            }
        }
        Err(e) => failed(metrics, started.elapsed(), e.to_string()),
    }
}
