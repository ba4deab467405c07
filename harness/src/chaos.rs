//! Randomized fault schedules on a loopback set, and the checker of what they left.
//!
//! [`Schedule::generate`] lays overlapping faults on a timeline from a seed (the same seed,
//! the same schedule); [`run`] plays it against a running [`Set`] under a steady
//! [`Writer`], heals everything, and [`Outcome::violations`] says what went wrong: an
//! acknowledged write missing from a linearizable read through any member, more than one
//! cluster ID, a member ID reused after its volume was lost, a member whose volume was never
//! lost that is no longer the same member, a pod not back as a ready voter in time, data
//! deleted rather than set aside (a sentinel, or a WAL segment recorded before a fault:
//! [`crate::wal_kept`]), or writes refused for longer than each fault, with its cost after
//! healing, explains ([`Fault::cost`], [`Outcome::unexplained`]).

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::GetOptions;
use tokio::time::Instant;

use crate::disaster::{Disaster, DisasterSeen};
use crate::loopback::Set;
use crate::wal_kept::WalRecords;
use crate::writer::{Writer, WriterReport};

/// A deterministic pseudo-random sequence (SplitMix64): a schedule depends on its seed only.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The sequence of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A duration between `lo` and `hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }
}

/// One fault; each is healed after its event's `lasts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Every process of the pod SIGKILLed and its name withdrawn (the pod is gone); back on
    /// its volume when healed.
    KillPod(u32),
    /// Only the sidecar SIGKILLed; started again when healed.
    KillSidecar(u32),
    /// The pod's etcd (or init) SIGSTOPped: connections accepted, nothing answered; SIGCONT
    /// when healed.
    Pause(u32),
    /// The pod's DNS name withdrawn while it runs; published again when healed.
    WithdrawDns(u32),
    /// The pod gone and its volume lost; back with an empty volume when healed. At most one
    /// per schedule, and the runner applies it only once every pod is a voter serving
    /// linearizable reads (losing two copies before they re-replicate is real data loss).
    LoseVolume(u32),
    /// Every pod killed, then started again in this order when healed.
    RestartAll(Vec<u32>),
    /// The pod cut from the other pods (both directions) while clients still reach it;
    /// joined again when healed.
    Partition(u32),
    /// The pod's volume filled up: etcd's next write that needs space fails (ENOSPC);
    /// emptied of the filler when healed.
    FillDisk(u32),
    /// Not a fault: the one-shot `etcd-steward backup` run in the pod, into the set's
    /// `file://` store, while whatever else happens; it overlaps any fault.
    Backup(u32),
}

impl Fault {
    /// The pods whose etcd cannot serve while the fault lasts.
    pub fn pods_down(&self) -> Vec<u32> {
        match self {
            Fault::KillPod(o)
            | Fault::Pause(o)
            | Fault::LoseVolume(o)
            | Fault::Partition(o)
            | Fault::FillDisk(o) => vec![*o],
            Fault::RestartAll(order) => order.clone(),
            Fault::KillSidecar(_) | Fault::WithdrawDns(_) | Fault::Backup(_) => Vec::new(),
        }
    }

    /// The pod the fault is laid on; `None` for every pod.
    pub fn pod(&self) -> Option<u32> {
        match self {
            Fault::KillPod(o)
            | Fault::KillSidecar(o)
            | Fault::Pause(o)
            | Fault::WithdrawDns(o)
            | Fault::LoseVolume(o)
            | Fault::Partition(o)
            | Fault::FillDisk(o)
            | Fault::Backup(o) => Some(*o),
            Fault::RestartAll(_) => None,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillPod(o) => write!(f, "kill pod {o}"),
            Fault::KillSidecar(o) => write!(f, "kill pod {o}'s sidecar"),
            Fault::Pause(o) => write!(f, "pause pod {o}'s etcd"),
            Fault::WithdrawDns(o) => write!(f, "withdraw pod {o}'s DNS name"),
            Fault::LoseVolume(o) => write!(f, "lose pod {o}'s volume"),
            Fault::RestartAll(order) => write!(f, "restart every pod, in order {order:?}"),
            Fault::Partition(o) => write!(f, "cut pod {o} from its peers"),
            Fault::FillDisk(o) => write!(f, "fill pod {o}'s volume"),
            Fault::Backup(o) => write!(f, "back up through pod {o}"),
        }
    }
}

/// A fault at a time, healed after `lasts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Since the schedule started.
    pub at: Duration,
    /// How long until it is healed.
    pub lasts: Duration,
    /// What happens.
    pub fault: Fault,
}

/// A seeded timeline of overlapping faults on a set of `pods` pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The seed it came from.
    pub seed: u64,
    /// How many pods.
    pub pods: u32,
    /// The events, by time.
    pub events: Vec<Event>,
    /// The sidecars defragment their members whenever any space is free
    /// ([`DEFRAG_THRESHOLD`]; each at most once a minute, one member at a time, only while
    /// every member answers), so that defragmentations happen during the faults.
    pub defrag: bool,
    /// Generator 3: the disaster struck once every fault above is healed
    /// ([`Schedule::generate_disaster`]).
    pub disaster: Option<Disaster>,
}

/// `--defrag-threshold` of a schedule that defragments: any free space at all.
pub const DEFRAG_THRESHOLD: &str = "--defrag-threshold=1%,1B";

