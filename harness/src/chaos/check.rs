//! Checking what a run left: the outcome, the refusals its faults explain, the sentinels.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::schedule::{Event, Fault};
use crate::backup_taken::BackupTaken;
use crate::bounds::UNEXPLAINED_BOUND;
use crate::disaster::DisasterSeen;
use crate::kube_writer::KubeSeen;
use crate::writer::WriterReport;

/// What a run saw, for the checker and the results file.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed of the schedule.
    pub seed: u64,
    /// How many faults were applied.
    pub faults: usize,
    /// What the writer saw.
    pub writes: WriterReport,
    /// Per pod: acknowledged writes missing from a linearizable read through it (`None`:
    /// the read failed).
    pub missing: Vec<Option<u64>>,
    /// Every cluster ID the pods reported.
    pub clusters: BTreeSet<u64>,
    /// Member IDs seen again after their volume was lost.
    pub reused_ids: Vec<u64>,
    /// Pods whose volume was never lost (nor rebuilt by the agent) but whose member ID
    /// changed.
    pub replaced: Vec<u32>,
    /// The pod whose value was corrupted on disk, and the write whose value it was.
    pub corrupted: Option<(u32, Option<u64>)>,
    /// The pod the agent rebuilt (its data set aside as diverged; its old member ID counts
    /// as lost).
    pub rebuilt: Option<u32>,
    /// How long after the value was corrupted every pod served written values alone.
    pub healed_after: Option<Duration>,
    /// When (since the run started) the runner saw the corrupted pod's etcd exit before it
    /// was healed: the agent stopping the diverged member, or its new member's start. Each
    /// explains writes refused as a restart of that pod does; the rest of the rebuild
    /// explains none (the healthy majority keeps serving writes).
    pub rebuild_stops: Vec<Duration>,
    /// After healing, per pod: a writer's key served (serializable read) with a value the
    /// writer never wrote under it (pod, key, value).
    pub unwritten: Vec<(u32, String, String)>,
    /// Pods that answered no serializable read of the writer's keys after healing.
    pub values_unread: Vec<u32>,
    /// Whether every pod was back as a ready voter within the bound after healing.
    pub recovered: bool,
    /// How many sentinels were planted in live data directories (and checked).
    pub sentinels: usize,
    /// Sentinels planted in a pod's live data that are nowhere on its volume any more (not
    /// live, not set aside) although the schedule never lost that volume: data deleted.
    pub deleted: Vec<(u32, String)>,
    /// How many records of a pod's WAL files (taken before each fault) were checked.
    pub wal_records: usize,
    /// WAL files recorded in a pod's live data before a fault that no data directory on its
    /// volume holds any more (live or set aside) although the schedule never lost that
    /// volume: data deleted ([`crate::wal_kept`]).
    pub wal_missing: Vec<(u32, String)>,
    /// Lines of the pods' logs (etcd's and the agent's) that report ENOSPC: evidence that a
    /// filled disk was felt.
    pub enospc_lines: usize,
    /// The backups taken during the faults, and the one taken after healing (last).
    pub backups: Vec<BackupTaken>,
    /// Defragmentations the sidecars counted (`etcd_steward_defrag_total`, read about once
    /// a second and summed over sidecar restarts: at least this many).
    pub defrags: u64,
    /// The faults as played: `at` when applied and `lasts` until healed, since the run
    /// started (a lost volume waits for every copy, so the schedule's times are not these).
    pub played: Vec<Event>,
    /// What the runner adds to every fault's cost (a container takes longer to start than
    /// a process).
    pub slack: Duration,
    /// From the disaster's strike until the recovery bound plus the time the pods were held
    /// on purpose: the disaster's own bound on refused writes.
    pub disaster_window: Option<(Duration, Duration)>,
    /// What generator 3's disaster left (`None`: the schedule had none).
    pub disaster: Option<DisasterSeen>,
    /// Under Kubernetes' API server as the writer (generator 6): what it served after
    /// healing, against what it acknowledged (`None`: the etcd writer wrote).
    pub kube: Option<KubeSeen>,
}

/// How long before the runner sees an etcd exit it may have happened: its loop looks every
/// 50 ms, but a look at every pod's values (about once a second) comes first.
pub const EXIT_SEEN: Duration = Duration::from_secs(1);

