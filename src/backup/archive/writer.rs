//! The archive's writer: one round carries every change since the last archived revision
//! into the store, in segments. Where it continues from: what the previous round reached
//! (remembered), or, on the first round of a term and after any error, the store's own
//! word (the newest verified snapshot of this cluster and the segments that continue it),
//! so a change of leader leaves no gap. A start revision etcd has compacted away is a
//! break: a snapshot is taken at once and the chain starts again from it.
//!
//! Each revision is stamped with the time this round received it: while the archive keeps
//! up, within `--archive-interval` of the write (a round that catches up stamps the
//! backlog with its own time).

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use super::chain::chain;
use super::segment::{Builder, Op};
use super::stored;
use super::watch::{self, WatchError};
use crate::backup::snapshot::EtcdSource;
use crate::backup::{catalog, Backups};

/// A segment is cut once its events reach this many bytes (keys and values), even before
/// the round ends: memory stays bounded while a round catches up a backlog.
pub const SEGMENT_CAP: usize = 4 << 20;

/// Bytes an op adds to a segment's encoding (see `segment`'s format).
fn op_size(op: &Op) -> usize {
    match op {
        Op::Put { key, value, .. } => 1 + 4 + key.len() + 4 + value.len() + 8,
        Op::Delete { key } => 1 + 4 + key.len(),
    }
}

/// Where the archive of a cluster stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reach {
    cluster_id: u64,
    /// Every revision up to this one is in the store (or in the snapshot it continues).
    last_revision: i64,
    /// When the archiver received it (or the snapshot's time), Unix ms.
    last_time_unix_ms: u64,
}

/// What one round did: the executor turns it into metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundReport {
    /// The last archived revision after the round, when known.
    pub last_revision: Option<i64>,
    /// How old the newest archived event is while newer ones exist (0: all archived);
    /// `None` when the round could not tell (etcd did not answer).
    pub lag_seconds: Option<f64>,
    /// Segments stored.
    pub segments: u64,
    /// Snapshots taken because the chain could not be continued.
    pub breaks: u64,
    /// Why the round did not finish (counted once as a failure).
    pub error: Option<String>,
}

/// The writer of one sidecar: the store, and what the previous rounds reached.
#[derive(Debug)]
pub struct Archiver {
    backups: Backups,
    reach: Option<Reach>,
    /// The last reach known, kept when `reach` is forgotten: how far behind the archive is
    /// while rounds fail.
    known: Option<Reach>,
    /// The member's cluster and revision at the start of the last round.
    current: Option<watch::Current>,
    /// Lease IDs whose TTL this cluster's archive holds already (asked once each).
    leases: BTreeSet<i64>,
    cap: usize,
}

fn unix_ms(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(0)
}

fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

/// Seconds since `unix_ms`.
fn lag_since(unix_ms: u64) -> f64 {
    now_ms().saturating_sub(unix_ms) as f64 / 1000.0
}

impl Archiver {
    pub fn new(backups: Backups) -> Self {
        Archiver {
            backups,
            reach: None,
            known: None,
            current: None,
            leases: BTreeSet::new(),
            cap: SEGMENT_CAP,
        }
    }

    /// With segments cut at `cap` bytes (tests).
    pub fn with_cap(mut self, cap: usize) -> Self {
        self.cap = cap.max(1);
        self
    }

    /// Forgets what the previous rounds reached: the next round reads the store.
    pub fn forget(&mut self) {
        self.reach = None;
        self.leases.clear();
    }