impl Schedule {
    /// `faults` faults over about `span`, from `seed`. Faults overlap; a pod carries at most
    /// one fault at a time, at most one volume is lost per schedule, and a restart of every
    /// pod overlaps nothing.
    pub fn generate(seed: u64, pods: u32, faults: usize, span: Duration) -> Schedule {
        let mut rng = Rng::new(seed);
        let mut events: Vec<Event> = Vec::new();
        let mut volume_lost = false;
        let span_ms = span.as_millis() as u64;
        let mut attempts = 0;
        while events.len() < faults && attempts < faults * 50 {
            attempts += 1;
            let at = rng.below(span_ms + 1);
            let o = rng.below(u64::from(pods)) as u32;
            let (fault, lasts) = match rng.below(16) {
                0..=2 => (Fault::KillPod(o), rng.millis(300, 4000)),
                3..=4 => (Fault::KillSidecar(o), rng.millis(200, 3000)),
                5..=6 => (Fault::Pause(o), rng.millis(300, 4000)),
                7..=8 => (Fault::WithdrawDns(o), rng.millis(300, 4000)),
                9..=10 if !volume_lost => (Fault::LoseVolume(o), rng.millis(300, 2000)),
                9..=10 => continue,
                12..=13 => (Fault::Partition(o), rng.millis(500, 5000)),
                14..=15 => (Fault::FillDisk(o), rng.millis(500, 4000)),
                _ => {
                    let mut order: Vec<u32> = (0..pods).collect();
                    for i in (1..order.len()).rev() {
                        let j = rng.below(i as u64 + 1) as usize;
                        order.swap(i, j);
                    }
                    (Fault::RestartAll(order), rng.millis(200, 2000))
                }
            };
            let end = at + lasts.as_millis() as u64;
            let clashes = events.iter().any(|e| {
                let (s, t) = (e.at.as_millis() as u64, (e.at + e.lasts).as_millis() as u64);
                let overlaps = at < t + 500 && s < end + 500;
                let shares = match (e.fault.pod(), fault.pod()) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                };
                overlaps && shares
            });
            if clashes {
                continue;
            }
            volume_lost |= matches!(fault, Fault::LoseVolume(_));
            events.push(Event {
                at: Duration::from_millis(at),
                lasts,
                fault,
            });
        }
        // Backups come from draws after the faults' (a schedule's faults do not depend on
        // them) and overlap anything.
        for _ in 0..rng.below(3) {
            let at = Duration::from_millis(rng.below(span_ms + 1));
            let o = rng.below(u64::from(pods)) as u32;
            events.push(Event {
                at,
                lasts: Duration::ZERO,
                fault: Fault::Backup(o),
            });
        }
        let defrag = rng.below(2) == 0;
        events.sort_by_key(|e| e.at);
        Schedule {
            seed,
            pods,
            events,
            defrag,
            disaster: None,
        }
    }

    /// Generator 3: the ordinary faults of [`Self::generate`], then one [`Disaster`] drawn
    /// from the seed (from a sequence of its own: the faults are generator 2's).
    pub fn generate_disaster(seed: u64, pods: u32, faults: usize, span: Duration) -> Schedule {
        let mut s = Schedule::generate(seed, pods, faults, span);
        let mut rng = Rng::new(seed ^ 0xD15A_57E2_0000_0003);
        s.disaster = Some(Disaster::draw(&mut rng, pods));
        s
    }

    /// Generator 4: generator 3 with a third disaster to draw, a backup key that opens no
    /// snapshot before the right one ([`Disaster::draw_with_keys`]).
    pub fn generate_disaster_with_keys(
        seed: u64,
        pods: u32,
        faults: usize,
        span: Duration,
    ) -> Schedule {
        let mut s = Schedule::generate(seed, pods, faults, span);
        let mut rng = Rng::new(seed ^ 0xD15A_57E2_0000_0004);
        s.disaster = Some(Disaster::draw_with_keys(&mut rng, pods));
        s
    }

    /// Whether a fault of the schedule fills a disk (the pods' volumes must then be
    /// size-limited: [`Set::limit_volumes`]).
    pub fn fills_disks(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e.fault, Fault::FillDisk(_)))
    }

    /// Whether a fault of the schedule partitions a pod ([`Set::enable_partitions`]).
    pub fn partitions(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e.fault, Fault::Partition(_)))
    }

    /// The longest stretch during which a majority of the pods could not serve: writes
    /// refused that long are the faults' doing.
    pub fn longest_quorum_loss(&self) -> Duration {
        self.longest_quorum_loss_where(Fault::pods_down)
    }

    /// As [`Self::longest_quorum_loss`], with `down` saying which pods a fault takes down
    /// (a runner where a fault cuts more than [`Fault::pods_down`] says).
    pub fn longest_quorum_loss_where(&self, down: impl Fn(&Fault) -> Vec<u32>) -> Duration {
        let majority = self.pods as usize / 2 + 1;
        let mut marks: Vec<Duration> = self
            .events
            .iter()
            .flat_map(|e| [e.at, e.at + e.lasts])
            .collect();
        marks.sort();
        marks.dedup();
        let mut longest = Duration::ZERO;
        let mut began: Option<Duration> = None;
        for w in marks.windows(2) {
            let mid = w[0] + (w[1] - w[0]) / 2;
            let down: BTreeSet<u32> = self
                .events
                .iter()
                .filter(|e| e.at <= mid && mid < e.at + e.lasts)
                .flat_map(|e| down(&e.fault))
                .collect();
            match (down.len() >= majority, began) {
                (true, None) => began = Some(w[0]),
                (false, Some(b)) => {
                    longest = longest.max(w[0] - b);
                    began = None;
                }
                _ => {}
            }
        }
        if let (Some(b), Some(last)) = (began, marks.last()) {
            longest = longest.max(*last - b);
        }
        longest
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "schedule of seed {}:", self.seed)?;
        if self.defrag {
            writeln!(f, "  sidecars with {DEFRAG_THRESHOLD} throughout")?;
        }
        for e in &self.events {
            writeln!(
                f,
                "  at {:>6} ms for {:>5} ms: {}",
                e.at.as_millis(),
                e.lasts.as_millis(),
                e.fault
            )?;
        }
        if let Some(d) = &self.disaster {
            writeln!(f, "  then, every fault healed: {d}")?;
        }
        Ok(())
    }
}

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
    /// Pods whose volume was never lost but whose member ID changed.
    pub replaced: Vec<u32>,
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
}

