//! Generating schedules: faults laid on a timeline from a seed, and what each costs.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::bounds::{ELECTION, HUNG_WRITE, RESTART};
use crate::disaster::Disaster;
use crate::rng::Rng;

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
    /// The pod killed, the bytes of one acknowledged write's value in its database file
    /// replaced by as many others (bbolt has no page checksums: etcd serves them), the pod
    /// started again when healed. The runner never mends the data: the agent must find the
    /// member diverged and rebuild it from its peers. At most one per schedule (generator
    /// 5: [`Schedule::generate_corrupt`]).
    CorruptValue(u32),
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
            | Fault::FillDisk(o)
            | Fault::CorruptValue(o) => vec![*o],
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
            | Fault::CorruptValue(o)
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
            Fault::CorruptValue(o) => write!(f, "corrupt a value on pod {o}'s disk"),
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

/// `--corruption-check-interval` of a schedule that corrupts a value: the leader's sidecar
/// compares the members' hashes every second.
pub const CORRUPTION_CHECK: &str = "--corruption-check-interval=1s";

/// Whether a `fault` at `at` (ms) lasting `lasts` comes within 500 ms of an event of
/// `events` on the same pod (any pod, for a fault on every pod).
fn clashes(events: &[Event], at: u64, lasts: Duration, fault: &Fault) -> bool {
    let end = at + lasts.as_millis() as u64;
    events.iter().any(|e| {
        let (s, t) = (e.at.as_millis() as u64, (e.at + e.lasts).as_millis() as u64);
        let overlaps = at < t + 500 && s < end + 500;
        let shares = match (e.fault.pod(), fault.pod()) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        overlaps && shares
    })
}

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
            if clashes(&events, at, lasts, &fault) {
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

    /// Generator 5: the ordinary faults of [`Self::generate`], and one
    /// [`Fault::CorruptValue`] drawn from the seed (from a sequence of its own: the faults
    /// are generator 2's), on a pod that carries no other fault meanwhile, overlapping no
    /// lost volume (a copy lost while another is corrupt could be rebuilt from the corrupt
    /// one); after every fault when no other time fits.
    pub fn generate_corrupt(seed: u64, pods: u32, faults: usize, span: Duration) -> Schedule {
        let mut s = Schedule::generate(seed, pods, faults, span);
        let mut rng = Rng::new(seed ^ 0xC022_0971_0000_0005);
        let span_ms = span.as_millis() as u64;
        let lasts = rng.millis(300, 2000);
        let o = rng.below(u64::from(pods)) as u32;
        let fault = Fault::CorruptValue(o);
        // Backups overlap anything; a lost volume overlaps no corruption on any pod.
        let faults: Vec<Event> = s
            .events
            .iter()
            .filter(|e| !matches!(e.fault, Fault::Backup(_)))
            .cloned()
            .collect();
        let losses: Vec<Event> = faults
            .iter()
            .filter(|e| matches!(e.fault, Fault::LoseVolume(_)))
            .cloned()
            .collect();
        let every_pod = Fault::RestartAll(Vec::new());
        let fits = (0..50).map(|_| rng.below(span_ms + 1)).find(|at| {
            !clashes(&faults, *at, lasts, &fault) && !clashes(&losses, *at, lasts, &every_pod)
        });
        let at = fits.unwrap_or_else(|| {
            let end = faults.iter().map(|e| e.at + e.lasts).max();
            end.unwrap_or_default().as_millis() as u64 + 1000
        });
        s.events.push(Event {
            at: Duration::from_millis(at),
            lasts,
            fault,
        });
        s.events.sort_by_key(|e| e.at);
        s
    }

    /// Whether a fault of the schedule corrupts a value (the sidecars must then check
    /// their members' hashes often: [`CORRUPTION_CHECK`]).
    pub fn corrupts(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e.fault, Fault::CorruptValue(_)))
    }

    /// Whether a fault of the schedule fills a disk (the pods' volumes must then be
    /// size-limited: [`Set::limit_volumes`]).
    ///
    /// [`Set::limit_volumes`]: crate::loopback::Set::limit_volumes
    pub fn fills_disks(&self) -> bool {
        self.events
            .iter()
            .any(|e| matches!(e.fault, Fault::FillDisk(_)))
    }

    /// Whether a fault of the schedule partitions a pod ([`Set::enable_partitions`]).
    ///
    /// [`Set::enable_partitions`]: crate::loopback::Set::enable_partitions
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
            // A corrupted value's fault lasts, as played, while its pod is down (killed, the
            // value changed, started again): its cost after that is a restart's, and so is
            // each stop of its etcd during the rebuild that follows
            // (`Outcome::rebuild_stops`); the rest of the rebuild explains nothing.
            Fault::KillPod(_)
            | Fault::LoseVolume(_)
            | Fault::RestartAll(_)
            | Fault::CorruptValue(_) => RESTART + ELECTION + HUNG_WRITE,
        }
    }
}