    /// One round against the local member `source`. Any error makes the next round read
    /// the store again.
    pub async fn round(&mut self, source: &EtcdSource) -> RoundReport {
        let mut report = RoundReport::default();
        self.current = None;
        let done = self.carry(source, &mut report).await;
        if self.reach.is_some() {
            self.known = self.reach;
        }
        report.last_revision = self.known.map(|r| r.last_revision);
        match done {
            Ok(()) => report.lag_seconds = Some(0.0),
            Err(error) => {
                report.error = Some(error);
                // Behind when the member is past the last archived revision: the lag grows
                // while the store (or anything else the round needs) stays down.
                if let (Some(c), Some(k)) = (self.current, self.known) {
                    if c.cluster_id == k.cluster_id && c.revision > k.last_revision {
                        report.lag_seconds = Some(lag_since(k.last_time_unix_ms));
                    }
                }
                self.forget();
            }
        }
        report
    }

    /// Archives up to the member's current revision.
    async fn carry(&mut self, source: &EtcdSource, report: &mut RoundReport) -> Result<(), String> {
        let current = watch::current(source).await.map_err(|e| e.to_string())?;
        self.current = Some(current);
        let reach = match self.reach.filter(|r| r.cluster_id == current.cluster_id) {
            Some(r) => r,
            None => {
                self.leases.clear();
                self.resume_from_store(source, current.cluster_id, report)
                    .await?
            }
        };
        self.reach = Some(reach);
        if current.revision <= reach.last_revision {
            return Ok(());
        }
        let from = reach.last_revision + 1;
        let mut changes = match watch::changes(source, from, current.revision).await {
            Ok(c) => c,
            Err(e) => return self.broken(source, e, report).await,
        };
        let mut pending = self.builder()?;
        let mut size = 0usize;
        loop {
            let got = match changes.next(now_ms).await {
                Ok(got) => got,
                Err(e) => {
                    changes.close().await;
                    return self.broken(source, e, report).await;
                }
            };
            let Some(revisions) = got else { break };
            for r in revisions {
                if r.revision <= reach.last_revision {
                    continue;
                }
                for op in &r.ops {
                    size += op_size(op);
                    if let Op::Put { lease, .. } = op {
                        if *lease != 0 && !self.leases.contains(lease) && !pending.has_lease(*lease)
                        {
                            let ttl = watch::lease_ttl(source, *lease)
                                .await
                                .map_err(|e| e.to_string())?;
                            pending.lease(*lease, ttl);
                        }
                    }
                }
                size += 20;
                // Encoded and compressed now; its events go.
                pending
                    .push(&r)
                    .map_err(|e| format!("compressing a segment: {e}"))?;
            }
            if size >= self.cap {
                self.store(&mut pending, current.cluster_id, report).await?;
                size = 0;
            }
        }
        changes.close().await;
        self.store(&mut pending, current.cluster_id, report).await
    }

    /// A segment to fill, with room for the cap.
    fn builder(&self) -> Result<Builder, String> {
        Builder::new(self.cap).map_err(|e| format!("starting a segment: {e}"))
    }

    /// Stores `pending` (when it holds anything) and moves the reach past it.
    async fn store(
        &mut self,
        pending: &mut Builder,
        cluster_id: u64,
        report: &mut RoundReport,
    ) -> Result<(), String> {
        let Some((last_revision, last_time_unix_ms)) = pending.last() else {
            return Ok(());
        };
        // Taken: a failed put ends the round, and the next one watches again from the reach.
        let segment = std::mem::replace(pending, self.builder()?);
        let leases: Vec<i64> = segment.lease_ids().collect();
        let m = stored::put_built(&self.backups.store, cluster_id, segment)
            .await
            .map_err(|e| e.to_string())?;
        tracing::debug!(segment = %m.name, events = m.events, size = m.size, "archive segment stored");
        self.leases.extend(leases);
        report.segments += 1;
        self.reach = Some(Reach {
            cluster_id,
            last_revision,
            last_time_unix_ms,
        });
        self.known = self.reach;
        Ok(())
    }