/// What one run of `etcd-steward backup` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupTaken {
    /// Through which pod.
    pub pod: u32,
    /// Taken after everything was healed (it must succeed), not during the faults.
    pub after_healing: bool,
    /// It exited 0.
    pub exited_ok: bool,
    /// The manifest it printed says the snapshot verified (etcd's SHA-256 trailer matched).
    pub verified: bool,
    /// The cluster ID of the manifest.
    pub cluster: Option<u64>,
    /// Its error output (last line), when it failed.
    pub error: String,
}

impl BackupTaken {
    /// From what `etcd-steward backup` printed: whether it exited 0, its standard output
    /// (the manifest, a JSON line) and error output.
    pub fn from_parts(
        pod: u32,
        after_healing: bool,
        exited_ok: bool,
        stdout: &str,
        stderr: &str,
    ) -> Self {
        let manifest: Option<serde_json::Value> = stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok());
        BackupTaken {
            pod,
            after_healing,
            exited_ok,
            verified: manifest
                .as_ref()
                .and_then(|m| m["verified"].as_bool())
                .unwrap_or(false),
            cluster: manifest
                .as_ref()
                .and_then(|m| m["cluster_id"].as_str())
                .and_then(|c| u64::from_str_radix(c, 16).ok()),
            error: stderr.lines().last().unwrap_or_default().to_string(),
        }
    }

    /// From the process's output, `None` when it did not end within its time-out.
    pub(crate) fn from_output(
        pod: u32,
        after_healing: bool,
        out: Option<std::process::Output>,
    ) -> Self {
        match out {
            Some(out) => BackupTaken::from_parts(
                pod,
                after_healing,
                out.status.success(),
                &String::from_utf8_lossy(&out.stdout),
                &String::from_utf8_lossy(&out.stderr),
            ),
            None => BackupTaken {
                pod,
                after_healing,
                exited_ok: false,
                verified: false,
                cluster: None,
                error: "did not end within its time-out".into(),
            },
        }
    }
}

/// etcd's election: its election timeout (1 s by default) randomized up to twice that, so
/// a fault that takes the leader down refuses writes this long before a new one leads.
pub const ELECTION: Duration = Duration::from_secs(2);

/// A write in flight to a member that accepts and never answers (paused, cut off, without a
/// leader) is given up by the writer after 2.5 s; it then turns to the next pod.
pub const HUNG_WRITE: Duration = Duration::from_millis(2500);

/// A killed pod back on its volume: `init`'s rounds (its own DNS name, its sidecar's report,
/// 30 ms for a cluster that vouched for the volume), one back-off step of a round that waited,
/// and etcd replaying its WAL before it serves.
pub const RESTART: Duration = Duration::from_millis(2500);

/// Writes refused that no fault explains (beyond every fault's cost: [`Fault::cost`]) are a
/// violation past this: the writer's own rhythm and a defragmentation or a snapshot on a
/// busy machine.
pub const UNEXPLAINED_BOUND: Duration = Duration::from_millis(1500);

impl Fault {
    /// How long after it is healed the fault still explains writes refused: an election
    /// when it can take the leader down, a write hung on it, and a restart when its pods
    /// start again. While it lasts, every fault that takes a pod down explains refusals (a
    /// write may hang on that pod, the pod may have led).
    pub fn cost(&self) -> Duration {
        match self {
            Fault::KillSidecar(_) | Fault::Backup(_) => Duration::ZERO,
            // The pod keeps running; a peer dialing its name again fails: it may lose the
            // leadership.
            Fault::WithdrawDns(_) => ELECTION,
            Fault::Pause(_) | Fault::Partition(_) | Fault::FillDisk(_) => ELECTION + HUNG_WRITE,
            Fault::KillPod(_) | Fault::LoseVolume(_) | Fault::RestartAll(_) => {
                RESTART + ELECTION + HUNG_WRITE
            }
        }
    }
}