/// The stretches of time (since the run started) during which the faults as played (`at`
/// when applied, `lasts` until healed) explain writes refused: each fault from when it was
/// applied until its [`Fault::cost`](super::Fault::cost) after it was healed, plus `slack`.
pub fn explained(played: &[Event], slack: Duration) -> Vec<(Duration, Duration)> {
    played
        .iter()
        .filter(|e| e.fault.cost() > Duration::ZERO)
        .map(|e| (e.at, e.at + e.lasts + e.fault.cost() + slack))
        .collect()
}

/// How much of `[from, to)` none of `windows` covers.
pub fn uncovered(from: Duration, to: Duration, windows: &[(Duration, Duration)]) -> Duration {
    let mut parts: Vec<(Duration, Duration)> = windows
        .iter()
        .map(|(a, b)| ((*a).max(from), (*b).min(to)))
        .filter(|(a, b)| a < b)
        .collect();
    parts.sort();
    let mut covered = Duration::ZERO;
    let mut reach = from;
    for (a, b) in parts {
        let a = a.max(reach);
        if b > a {
            covered += b - a;
            reach = b;
        }
    }
    (to - from).saturating_sub(covered)
}

/// The longest refusal no fault explains, and which refusal it was part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unexplained {
    /// How much of the refusal no fault explains.
    pub length: Duration,
    /// The refusal (since the run started).
    pub refusal: (Duration, Duration),
}

impl Outcome {
    /// Acknowledged writes lost (the most any member lacks).
    pub fn lost(&self) -> u64 {
        self.missing.iter().flatten().copied().max().unwrap_or(0)
    }

    /// What the checker found wrong; empty when the run kept every promise.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (o, m) in self.missing.iter().enumerate() {
            match m {
                Some(0) => {}
                Some(n) => v.push(format!("pod {o} lacks {n} acknowledged writes")),
                None => v.push(format!("pod {o} answered no linearizable read")),
            }
        }
        for (o, key, value) in &self.unwritten {
            v.push(format!(
                "pod {o} serves {value:?} under {key}, a value never written there"
            ));
        }
        for o in &self.values_unread {
            v.push(format!(
                "pod {o} answered no serializable read of the written values"
            ));
        }
        if self.clusters.len() != 1 {
            v.push(format!("cluster IDs seen: {:x?}", self.clusters));
        }
        if !self.reused_ids.is_empty() {
            v.push(format!(
                "member IDs reused after a volume loss: {:x?}",
                self.reused_ids
            ));
        }
        if !self.replaced.is_empty() {
            v.push(format!(
                "pods {:?} kept their volume but are no longer the same member",
                self.replaced
            ));
        }
        if !self.recovered {
            v.push("not every pod came back as a ready voter after healing".into());
        }
        if let Some(k) = &self.kube {
            v.extend(k.violations());
        }
        let before_restore = self
            .disaster
            .as_ref()
            .and_then(|d| d.disaster.restores().then_some(d.cluster_before).flatten());
        for b in &self.backups {
            // Before a restore, the backups were of the cluster that was lost.
            let ours = b
                .cluster
                .is_some_and(|c| self.clusters.contains(&c) || Some(c) == before_restore);
            if b.exited_ok && !(b.verified && ours) {
                v.push(format!(
                    "a backup through pod {} exited 0 with a snapshot that is not a verified one of this cluster: {b:?}",
                    b.pod
                ));
            }
            if b.after_healing && !b.exited_ok {
                v.push(format!(
                    "the backup through pod {} after healing failed: {}",
                    b.pod, b.error
                ));
            }
        }
        if !self.backups.iter().any(|b| b.after_healing) {
            v.push("no backup was taken after healing".into());
        }
        for (o, name) in &self.deleted {
            v.push(format!(
                "pod {o}'s data directory was deleted, not set aside: sentinel {name} planted in its live data is nowhere on its volume"
            ));
        }
        for (o, what) in &self.wal_missing {
            v.push(format!("pod {o}'s data was deleted, not set aside: {what}"));
        }
        if let Some(d) = &self.disaster {
            v.extend(d.violations(&self.writes));
        }
        let u = self.unexplained();
        if u.length > UNEXPLAINED_BOUND {
            v.push(format!(
                "writes refused from {:?} to {:?} after the start, {:?} of it explained by no fault (each fault explains its duration and its cost after healing; at most {UNEXPLAINED_BOUND:?} unexplained; last error: {})",
                u.refusal.0, u.refusal.1, u.length, self.writes.last_error
            ));
        }
        v
    }

    /// The stretches the faults (and the disaster, and each stop of a rebuild) explain.
    pub fn explained(&self) -> Vec<(Duration, Duration)> {
        let mut w = explained(&self.played, self.slack);
        w.extend(self.disaster_window);
        if let Some((o, _)) = self.corrupted {
            let cost = Fault::CorruptValue(o).cost() + self.slack;
            w.extend(
                self.rebuild_stops
                    .iter()
                    .map(|t| (t.saturating_sub(EXIT_SEEN), *t + cost)),
            );
        }
        w
    }

    /// The longest part of a refusal of writes that no fault explains.
    pub fn unexplained(&self) -> Unexplained {
        let windows = self.explained();
        self.writes
            .refusals
            .iter()
            .map(|&(from, to)| Unexplained {
                length: uncovered(from, to, &windows),
                refusal: (from, to),
            })
            .max_by_key(|u| u.length)
            .unwrap_or_default()
    }

    /// One line of the results file: seed, faults, acknowledged, lost, longest refusal (ms),
    /// clusters seen, verdict.
    pub fn tsv_line(&self) -> String {
        let verdict = match self.violations().is_empty() {
            true => "ok",
            false => "FAILED",
        };
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            self.seed,
            self.faults,
            self.writes.acked,
            self.lost(),
            self.writes.max_gap.as_millis(),
            self.clusters.len(),
            verdict
        )
    }
}

