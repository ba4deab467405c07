//! The backup schedule, by the leader's sidecar only: when a backup round (take → prune →
//! drill, `Backups::tick`) is due, and what the finished rounds report. Whether a snapshot
//! is actually taken is the store's to say (the round compares its newest snapshot's time
//! with the interval), so a change of leader causes neither a duplicate nor a gap; this
//! planner only decides when to look: while this member leads, one round at a time, and
//! not more often than [`round_every`] (each round lists the store).

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::{Outcome, Planner, Step};
use crate::backup::schedule::BackupMetrics;
use crate::sidecar::http::metrics::{OptionalGauge, OptionalSeconds};
use crate::sidecar::observe::Observation;

/// The longest pause between two rounds: a snapshot comes at most this late after it is due.
pub const ROUND_EVERY: Duration = Duration::from_secs(15);

/// How long after a round started the next may start: [`ROUND_EVERY`], or a quarter of a
/// shorter interval (at least a second), so a snapshot is never late by much of one.
pub fn round_every(interval: Duration) -> Duration {
    (interval / 4).clamp(Duration::from_secs(1), ROUND_EVERY)
}

/// How a backup round ended, as the loop hands it to the planner on a later tick.
#[derive(Debug, Clone, PartialEq)]
pub enum RoundEnd {
    /// The round ran. A snapshot that failed inside it is counted in `metrics` and named in
    /// `take_error`.
    Ran {
        /// What this round counted (failures) and measured (the values it set).
        metrics: BackupMetrics,
        /// The store's newest verified snapshot after the round: its Unix time and revision.
        newest_verified: Option<(u64, i64)>,
        take_error: Option<String>,
    },
    /// The round could not run to its end (etcd or the store unreachable, …); the error, as
    /// logged. `metrics` counts the failure.
    Failed {
        metrics: BackupMetrics,
        error: String,
    },
}

impl RoundEnd {
    pub fn metrics(&self) -> &BackupMetrics {
        match self {
            RoundEnd::Ran { metrics, .. } | RoundEnd::Failed { metrics, .. } => metrics,
        }
    }
}

/// The backup metrics (names are a contract: the alerts and docs/reference.md read them).
#[derive(Debug, Clone, Default)]
struct Metrics {
    last_success: OptionalSeconds,
    last_revision: OptionalGauge,
    failures: Counter,
    duration: OptionalSeconds,
    size: OptionalGauge,
    verified_revision: OptionalGauge,
    drill_last_success: OptionalSeconds,
    drill_failures: Counter,
}

impl Metrics {
    fn register(registry: &mut Registry) -> Self {
        let m = Metrics::default();
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
        m
    }

    fn absorb(&self, end: &RoundEnd) {
        let d = end.metrics();
        self.failures.inc_by(d.failures);
        self.drill_failures.inc_by(d.drill_failures);
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
        } = end
        {
            self.last_success.set(*time as f64);
            self.last_revision.set(u64::try_from(*revision).ok());
        }
    }
}

/// Plans backup rounds while this member leads; exports what they report.
#[derive(Debug)]
pub struct Backup {
    every: Duration,
    in_flight: bool,
    last_start: Option<Instant>,
    metrics: Metrics,
}

impl Backup {
    /// For snapshots every `interval`; registers the backup metrics.
    pub fn new(interval: Duration, registry: &mut Registry) -> Self {
        Backup {
            every: round_every(interval),
            in_flight: false,
            last_start: None,
            metrics: Metrics::register(registry),
        }
    }

    /// Whether a round runs now (started and not reported yet).
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }
}

impl Planner for Backup {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        for end in &seen.backup_rounds {
            self.in_flight = false;
            self.metrics.absorb(end);
        }
        let leads = seen
            .local
            .status
            .as_ref()
            .is_ok_and(|s| s.leader != 0 && s.leader == s.member_id && !s.is_learner);
        let recent = self
            .last_start
            .is_some_and(|t| seen.now.duration_since(t) < self.every);
        if !leads || self.in_flight || recent {
            return Vec::new();
        }
        self.last_start = Some(seen.now);
        vec![Step::BackupRound]
    }

    fn learn(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Done(Step::BackupRound) => self.in_flight = true,
            Outcome::Failed(Step::BackupRound, _) => {
                self.metrics.failures.inc();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_come_every_15_s_or_a_quarter_of_a_shorter_interval() {
        assert_eq!(round_every(Duration::from_secs(1800)), ROUND_EVERY);
        assert_eq!(round_every(Duration::from_secs(20)), Duration::from_secs(5));
        assert_eq!(round_every(Duration::from_secs(1)), Duration::from_secs(1));
    }
}