/// The stretches of time (since the run started) during which the faults as played (`at`
/// when applied, `lasts` until healed) explain writes refused: each fault from when it was
/// applied until its [`Fault::cost`] after it was healed, plus `slack`.
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

    /// The stretches the faults (and the disaster) explain.
    pub fn explained(&self) -> Vec<(Duration, Duration)> {
        let mut w = explained(&self.played, self.slack);
        w.extend(self.disaster_window);
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

/// `etcd_steward_defrag_total` of every sidecar, summed over restarts (a restarted
/// sidecar counts from zero again).
struct DefragCount {
    before_restarts: Vec<u64>,
    last: Vec<u64>,
}

impl DefragCount {
    fn new(pods: usize) -> DefragCount {
        DefragCount {
            before_restarts: vec![0; pods],
            last: vec![0; pods],
        }
    }

    async fn sample(&mut self, set: &Set) {
        for o in 0..self.last.len() {
            // Briefly: the runner's timeline must not wait on a sidecar.
            let answer =
                tokio::time::timeout(Duration::from_millis(300), set.http(o as u32, "/metrics"));
            let Ok(Some((200, text))) = answer.await else {
                continue;
            };
            let Some(now) = crate::client::sample(&text, "etcd_steward_defrag_total") else {
                continue;
            };
            let now = now as u64;
            if now < self.last[o] {
                self.before_restarts[o] += self.last[o];
            }
            self.last[o] = now;
        }
    }

    fn total(&self) -> u64 {
        self.before_restarts.iter().sum::<u64>() + self.last.iter().sum::<u64>()
    }
}

/// How long a backup may take before it counts as failed.
pub const BACKUP_TIME_OUT: Duration = Duration::from_secs(60);

/// How long every pod may take to be a ready voter again once everything is healed.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(90);

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

/// Readies `set` (built, not started) for `schedule`: size-limited volumes when it fills a
/// disk, partitions when it cuts a pod off.
pub fn prepare(set: &mut Set, schedule: &Schedule) -> crate::Result<()> {
    if schedule.fills_disks() {
        set.limit_volumes(VOLUME_MIB)?;
    }
    if schedule.partitions() {
        set.enable_partitions()?;
    }
    if schedule.defrag {
        set.extra_args.push(DEFRAG_THRESHOLD.into());
    }
    if let Some(d) = &schedule.disaster {
        let options = crate::disaster::options(set, d);
        set.extra_args.extend(options);
    }
    Ok(())
}

/// The size of a volume that can be filled: room for etcd's preallocated 64 MiB WAL
/// segment, a second one and the database.
pub const VOLUME_MIB: u32 = 256;

enum Heal {
    /// A backup (the runner starts it itself): nothing to heal.
    Nothing,
    Partition(u32),
    Free(u32),
    Start(u32),
    StartSidecar(u32),
    Resume(u32),
    Publish(u32),
    StartAll(Vec<u32>),
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

/// Plays `schedule` on `set` (formed, every pod a ready voter) under a writer through every
/// pod, heals, waits for recovery and checks.
pub async fn run(set: &mut Set, schedule: &Schedule) -> Outcome {
    let pods: Vec<u32> = (0..schedule.pods).collect();
    let cluster_before = set.cluster_id(0).await.ok();
    let mut ids_before = Vec::new();
    for o in &pods {
        ids_before.push(set.member_id(*o).await.ok());
    }
    // The writer's times and the faults' count from the same start.
    let started = Instant::now();
    let writer = Writer::start(pods.iter().map(|o| set.client_url(*o)).collect());
    let mut pending: Vec<(Duration, Heal, usize)> = Vec::new();
    let mut played: Vec<Event> = Vec::new();
    let mut paused: Vec<(u32, u32)> = Vec::new();
    let mut lost_ids: Vec<u64> = Vec::new();
    let mut wiped: BTreeSet<u32> = BTreeSet::new();
    let mut applied = 0;
    let mut sentinels = Sentinels::new(schedule.seed);
    let mut wals = WalRecords::default();
    let store = crate::disaster::store_url(set);
    // A disaster schedule's pods carry the store in their options already.
    let backup_args: Vec<&str> = match schedule.disaster {
        Some(_) => vec!["backup"],
        None => vec!["backup", "--backup-url", &store],
    };
    let mut backups_running = Vec::new();
    let mut defrags = DefragCount::new(pods.len());
    let mut next_sample = Duration::ZERO;
    let mut events = schedule.events.iter().peekable();
    loop {
        for o in &pods {
            sentinels.plant(*o, set.data_dir(*o));
        }
        let now = started.elapsed();
        if schedule.defrag && now >= next_sample {
            defrags.sample(set).await;
            next_sample = now + Duration::from_secs(1);
        }
        // Heal what is due, then apply what is due; restart exited containers (kubelet).
        pending.sort_by_key(|(t, _, _)| *t);
        while pending.first().is_some_and(|(t, _, _)| *t <= now) {
            let (_, heal, i) = pending.remove(0);
            apply_heal(set, heal, &mut paused);
            played[i].lasts = started.elapsed().saturating_sub(played[i].at);
        }
        if let Some(e) = events.peek() {
            if e.at <= now {
                // A volume is lost only once every copy is back: every pod a ready voter
                // (losing two copies before they re-replicate is real data loss). Until
                // then the timeline waits, healing what falls due.
                let loss = matches!(e.fault, Fault::LoseVolume(_));
                if loss
                    && now < e.at + RECOVERY_BOUND
                    && !set.all_linearizable(&pods, pods.len()).await
                {
                    let _ = set.restart_exited();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let e = events.next().cloned().unwrap_or_else(|| unreachable!());
                if let Fault::Backup(o) = e.fault {
                    eprintln!("chaos: {}", e.fault);
                    let mut cmd = set.steward_in(o, &backup_args);
                    match cmd.kill_on_drop(true).spawn() {
                        Ok(child) => backups_running.push((o, child)),
                        Err(err) => eprintln!("chaos: starting a backup failed: {err}"),
                    }
                    continue;
                }
                for o in &pods {
                    wals.record(*o, set.data_dir(*o));
                }
                let o = e.fault.pod();
                if let Some(o) = o {
                    if matches!(e.fault, Fault::LoseVolume(_)) {
                        // Its member may not answer just now (its etcd paused a moment
                        // ago, no leader): the ID seen before the fault is the one lost.
                        let id = set.member_id(o).await.ok().or(ids_before[o as usize]);
                        lost_ids.extend(id);
                        wals.volume_lost(o);
                        // Lost whether or not its member answered just now.
                        wiped.insert(o);
                        sentinels.volume_lost(o);
                    }
                }
                let at = started.elapsed();
                let heal = apply_fault(set, &e.fault, &mut paused).await;
                pending.push((started.elapsed() + e.lasts, heal, played.len()));
                played.push(Event { at, ..e });
                applied += 1;
                continue;
            }
        }
        if events.peek().is_none() && pending.is_empty() {
            break;
        }
        let _ = set.restart_exited();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Generator 3: the disaster, once every fault is healed.
    let struck_at = started.elapsed();
    let struck = match &schedule.disaster {
        Some(d) => {
            // The members the disaster loses, as they are before it (a pod whose volume a
            // fault lost is another member by now), for when they do not answer then.
            let mut ids = ids_before.clone();
            for o in &pods {
                wals.record(*o, set.data_dir(*o));
                if let Ok(id) = set.member_id(*o).await {
                    ids[*o as usize] = Some(id);
                }
            }
            let struck = crate::disaster::strike(set, d, &writer).await;
            for o in d.wiped(schedule.pods) {
                wiped.insert(o);
                sentinels.volume_lost(o);
                wals.volume_lost(o);
                lost_ids.extend(ids[o as usize]);
            }
            lost_ids.extend(&struck.lost_ids);
            applied += 1;
            Some(struck)
        }
        None => None,
    };
    // Healed: every pod back as a ready voter within the bound (restarting what exits).
    let deadline = Instant::now() + RECOVERY_BOUND;
    let mut recovered = false;
    while Instant::now() < deadline {
        let _ = set.restart_exited();
        for o in &pods {
            sentinels.plant(*o, set.data_dir(*o));
        }
        if set.all_linearizable(&pods, pods.len()).await && set.all_ready(&pods).await {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if recovered {
        writer
            .wait_progress(10, RECOVERY_BOUND, "after healing")
            .await;
    }
    let writes = writer.stop().await;
    if schedule.defrag {
        defrags.sample(set).await;
    }
    let mut backups = Vec::new();
    for (o, child) in backups_running {
        let out = tokio::time::timeout(BACKUP_TIME_OUT, child.wait_with_output()).await;
        backups.push(BackupTaken::from_output(
            o,
            false,
            out.ok().and_then(std::result::Result::ok),
        ));
    }
    let last = set.steward_in(0, &backup_args).kill_on_drop(true).output();
    let out = tokio::time::timeout(BACKUP_TIME_OUT, last).await;
    backups.push(BackupTaken::from_output(
        0,
        true,
        out.ok().and_then(std::result::Result::ok),
    ));
    let mut missing = Vec::new();
    let mut clusters = BTreeSet::new();
    // A restore gives the cluster a new identity: one cluster ID afterwards.
    if !schedule.disaster.as_ref().is_some_and(Disaster::restores) {
        clusters.extend(cluster_before);
    }
    let mut reused_ids = Vec::new();
    let mut replaced = Vec::new();
    for o in &pods {
        missing.push(missing_writes(set, *o, writes.acked).await);
        if let Ok(c) = set.cluster_id(*o).await {
            clusters.insert(c);
        }
        match set.member_id(*o).await {
            Ok(id) if lost_ids.contains(&id) => reused_ids.push(id),
            Ok(id) if !wiped.contains(o) && ids_before[*o as usize].is_some_and(|b| b != id) => {
                replaced.push(*o)
            }
            _ => {}
        }
    }
    let mut disaster_window = None;
    let disaster = match struck {
        Some(mut struck) => {
            backups.extend(struck.backup.take());
            let held = struck.held;
            let seen = crate::disaster::observe(set, struck, &writes).await;
            // Writes lost with the volumes, or never lost, said per pod.
            missing = seen.missing(&writes);
            // From the kill until every pod is back, writes are refused: the recovery
            // bound is what the disaster explains, and the time the pods had the wrong
            // key on purpose.
            disaster_window = Some((struck_at, struck_at + RECOVERY_BOUND + held));
            Some(seen)
        }
        None => None,
    };
    let deleted = sentinels.missing(|o| set.data_dir(o).to_path_buf());
    let wal_missing = wals.missing(|o| set.data_dir(o).to_path_buf());
    let mut enospc_lines = 0;
    for o in &pods {
        let logs = set.logs(*o);
        let full: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("no space left on device"))
            .collect();
        if let Some(first) = full.first() {
            eprintln!("chaos: pod {o} felt a full disk: {first}");
        }
        enospc_lines += full.len();
    }
    Outcome {
        seed: schedule.seed,
        faults: applied,
        writes,
        missing,
        clusters,
        reused_ids,
        replaced,
        recovered,
        sentinels: sentinels.count(),
        deleted,
        wal_records: wals.count(),
        wal_missing,
        enospc_lines,
        backups,
        defrags: defrags.total(),
        played,
        slack: Duration::ZERO,
        disaster_window,
        disaster,
    }
}

/// A fault or heal the schedule lays must be made: one that cannot be (no iptables, no
/// tmpfs, a volume that cannot be emptied) stops the run rather than count as survived.
fn made<T>(r: crate::Result<T>, what: impl fmt::Display) -> T {
    r.unwrap_or_else(|e| panic!("chaos: {what}: could not be made: {e}"))
}

async fn apply_fault(set: &mut Set, fault: &Fault, paused: &mut Vec<(u32, u32)>) -> Heal {
    eprintln!("chaos: {fault}");
    match fault {
        Fault::KillPod(o) => {
            let _ = set.kill(*o).await;
            Heal::Start(*o)
        }
        Fault::KillSidecar(o) => {
            set.kill_sidecar(*o).await;
            Heal::StartSidecar(*o)
        }
        Fault::Pause(o) => {
            if let Some(pid) = set.etcd_pid(*o) {
                signal(pid, "-STOP");
                paused.push((*o, pid));
            }
            Heal::Resume(*o)
        }
        Fault::WithdrawDns(o) => {
            let _ = set.set_dns(*o, false);
            Heal::Publish(*o)
        }
        Fault::LoseVolume(o) => {
            let _ = set.kill(*o).await;
            made(set.wipe(*o), fault);
            Heal::Start(*o)
        }
        Fault::Backup(_) => Heal::Nothing,
        Fault::Partition(o) => {
            made(set.partition(*o, true), fault);
            Heal::Partition(*o)
        }
        Fault::FillDisk(o) => {
            let n = made(set.fill_volume(*o), fault);
            eprintln!("chaos: pod {o}'s volume full ({} MiB of filler)", n >> 20);
            Heal::Free(*o)
        }
        Fault::RestartAll(order) => {
            for o in order {
                let _ = set.kill(*o).await;
            }
            Heal::StartAll(order.clone())
        }
    }
}

fn apply_heal(set: &mut Set, heal: Heal, paused: &mut Vec<(u32, u32)>) {
    match heal {
        Heal::Nothing => {}
        Heal::Partition(o) => {
            made(set.partition(o, false), format!("healing pod {o}'s cut"));
        }
        Heal::Free(o) => {
            made(set.free_volume(o), format!("freeing pod {o}'s volume"));
        }
        Heal::Start(o) => {
            let _ = set.start(o);
        }
        Heal::StartSidecar(o) => {
            if set.sidecar_pid(o).is_none() {
                let _ = set.start_sidecar(o);
            }
        }
        Heal::Resume(o) => {
            for (_, pid) in paused.iter().filter(|(p, _)| *p == o) {
                signal(*pid, "-CONT");
            }
            paused.retain(|(p, _)| *p != o);
        }
        Heal::Publish(o) => {
            let _ = set.set_dns(o, true);
        }
        Heal::StartAll(order) => {
            for o in order {
                let _ = set.start(o);
            }
        }
    }
}

/// Acknowledged writes `0..acked` missing from a linearizable read through pod `o`.
async fn missing_writes(set: &Set, o: u32, acked: u64) -> Option<u64> {
    let mut c = set.client(o).await.ok()?;
    let opts = GetOptions::new()
        .with_range(crate::writer::write_key(acked))
        .with_count_only();
    let r = c.get(crate::writer::write_key(0), Some(opts)).await.ok()?;
    Some(acked.saturating_sub(r.count().max(0) as u64))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let a = Schedule::generate(7, 3, 8, Duration::from_secs(20));
        let b = Schedule::generate(7, 3, 8, Duration::from_secs(20));
        let c = Schedule::generate(8, 3, 8, Duration::from_secs(20));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let faults = a
            .events
            .iter()
            .filter(|e| !matches!(e.fault, Fault::Backup(_)))
            .count();
        assert_eq!(faults, 8);
    }

    #[test]
    fn a_schedule_loses_at_most_one_volume_and_never_faults_a_pod_twice_at_once() {
        for seed in 0..200 {
            let s = Schedule::generate(seed, 3, 10, Duration::from_secs(20));
            let losses = s
                .events
                .iter()
                .filter(|e| matches!(e.fault, Fault::LoseVolume(_)))
                .count();
            assert!(losses <= 1, "{s}");
            let faults: Vec<&Event> = s
                .events
                .iter()
                .filter(|e| !matches!(e.fault, Fault::Backup(_)))
                .collect();
            for (i, a) in faults.iter().enumerate() {
                for b in &faults[i + 1..] {
                    let overlap = b.at < a.at + a.lasts && a.at < b.at + b.lasts;
                    let shared = match (a.fault.pod(), b.fault.pod()) {
                        (Some(x), Some(y)) => x == y,
                        _ => true,
                    };
                    assert!(!(overlap && shared), "{s}");
                }
            }
        }
    }

    #[test]
    fn quorum_loss_counts_only_while_a_majority_is_down() {
        let ev = |at: u64, lasts: u64, fault| Event {
            at: Duration::from_millis(at),
            lasts: Duration::from_millis(lasts),
            fault,
        };
        let s = Schedule {
            seed: 0,
            pods: 3,
            defrag: false,
            disaster: None,
            events: vec![
                ev(0, 1000, Fault::KillPod(0)),
                ev(600, 1000, Fault::Pause(1)),
                ev(2000, 500, Fault::WithdrawDns(2)),
                ev(3000, 700, Fault::RestartAll(vec![2, 0, 1])),
            ],
        };
        assert_eq!(s.longest_quorum_loss(), Duration::from_millis(700));
        let none = Schedule {
            seed: 0,
            pods: 3,
            defrag: false,
            disaster: None,
            events: vec![
                ev(0, 1000, Fault::KillSidecar(0)),
                ev(0, 1000, Fault::Pause(1)),
            ],
        };
        assert_eq!(none.longest_quorum_loss(), Duration::ZERO);
        // Where a withdrawn name cuts the pod off (Docker), it counts as down.
        let dns = Schedule {
            events: vec![
                ev(0, 1000, Fault::WithdrawDns(0)),
                ev(400, 1000, Fault::Pause(1)),
            ],
            ..none.clone()
        };
        assert_eq!(dns.longest_quorum_loss(), Duration::ZERO);
        let cut = dns.longest_quorum_loss_where(|f| match f {
            Fault::WithdrawDns(o) => vec![*o],
            f => f.pods_down(),
        });
        assert_eq!(cut, Duration::from_millis(600));
    }

    #[test]
    fn a_sentinel_set_aside_is_found_a_deleted_one_is_missing_and_a_lost_volume_is_exempt() {
        let root = tempfile::tempdir().unwrap();
        let volume = |o: u32| root.path().join(format!("pod-{o}"));
        let mut s = Sentinels::new(7);
        for o in 0..3 {
            // No live data yet: nothing planted.
            s.plant(o, &volume(o));
            std::fs::create_dir_all(volume(o).join("member/wal")).unwrap();
            s.plant(o, &volume(o));
            s.plant(o, &volume(o)); // one per live directory
        }
        assert_eq!(s.count(), 3);
        assert!(s.missing(volume).is_empty());
        // Pod 0's data renamed aside (what the agent does), pod 1's deleted, pod 2's volume
        // lost on purpose.
        let aside = volume(0).join("set-aside/2026-11-24T00:00:00Z");
        std::fs::create_dir_all(&aside).unwrap();
        std::fs::rename(volume(0).join("member"), aside.join("member")).unwrap();
        std::fs::remove_dir_all(volume(1).join("member")).unwrap();
        std::fs::remove_dir_all(volume(2)).unwrap();
        s.volume_lost(2);
        let missing = s.missing(volume);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert_eq!(missing[0].0, 1);
        assert!(missing[0].1.starts_with(SENTINEL_PREFIX), "{missing:?}");
        // The new live data of a set-aside volume gets a sentinel of its own.
        std::fs::create_dir_all(volume(0).join("member")).unwrap();
        s.plant(0, &volume(0));
        assert_eq!(s.count(), 4);
    }

    #[test]
    fn a_backups_manifest_line_is_read_for_verification_and_cluster() {
        let ok = BackupTaken::from_parts(
            1,
            false,
            true,
            "{\"key\":\"x\",\"cluster_id\":\"2a\",\"verified\":true}\n",
            "",
        );
        assert!(ok.exited_ok && ok.verified, "{ok:?}");
        assert_eq!(ok.cluster, Some(0x2a));
        let unverified = BackupTaken::from_parts(
            1,
            false,
            true,
            "{\"cluster_id\":\"2a\",\"verified\":false}",
            "",
        );
        assert!(!unverified.verified);
        let failed =
            BackupTaken::from_parts(2, true, false, "", "starting\nno leader: etcd-1 paused\n");
        assert!(!failed.exited_ok && !failed.verified && failed.cluster.is_none());
        assert_eq!(failed.error, "no leader: etcd-1 paused");
    }

    /// An outcome the checker finds nothing wrong with: one refusal of writes, explained by
    /// nothing but short enough.
    fn clean() -> Outcome {
        Outcome {
            seed: 1,
            faults: 3,
            writes: WriterReport {
                acked: 100,
                failures: 2,
                max_gap: Duration::from_secs(1),
                max_gap_at: Duration::from_secs(3),
                refusals: vec![(Duration::from_secs(2), Duration::from_secs(3))],
                last_error: String::new(),
                revisions: vec![],
            },
            missing: vec![Some(0), Some(0), Some(0)],
            clusters: [9].into_iter().collect(),
            reused_ids: vec![],
            replaced: vec![],
            recovered: true,
            sentinels: 3,
            deleted: vec![],
            enospc_lines: 0,
            defrags: 0,
            backups: vec![BackupTaken {
                pod: 0,
                after_healing: true,
                exited_ok: true,
                verified: true,
                cluster: Some(9),
                error: String::new(),
            }],
            played: vec![],
            slack: Duration::ZERO,
            disaster_window: None,
            wal_records: 3,
            wal_missing: vec![],
            disaster: None,
        }
    }

    #[test]
    fn the_checker_flags_a_lost_write_a_second_cluster_and_a_reused_id() {
        let clean = clean();
        assert!(clean.violations().is_empty());
        assert!(clean.tsv_line().ends_with("\tok"));
        let mut bad = clean.clone();
        bad.missing[1] = Some(4);
        bad.clusters.insert(10);
        bad.reused_ids.push(0xabc);
        bad.writes.max_gap = Duration::from_secs(30);
        bad.writes
            .refusals
            .push((Duration::from_secs(5), Duration::from_secs(35)));
        let v = bad.violations();
        assert_eq!(v.len(), 4, "{v:?}");
        assert_eq!(bad.lost(), 4);
        assert!(bad.tsv_line().ends_with("\tFAILED"));
        let mut deleted = clean.clone();
        deleted.deleted.push((2, "chaos-sentinel-1-2-0".into()));
        let v = deleted.violations();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("pod 2") && v[0].contains("chaos-sentinel-1-2-0"),
            "{v:?}"
        );
        // A backup during the faults may fail (said so); one that exits 0 must be a
        // verified snapshot of this cluster, and the one after healing must succeed.
        let mut backups = clean.clone();
        backups.backups.push(BackupTaken {
            pod: 1,
            after_healing: false,
            exited_ok: false,
            verified: false,
            cluster: None,
            error: "no quorum".into(),
        });
        assert!(
            backups.violations().is_empty(),
            "{:?}",
            backups.violations()
        );
        backups.backups[1].exited_ok = true;
        backups.backups[0].exited_ok = false;
        assert_eq!(backups.violations().len(), 2, "{:?}", backups.violations());
        backups.backups.clear();
        assert_eq!(backups.violations().len(), 1, "{:?}", backups.violations());
    }

    #[test]
    fn a_sentinel_travels_with_data_set_aside_and_is_missed_when_data_is_deleted() {
        let root = tempfile::tempdir().unwrap();
        let vol = |o: u32| root.path().join(format!("pod-{o}"));
        for o in 0..3 {
            std::fs::create_dir_all(vol(o).join("member/wal")).unwrap();
        }
        let mut s = Sentinels::new(5);
        for o in 0..3 {
            s.plant(o, &vol(o));
            s.plant(o, &vol(o));
        }
        assert_eq!(s.count(), 3, "one sentinel per live data directory");
        // Pod 0's data set aside the way the agent does it (member/ renamed).
        std::fs::create_dir_all(vol(0).join("set-aside/7-removed-member")).unwrap();
        std::fs::rename(
            vol(0).join("member"),
            vol(0).join("set-aside/7-removed-member/member"),
        )
        .unwrap();
        // Pod 1's data deleted; pod 2's volume lost on purpose.
        std::fs::remove_dir_all(vol(1).join("member")).unwrap();
        std::fs::remove_dir_all(vol(2).join("member")).unwrap();
        s.volume_lost(2);
        assert_eq!(
            s.missing(vol),
            vec![(1, "chaos-sentinel-5-1-1".to_string())]
        );
        // A fresh member/ on pod 0 gets a sentinel of its own.
        std::fs::create_dir_all(vol(0).join("member")).unwrap();
        s.plant(0, &vol(0));
        assert_eq!(s.count(), 4);
    }

    #[test]
    fn a_refusal_is_explained_only_by_the_faults_it_overlaps_and_their_cost_after_healing() {
        let secs = |s: f64| Duration::from_secs_f64(s);
        let ev = |at: f64, lasts: f64, fault| Event {
            at: secs(at),
            lasts: secs(lasts),
            fault,
        };
        let played = vec![
            ev(5.0, 1.0, Fault::RestartAll(vec![0, 1, 2])),
            ev(20.0, 3.0, Fault::KillSidecar(1)),
            ev(30.0, 2.0, Fault::Pause(2)),
        ];
        let restart_ends = 6.0 + Fault::RestartAll(vec![]).cost().as_secs_f64();
        let windows = explained(&played, Duration::ZERO);
        // A killed sidecar refuses no write: it explains nothing.
        assert_eq!(windows.len(), 2, "{windows:?}");
        assert_eq!(windows[0], (secs(5.0), secs(restart_ends)));
        // Within the restart's window, nothing is unexplained; ten seconds past it, ten.
        assert_eq!(
            uncovered(secs(5.1), secs(restart_ends), &windows),
            Duration::ZERO
        );
        let late = uncovered(secs(5.1), secs(restart_ends + 10.0), &windows);
        assert_eq!(late, secs(10.0));
        // Overlapping windows count once; a gap between them is unexplained.
        let both = [
            (secs(0.0), secs(4.0)),
            (secs(2.0), secs(6.0)),
            (secs(8.0), secs(9.0)),
        ];
        assert_eq!(uncovered(secs(1.0), secs(10.0), &both), secs(3.0));
        // During the sidecar's kill, writes refused are unexplained.
        assert_eq!(uncovered(secs(20.0), secs(23.0), &windows), secs(3.0));

        let mut o = Outcome { played, ..clean() };
        o.writes.refusals = vec![(secs(5.0), secs(restart_ends)), (secs(30.5), secs(33.0))];
        assert!(o.violations().is_empty(), "{:?}", o.violations());
        assert_eq!(o.unexplained().length, Duration::ZERO);
        // The restart of every pod stalls writes ten seconds longer (a restart path that
        // waits on its silent peers): flagged, and published.
        o.writes.refusals[0].1 += secs(10.0);
        let u = o.unexplained();
        assert_eq!(u.length, secs(10.0));
        assert_eq!(u.refusal.0, secs(5.0));
        let v = o.violations();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("explained by no fault"), "{v:?}");
        // A disaster's window (the recovery bound and the time held) explains it.
        o.disaster_window = Some((secs(10.0), secs(200.0)));
        assert!(o.violations().is_empty(), "{:?}", o.violations());
        // Up to the bound, unexplained refusal is tolerated.
        o.disaster_window = None;
        o.writes.refusals[0].1 = secs(restart_ends) + UNEXPLAINED_BOUND;
        assert!(o.violations().is_empty(), "{:?}", o.violations());
        o.writes.refusals[0].1 += Duration::from_millis(1);
        assert_eq!(o.violations().len(), 1);
    }

    #[test]
    fn a_wal_deleted_beside_a_kept_folder_is_a_violation() {
        let mut o = clean();
        assert!(o.violations().is_empty(), "{:?}", o.violations());
        o.wal_missing.push((
            1,
            "WAL [\"0000000000000000-0000000000000000.wal\"] ... is gone".into(),
        ));
        let v = o.violations();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("pod 1") && v[0].contains("deleted, not set aside"),
            "{v:?}"
        );
    }

    #[test]
    fn the_new_faults_appear_and_count_as_down() {
        let all: Vec<Fault> = (0..50)
            .flat_map(|seed| Schedule::generate(seed, 3, 8, Duration::from_secs(20)).events)
            .map(|e| e.fault)
            .collect();
        assert!(all.iter().any(|f| matches!(f, Fault::Partition(_))));
        assert!(all.iter().any(|f| matches!(f, Fault::FillDisk(_))));
        assert_eq!(Fault::Partition(1).pods_down(), vec![1]);
        assert_eq!(Fault::FillDisk(2).pods_down(), vec![2]);
    }
}