/// The prefix of the sentinel files the runner plants in live data directories.
pub const SENTINEL_PREFIX: &str = "chaos-sentinel-";

/// Uniquely named files planted in every pod's live data (`member/`, which the agent renames
/// aside as a whole and etcd never reads: the agent's view of "has data" is the WAL), so
/// that a data directory deleted rather than set aside is seen.
#[derive(Debug, Default)]
pub struct Sentinels {
    seed: u64,
    /// Pod, name, and whether the schedule lost the pod's volume since it was planted.
    planted: Vec<(u32, String, bool)>,
}

impl Sentinels {
    /// None planted yet, for the schedule of `seed`.
    pub fn new(seed: u64) -> Sentinels {
        Sentinels {
            seed,
            planted: Vec::new(),
        }
    }

    /// Plants a sentinel in `volume/member` when that live data directory exists and holds
    /// none yet.
    pub fn plant(&mut self, o: u32, volume: &Path) {
        let member = volume.join("member");
        let Ok(entries) = std::fs::read_dir(&member) else {
            return;
        };
        let marked = entries
            .filter_map(std::result::Result::ok)
            .any(|e| e.file_name().to_string_lossy().starts_with(SENTINEL_PREFIX));
        if marked {
            return;
        }
        let name = format!("{SENTINEL_PREFIX}{}-{o}-{}", self.seed, self.planted.len());
        // No create_dir: when `member/` just went aside, nothing is planted.
        if std::fs::write(member.join(&name), b"planted by the chaos runner\n").is_ok() {
            self.planted.push((o, name, false));
        }
    }

    /// Pod `o`'s volume is lost on purpose: what it held is exempt.
    pub fn volume_lost(&mut self, o: u32) {
        for (p, _, lost) in &mut self.planted {
            if *p == o {
                *lost = true;
            }
        }
    }

    /// How many were planted.
    pub fn count(&self) -> usize {
        self.planted.len()
    }

    /// The sentinels of volumes never lost that are nowhere under their pod's volume.
    pub fn missing(&self, volume_of: impl Fn(u32) -> PathBuf) -> Vec<(u32, String)> {
        self.planted
            .iter()
            .filter(|(o, name, lost)| !lost && !holds(&volume_of(*o), name))
            .map(|(o, name, _)| (*o, name.clone()))
            .collect()
    }
}

/// Whether a file `name` is anywhere under `dir`.
fn holds(dir: &Path, name: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(std::result::Result::ok).any(|e| {
        e.file_name() == name || (e.file_type().is_ok_and(|t| t.is_dir()) && holds(&e.path(), name))
    })
}