    /// Where the store says the archive of `cluster_id` stands: the end of the chain of
    /// segments continuing its newest verified snapshot. Without a snapshot of this
    /// cluster there is nothing to continue: one is taken now (a break when segments of
    /// this cluster exist, the start of its archive otherwise).
    async fn resume_from_store(
        &mut self,
        source: &EtcdSource,
        cluster_id: u64,
        report: &mut RoundReport,
    ) -> Result<Reach, String> {
        let store = &self.backups.store;
        let cluster = format!("{cluster_id:x}");
        let snapshots = catalog::list(store).await.map_err(|e| e.to_string())?;
        let Some(snapshot) = snapshots
            .iter()
            .find(|m| m.verified && m.cluster_id == cluster)
        else {
            let segments = stored::list(store).await.map_err(|e| e.to_string())?;
            let ours = segments.iter().any(|m| m.cluster_id == cluster);
            let why = if ours {
                "the store holds segments of this cluster but no verified snapshot of it to continue"
            } else {
                "the store holds no verified snapshot of this cluster yet"
            };
            return self.snapshot(source, cluster_id, why, ours, report).await;
        };
        // Only the segments reaching past the snapshot can continue it.
        let segments = stored::list_after(store, snapshot.revision)
            .await
            .map_err(|e| e.to_string())?;
        let c = chain(snapshot.revision, &cluster, &segments);
        if let Some(why) = &c.broken {
            tracing::warn!(snapshot = %snapshot.name, reach = c.last_revision, why = %why, "the archive has a hole after the newest snapshot: archiving again from the end of the continuous part");
        }
        Ok(Reach {
            cluster_id,
            last_revision: c.last_revision,
            last_time_unix_ms: c
                .last_time_unix_ms
                .unwrap_or(snapshot.time_unix.saturating_mul(1000)),
        })
    }

    /// The watch could not continue the chain: a break (a snapshot now) when etcd
    /// compacted the revisions away; any other error is the round's.
    async fn broken(
        &mut self,
        source: &EtcdSource,
        e: WatchError,
        report: &mut RoundReport,
    ) -> Result<(), String> {
        match e {
            WatchError::Compacted { .. } => {
                let cluster_id = self.reach.map(|r| r.cluster_id).unwrap_or_default();
                let why = e.to_string();
                let reach = self
                    .snapshot(source, cluster_id, &why, true, report)
                    .await?;
                self.reach = Some(reach);
                Ok(())
            }
            WatchError::Source(e) => Err(e.to_string()),
        }
    }

    /// Takes a snapshot now, through the backups' store, and starts the chain from it.
    async fn snapshot(
        &mut self,
        source: &EtcdSource,
        cluster_id: u64,
        why: &str,
        is_break: bool,
        report: &mut RoundReport,
    ) -> Result<Reach, String> {
        let now = SystemTime::now();
        let m = self.backups.take_now(source, now).await.map_err(|e| {
            format!("{why}; the snapshot that would start the chain again failed: {e}")
        })?;
        if is_break {
            report.breaks += 1;
            tracing::warn!(snapshot = %m.name, revision = m.revision, why = %why, "archive break: the chain of segments cannot be continued, so a snapshot was taken now and the archive continues from it (counted in etcd_steward_archive_breaks_total)");
        } else {
            tracing::info!(snapshot = %m.name, revision = m.revision, why = %why, "archive started from a snapshot taken now");
        }
        Ok(Reach {
            cluster_id,
            last_revision: m.revision,
            last_time_unix_ms: m.time_unix.saturating_mul(1000).max(unix_ms(now)),
        })
    }
}

/// Retention follows the snapshots: deletes the segments wholly before the oldest kept
/// snapshot's revision (after `catalog::prune`). Returns the objects deleted.
pub async fn prune(backups: &Backups) -> Result<Vec<String>, crate::backup::store::StoreError> {
    let kept = catalog::list(&backups.store).await?;
    match kept.iter().map(|m| m.revision).min() {
        Some(oldest) => stored::prune_before(&backups.store, oldest).await,
        None => Ok(Vec::new()),
    }
}
