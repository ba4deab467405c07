//! Defragmentation and the space alarm (NOSPACE). etcd's database file never shrinks by
//! itself; each sidecar defragments its own member when the file is fragmented beyond
//! `--defrag-threshold` (or `--defrag-schedule` is due), one member at a time across the
//! cluster: followers first (lowest member ID first), the leader last, only while every
//! member answers. Under NOSPACE it defragments where that brings the file under the quota
//! with margin, then disarms the alarm; when the data really is too large it says so and
//! leaves the alarm to the operator.
//!
//! One at a time holds twice: each member's sidecar sees the same order (every member's
//! status), and the step runs under a lease-held lock key in etcd (`/etcd-steward/defrag`),
//! except under NOSPACE, where etcd refuses the lease (then the order alone serialises).

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::{Outcome, Planner, Step};
use crate::facts::MemberStatus;
use crate::sidecar::observe::Observation;

/// The lock key every sidecar takes before it defragments its member.
pub const LOCK_KEY: &str = "/etcd-steward/defrag";
/// The lock's lease: released (revoked) right after; expires on its own if the sidecar dies.
/// Longer than the longest defragmentation the sidecar waits for
/// ([`crate::etcd::DEFRAG_TIMEOUT`]), so a slow one never lets a second member start.
pub const LOCK_TTL_SECS: i64 = crate::etcd::DEFRAG_TIMEOUT.as_secs() as i64 + 60;
/// After a defragmentation (or a failed one) of this member, the next waits this long.
pub const COOL_DOWN: Duration = Duration::from_secs(60);
/// The same under NOSPACE, where writes wait on every member.
pub const NOSPACE_COOL_DOWN: Duration = Duration::from_secs(5);
/// Under NOSPACE the alarm is disarmed only when every member's file is under this share of
/// the quota (in percent), so that writes do not raise it again at once.
pub const NOSPACE_MARGIN_PERCENT: u64 = 80;
/// Under NOSPACE a member is worth defragmenting when at least this much of its file is free.
const NOSPACE_MIN_FREE: u64 = 1 << 20;

/// `--defrag-threshold`: defragment when both the free share and the free bytes are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold {
    /// Free share of the file, in percent (1..=100).
    pub free_percent: u8,
    /// Free bytes.
    pub free_bytes: u64,
}

impl Threshold {
    /// Parses `PERCENT%,SIZE` (e.g. `50%,100MiB`; SIZE in B, KiB, MiB, GiB, or KB, MB, GB);
    /// `0` is off (`None`).
    pub fn parse(s: &str) -> Result<Option<Threshold>, String> {
        let s = s.trim();
        if s == "0" || s.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let (ratio, bytes) = s.split_once(',').ok_or_else(|| {
            format!("expected PERCENT%,SIZE such as 50%,100MiB (or 0 for off), got {s:?}")
        })?;
        let free_percent = ratio
            .trim()
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<u8>().ok())
            .filter(|p| (1..=100).contains(p))
            .ok_or_else(|| {
                format!("the free share must be a percentage from 1% to 100%, got {ratio:?}")
            })?;
        let free_bytes = parse_size(bytes.trim())?;
        Ok(Some(Threshold {
            free_percent,
            free_bytes,
        }))
    }

    /// Whether a file of `db_size` bytes with `in_use` bytes in use is fragmented beyond it.
    pub fn reached(&self, db_size: u64, in_use: u64) -> bool {
        let free = db_size.saturating_sub(in_use);
        free > 0
            && free >= self.free_bytes
            && free.saturating_mul(100) >= db_size.saturating_mul(u64::from(self.free_percent))
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}% and {} free",
            self.free_percent,
            Bytes(self.free_bytes)
        )
    }
}

/// A byte count such as `100MiB`, `8GiB`, `512KB` or `1048576`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("a size must be a whole number of bytes with an optional unit (B, KiB, MiB, GiB, KB, MB, GB), got {s:?}"))?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "Ki" => 1 << 10,
        "MiB" | "Mi" => 1 << 20,
        "GiB" | "Gi" => 1 << 30,
        "KB" | "K" => 1_000,
        "MB" | "M" => 1_000_000,
        "GB" | "G" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use B, KiB, MiB, GiB, KB, MB or GB)"
            ))
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Bytes, rendered for people.
#[derive(Debug, Clone, Copy)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= 1 << 30 {
            write!(f, "{:.1} GiB", b as f64 / f64::from(1u32 << 30))
        } else if b >= 1 << 20 {
            write!(f, "{:.1} MiB", b as f64 / f64::from(1u32 << 20))
        } else {
            write!(f, "{b} B")
        }
    }
}

/// The validated defragmentation options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefragPolicy {
    /// `None`: no defragmentation for fragmentation alone (`--defrag-threshold=0`).
    pub threshold: Option<Threshold>,
    /// `--defrag-schedule`: also defragment this often, fragmented or not.
    pub schedule: Option<Duration>,
    /// `--quota-backend-bytes`, as etcd is given it: what NOSPACE is measured against.
    pub quota: u64,
}

/// Why this member is defragmented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefragWhy {
    /// Fragmented beyond `--defrag-threshold`.
    Fragmented { db_size: u64, in_use: u64 },
    /// `--defrag-schedule` is due.
    Scheduled,
    /// NOSPACE is raised and defragmenting brings the file under the quota with margin.
    Nospace { db_size: u64, in_use: u64 },
}

impl fmt::Display for DefragWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DefragWhy::Fragmented { db_size, in_use } => write!(
                f,
                "the database file ({}) is fragmented beyond --defrag-threshold ({} in use)",
                Bytes(*db_size),
                Bytes(*in_use)
            ),
            DefragWhy::Scheduled => f.write_str("--defrag-schedule is due"),
            DefragWhy::Nospace { db_size, in_use } => write!(
                f,
                "NOSPACE is raised and defragmenting frees enough (file {}, {} in use)",
                Bytes(*db_size),
                Bytes(*in_use)
            ),
        }
    }
}

/// Why nothing is done although something is needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// A member did not answer its status (or the cluster has no leader, or a learner).
    Unhealthy { member: u64 },
    /// Another member goes first (a follower before this one, or any before the leader).
    Turn { first: u64 },
    /// This member was defragmented less than [`COOL_DOWN`] ago ([`NOSPACE_COOL_DOWN`]).
    CoolingDown,
    /// Another sidecar holds the lock key.
    LockHeld,
    /// NOSPACE, and the data in use does not fit under the quota with margin: defragmenting
    /// cannot help; the operator must act.
    TooLarge {
        member: u64,
        in_use: u64,
        quota: u64,
    },
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::Unhealthy { member } => write!(
                f,
                "member {member:x} is not healthy (no status, no leader, or a learner): no defragmentation until every member is"
            ),
            Wait::Turn { first } => write!(f, "member {first:x} defragments first"),
            Wait::CoolingDown => f.write_str("this member was defragmented a moment ago"),
            Wait::LockHeld => write!(f, "another member holds {LOCK_KEY}"),
            Wait::TooLarge { member, in_use, quota } => write!(
                f,
                "NOSPACE: member {member:x} holds {} in use, over {NOSPACE_MARGIN_PERCENT}% of the quota ({}); defragmenting cannot free enough, so the alarm stays. Raise etcd's --quota-backend-bytes (and the sidecar's), or delete keys and compact: the sidecars then defragment and disarm",
                Bytes(*in_use),
                Bytes(*quota)
            ),
        }
    }
}

/// What the planner concludes from one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is needed.
    Idle,
    /// Defragment this member; `lock`: take the lock key first (not under NOSPACE).
    Defrag { why: DefragWhy, lock: bool },
    /// Every member fits under the quota with margin: disarm NOSPACE.
    Disarm,
    /// Something is needed, but not now.
    Wait(Wait),
}

/// One voter, as this tick saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub id: u64,
    /// `(db_size, db_size_in_use)`, or `None` when it did not answer (or is a learner).
    pub sizes: Option<(u64, u64)>,
}

/// Everything the decision reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub me: u64,
    /// 0 when there is none.
    pub leader: u64,
    /// Every member of the cluster, this one included.
    pub members: Vec<MemberView>,
    pub nospace: bool,
    /// `--defrag-schedule` is due for this member.
    pub scheduled: bool,
    /// This member was defragmented (or tried) less than [`COOL_DOWN`] ago.
    pub cooling_down: bool,
    /// The lock was refused on the last try, not long ago.
    pub lock_held: bool,
}

/// The pure decision.
pub fn decide(policy: &DefragPolicy, i: &Input) -> Decision {
    let margin = policy.quota / 100 * NOSPACE_MARGIN_PERCENT;
    let need = |m: &MemberView| -> Option<DefragWhy> {
        let (db_size, in_use) = m.sizes?;
        if i.nospace {
            let free = db_size.saturating_sub(in_use);
            return (free > 0 && (free >= NOSPACE_MIN_FREE || db_size >= margin))
                .then_some(DefragWhy::Nospace { db_size, in_use });
        }
        if policy.threshold.is_some_and(|t| t.reached(db_size, in_use)) {
            return Some(DefragWhy::Fragmented { db_size, in_use });
        }
        (m.id == i.me && i.scheduled).then_some(DefragWhy::Scheduled)
    };
    if i.nospace {
        if let Some((member, in_use)) = i
            .members
            .iter()
            .filter_map(|m| m.sizes.map(|(_, u)| (m.id, u)))
            .find(|(_, u)| *u >= margin)
        {
            return Decision::Wait(Wait::TooLarge {
                member,
                in_use,
                quota: policy.quota,
            });
        }
    }
    // Followers by member ID, then the leader.
    let mut order: Vec<&MemberView> = i.members.iter().collect();
    order.sort_by_key(|m| (m.id == i.leader, m.id));
    let first = order.iter().find_map(|m| need(m).map(|why| (m.id, why)));
    let Some((first, why)) = first else {
        if i.nospace {
            return match i.members.iter().find(|m| m.sizes.is_none()) {
                Some(m) => Decision::Wait(Wait::Unhealthy { member: m.id }),
                None if i
                    .members
                    .iter()
                    .all(|m| m.sizes.is_some_and(|(db, _)| db < margin)) =>
                {
                    Decision::Disarm
                }
                None => Decision::Idle,
            };
        }
        return Decision::Idle;
    };
    if first != i.me {
        // Nothing to do here unless this member needs it too.
        let mine = i.members.iter().find(|m| m.id == i.me);
        if mine.and_then(need).is_none() {
            return Decision::Idle;
        }
    }
    if i.leader == 0 {
        return Decision::Wait(Wait::Unhealthy { member: i.me });
    }
    if let Some(m) = i.members.iter().find(|m| m.sizes.is_none()) {
        return Decision::Wait(Wait::Unhealthy { member: m.id });
    }
    if first != i.me {
        return Decision::Wait(Wait::Turn { first });
    }
    if i.cooling_down {
        return Decision::Wait(Wait::CoolingDown);
    }
    if i.lock_held && !i.nospace {
        return Decision::Wait(Wait::LockHeld);
    }
    Decision::Defrag {
        why,
        lock: !i.nospace,
    }
}

/// Where `--defrag-schedule` puts a member in the wall clock. The schedule's periods are
/// aligned to unix time (period `p` starts at `p × every`), so every sidecar sees the same
/// period; each period is cut into one slot per member, in the defragmentation order
/// (followers by member ID, the leader last). A member is due from the start of its slot
/// until it has been defragmented in that period: scheduled defragmentations go one after
/// another, the leader's last, not all at once when the period turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The period `unix` falls in.
    pub period: u64,
    /// Whether `unix` is at or past the start of this member's slot in that period.
    pub reached: bool,
}

/// The slot of the member at `position` (0-based) of `members` in the order, at `unix`.
pub fn schedule_slot(every: Duration, unix: u64, position: usize, members: usize) -> Slot {
    let every = every.as_secs().max(1);
    let n = u64::try_from(members.max(1)).unwrap_or(u64::MAX);
    let position = u64::try_from(position).unwrap_or(u64::MAX).min(n - 1);
    Slot {
        period: unix / every,
        reached: unix % every >= every / n * position,
    }
}

/// Whether `status` reports the NOSPACE alarm./// Whether `status` reports the NOSPACE alarm.
pub fn nospace(status: &MemberStatus) -> bool {
    status.errors.iter().any(|e| e.contains("NOSPACE"))
}

/// The defragmentation planner: its memory (last defragmentation, lock refusals), its
/// metrics, and the log of its waits (each logged once).
pub struct Defrag {
    policy: DefragPolicy,
    started: Option<Instant>,
    last: Option<Instant>,
    /// With `--defrag-schedule`: the last period this member's scheduled defragmentation is
    /// done for (the period the sidecar started in counts as done: a restarted sidecar does
    /// not defragment at once).
    schedule_done: Option<u64>,
    /// The period a defragmentation decided while the schedule was due stands for.
    schedule_pending: Option<u64>,
    lock_refused: Option<Instant>,
    /// The file size before the last defragmentation, to measure what it freed.
    before: Option<u64>,
    /// What was last logged (a wait's kind), so that each is logged once.
    logged: Option<String>,
    metrics: DefragMetrics,
}

struct DefragMetrics {
    total: Counter,
    failures: Counter,
    last_freed: Gauge,
    last_seconds: Gauge<f64, AtomicU64>,
    disarmed: Counter,
    nospace: Gauge,
}

impl Defrag {
    pub fn new(policy: DefragPolicy, registry: &mut Registry) -> Self {
        let metrics = DefragMetrics {
            total: Counter::default(),
            failures: Counter::default(),
            last_freed: Gauge::default(),
            last_seconds: Gauge::default(),
            disarmed: Counter::default(),
            nospace: Gauge::default(),
        };
        registry.register(
            "etcd_steward_defrag",
            "Defragmentations of this member that succeeded",
            metrics.total.clone(),
        );
        registry.register(
            "etcd_steward_defrag_failures",
            "Defragmentations of this member that failed",
            metrics.failures.clone(),
        );
        registry.register(
            "etcd_steward_defrag_last_freed_bytes",
            "How much the last defragmentation of this member shrank its database file",
            metrics.last_freed.clone(),
        );
        registry.register(
            "etcd_steward_defrag_last_duration_seconds",
            "How long the last defragmentation of this member took (etcd serves nothing meanwhile)",
            metrics.last_seconds.clone(),
        );
        registry.register(
            "etcd_steward_nospace_disarmed",
            "NOSPACE alarms this sidecar disarmed after defragmentation",
            metrics.disarmed.clone(),
        );
        registry.register(
            "etcd_steward_nospace_alarm",
            "1 while the local member reports the NOSPACE alarm (etcd refuses writes)",
            metrics.nospace.clone(),
        );
        Defrag {
            policy,
            started: None,
            last: None,
            schedule_done: None,
            schedule_pending: None,
            lock_refused: None,
            before: None,
            logged: None,
            metrics,
        }
    }

    /// The period this member's `--defrag-schedule` slot is due for, if it is.
    fn schedule_due(&self, seen: &Observation) -> Option<(u64, bool)> {
        let every = self.policy.schedule?;
        let me = seen.local.status.as_ref().ok()?;
        let mut ids: Vec<u64> = seen
            .members
            .as_deref()?
            .iter()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect();
        if !ids.contains(&me.member_id) {
            ids.push(me.member_id);
        }
        ids.sort_by_key(|id| (*id == me.leader, *id));
        let position = ids.iter().position(|id| *id == me.member_id)?;
        let slot = schedule_slot(every, seen.unix, position, ids.len());
        let due = slot.reached && self.schedule_done.is_some_and(|done| slot.period > done);
        Some((slot.period, due))
    }

    /// This tick's input, or `None` when the local member is not a voter that answers, or
    /// this tick has no member list (without it the other members are unknown, not absent).
    pub fn input(&mut self, seen: &Observation) -> Option<Input> {
        let me = seen.local.status.as_ref().ok()?;
        if me.is_learner {
            return None;
        }
        let listed = seen.members.as_deref()?;
        let started = *self.started.get_or_insert(seen.now);
        let schedule = self.schedule_due(seen);
        if let Some((period, _)) = schedule {
            self.schedule_done.get_or_insert(period);
        }
        self.schedule_pending = schedule.filter(|(_, due)| *due).map(|(p, _)| p);
        let since = |t: Option<Instant>| seen.now.saturating_duration_since(t.unwrap_or(started));
        let sizes = |s: &MemberStatus| {
            (!s.is_learner && s.leader != 0).then_some((
                u64::try_from(s.db_size).unwrap_or(0),
                u64::try_from(s.db_size_in_use).unwrap_or(0),
            ))
        };
        let mut members = vec![MemberView {
            id: me.member_id,
            sizes: sizes(me),
        }];
        for m in listed.iter().filter(|m| m.id != me.member_id) {
            let status = seen.peers.iter().find(|s| s.member_id == m.id);
            members.push(MemberView {
                id: m.id,
                sizes: status.and_then(sizes),
            });
        }
        self.metrics.nospace.set(i64::from(nospace(me)));
        let nospace = nospace(me) || seen.peers.iter().any(nospace);
        let cool_down = if nospace {
            NOSPACE_COOL_DOWN
        } else {
            COOL_DOWN
        };
        Some(Input {
            me: me.member_id,
            leader: me.leader,
            members,
            nospace,
            scheduled: self.schedule_pending.is_some(),
            cooling_down: self.last.is_some_and(|_| since(self.last) < cool_down),
            lock_held: self
                .lock_refused
                .is_some_and(|t| seen.now.saturating_duration_since(t) < Duration::from_secs(5)),
        })
    }

    fn say(&mut self, d: &Decision) {
        // The sizes in a wait change at every write: they do not make it a new wait.
        let key = match d {
            Decision::Wait(Wait::TooLarge { member, .. }) => format!("too large: {member:x}"),
            other => format!("{other:?}"),
        };
        if self.logged.as_deref() == Some(key.as_str()) {
            return;
        }
        match d {
            Decision::Wait(w @ Wait::TooLarge { .. }) => {
                tracing::error!(reason = %w, "NOSPACE: the data is too large to fix by defragmentation");
            }
            Decision::Wait(w) => tracing::info!(reason = %w, "defragmentation waits"),
            _ => {}
        }
        self.logged = Some(key);
    }
}

impl Planner for Defrag {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        let Some(input) = self.input(seen) else {
            return Vec::new();
        };
        if let (Some(before), Some(me)) = (self.before, seen.local.status.as_ref().ok()) {
            let after = u64::try_from(me.db_size).unwrap_or(0);
            self.metrics
                .last_freed
                .set(i64::try_from(before.saturating_sub(after)).unwrap_or(i64::MAX));
            tracing::info!(
                before = before,
                after = after,
                "database file after defragmentation"
            );
            self.before = None;
        }
        let decision = decide(&self.policy, &input);
        self.say(&decision);
        match decision {
            Decision::Defrag { why, lock } => {
                self.last = Some(seen.now);
                self.before = seen
                    .local
                    .status
                    .as_ref()
                    .ok()
                    .map(|s| u64::try_from(s.db_size).unwrap_or(0));
                vec![Step::Defrag { why, lock }]
            }
            // The leader's sidecar disarms, so that one does it.
            Decision::Disarm if input.leader == input.me => vec![Step::DisarmNospace],
            _ => Vec::new(),
        }
    }

    /// Only when the local member itself may need something (the other sidecars look after
    /// theirs): NOSPACE, its schedule slot due, or its own file fragmented.
    fn wants_peers(&self, seen: &Observation) -> bool {
        let Ok(me) = seen.local.status.as_ref() else {
            return false;
        };
        let (db, in_use) = (
            u64::try_from(me.db_size).unwrap_or(0),
            u64::try_from(me.db_size_in_use).unwrap_or(0),
        );
        !me.is_learner
            && me.leader != 0
            && (nospace(me)
                || self.schedule_due(seen).is_some_and(|(_, due)| due)
                || self.policy.threshold.is_some_and(|t| t.reached(db, in_use)))
    }

    fn learn(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Done(Step::Defrag { .. }) => {
                self.metrics.total.inc();
                if let Some(started) = self.last {
                    self.metrics.last_seconds.set(
                        Instant::now()
                            .saturating_duration_since(started)
                            .as_secs_f64(),
                    );
                }
                if let Some(period) = self.schedule_pending.take() {
                    self.schedule_done = Some(period);
                }
            }
            Outcome::NotYet(Step::Defrag { .. }) => {
                // The lock was held: not a defragmentation, try again after a short wait.
                self.lock_refused = self.last;
                self.last = None;
                self.before = None;
            }
            Outcome::Failed(Step::Defrag { .. }, _) => {
                self.metrics.failures.inc();
                self.before = None;
            }
            Outcome::Done(Step::DisarmNospace) => {
                self.metrics.disarmed.inc();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const LEADER: u64 = 3;

    fn policy() -> DefragPolicy {
        DefragPolicy {
            threshold: Some(Threshold {
                free_percent: 50,
                free_bytes: 100 * MIB,
            }),
            schedule: None,
            quota: 2048 * MIB,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_member_list_the_other_members_are_unknown_and_nothing_is_decided() {
        let mut planner = Defrag::new(policy(), &mut Registry::default());
        let me = MemberStatus {
            member_id: LEADER,
            leader: LEADER,
            db_size: (1024 * MIB) as i64,
            db_size_in_use: (10 * MIB) as i64,
            errors: vec!["memberID:3 alarm:NOSPACE".into()],
            ..Default::default()
        };
        let mut seen = Observation::serving(Instant::now(), me);
        assert!(
            planner.input(&seen).is_none(),
            "alone in its own eyes, it would defragment and disarm on its own sizes"
        );
        seen.members = Some(vec![crate::facts::MemberInfo {
            id: LEADER,
            name: "etcd-2".into(),
            peer_urls: vec![],
            client_urls: vec![],
            is_learner: false,
        }]);
        assert!(planner.input(&seen).is_some());
    }

    /// Three members, 1 and 2 followers, 3 the leader; each (db_size, in_use) in MiB.
    fn input(me: u64, sizes: [Option<(u64, u64)>; 3]) -> Input {
        Input {
            me,
            leader: LEADER,
            members: (1..=3)
                .zip(sizes)
                .map(|(id, s)| MemberView {
                    id,
                    sizes: s.map(|(d, u)| (d * MIB, u * MIB)),
                })
                .collect(),
            nospace: false,
            scheduled: false,
            cooling_down: false,
            lock_held: false,
        }
    }

    const LEAN: Option<(u64, u64)> = Some((300, 250));
    const FRAGMENTED: Option<(u64, u64)> = Some((1000, 300));

    #[test]
    fn threshold_parses_percent_and_size_or_off() {
        assert_eq!(
            Threshold::parse("50%,100MiB"),
            Ok(Some(Threshold {
                free_percent: 50,
                free_bytes: 100 * MIB
            }))
        );
        assert_eq!(Threshold::parse("0"), Ok(None));
        assert!(Threshold::parse("50%").is_err());
        assert!(Threshold::parse("150%,1MiB").is_err());
        assert!(Threshold::parse("50%,1XB").is_err());
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("16777216"), Ok(16 << 20));
    }

    #[test]
    fn fragmented_follower_defrags() {
        let d = decide(&policy(), &input(1, [FRAGMENTED, LEAN, LEAN]));
        assert!(matches!(
            d,
            Decision::Defrag {
                why: DefragWhy::Fragmented { .. },
                lock: true
            }
        ));
    }

    #[test]
    fn lean_member_does_nothing() {
        assert_eq!(
            decide(&policy(), &input(1, [LEAN, LEAN, LEAN])),
            Decision::Idle
        );
    }

    #[test]
    fn followers_go_by_id_and_the_leader_waits_for_them() {
        let all = [FRAGMENTED, FRAGMENTED, FRAGMENTED];
        assert!(matches!(
            decide(&policy(), &input(1, all)),
            Decision::Defrag { .. }
        ));
        assert_eq!(
            decide(&policy(), &input(2, all)),
            Decision::Wait(Wait::Turn { first: 1 })
        );
        assert_eq!(
            decide(&policy(), &input(LEADER, all)),
            Decision::Wait(Wait::Turn { first: 1 })
        );
        // Once the followers are lean, the leader goes.
        assert!(matches!(
            decide(&policy(), &input(LEADER, [LEAN, LEAN, FRAGMENTED])),
            Decision::Defrag { .. }
        ));
    }

    #[test]
    fn unhealthy_member_means_nobody_defrags() {
        assert_eq!(
            decide(&policy(), &input(1, [FRAGMENTED, None, LEAN])),
            Decision::Wait(Wait::Unhealthy { member: 2 })
        );
        let mut no_leader = input(1, [FRAGMENTED, LEAN, LEAN]);
        no_leader.leader = 0;
        assert!(matches!(
            decide(&policy(), &no_leader),
            Decision::Wait(Wait::Unhealthy { .. })
        ));
    }

    #[test]
    fn lock_held_by_another_waits() {
        let mut i = input(1, [FRAGMENTED, LEAN, LEAN]);
        i.lock_held = true;
        assert_eq!(decide(&policy(), &i), Decision::Wait(Wait::LockHeld));
    }

    #[test]
    fn cooling_down_after_a_defrag_waits() {
        let mut i = input(1, [FRAGMENTED, LEAN, LEAN]);
        i.cooling_down = true;
        assert_eq!(decide(&policy(), &i), Decision::Wait(Wait::CoolingDown));
    }

    #[test]
    fn threshold_zero_never_defrags_for_fragmentation() {
        let off = DefragPolicy {
            threshold: None,
            ..policy()
        };
        assert_eq!(
            decide(&off, &input(1, [FRAGMENTED, FRAGMENTED, FRAGMENTED])),
            Decision::Idle
        );
        // The threshold needs both the share and the bytes.
        assert!(!policy()
            .threshold
            .is_some_and(|t| t.reached(150 * MIB, 60 * MIB)));
        assert!(!policy()
            .threshold
            .is_some_and(|t| t.reached(10_000 * MIB, 9_000 * MIB)));
    }

    #[test]
    fn schedule_defrags_a_lean_member_in_turn() {
        let mut i = input(2, [LEAN, LEAN, LEAN]);
        i.scheduled = true;
        assert!(matches!(
            decide(&policy(), &i),
            Decision::Defrag {
                why: DefragWhy::Scheduled,
                ..
            }
        ));
    }

    #[test]
    fn schedule_periods_line_up_on_the_wall_clock_and_the_leader_has_the_last_slot() {
        let day = Duration::from_secs(86_400);
        let at = |unix, position| schedule_slot(day, unix, position, 3);
        // Period 10 starts at 864000 for every sidecar; slots at +0, +8h, +16h.
        assert_eq!(
            at(864_000, 0),
            Slot {
                period: 10,
                reached: true
            }
        );
        assert_eq!(
            at(864_000, 1),
            Slot {
                period: 10,
                reached: false
            }
        );
        assert!(at(864_000 + 8 * 3600, 1).reached);
        assert!(!at(864_000 + 8 * 3600, 2).reached, "the leader goes last");
        assert!(at(864_000 + 16 * 3600, 2).reached);
        assert_eq!(at(864_000 + 86_399, 2).period, 10);
        assert_eq!(
            at(864_000 + 86_400, 2),
            Slot {
                period: 11,
                reached: false
            }
        );
        // A position past the list (a member list that shrank) takes the last slot.
        assert_eq!(at(864_000 + 16 * 3600, 7), at(864_000 + 16 * 3600, 2));
    }

    /// Member `me` of three (1 and 2 followers, 3 the leader), lean, seen at `unix`.
    fn scheduled_seen(me: u64, unix: u64) -> Observation {
        let status = MemberStatus {
            member_id: me,
            leader: LEADER,
            db_size: (300 * MIB) as i64,
            db_size_in_use: (250 * MIB) as i64,
            ..Default::default()
        };
        let peers = (1..=3)
            .filter(|id| *id != me)
            .map(|id| MemberStatus {
                member_id: id,
                ..status.clone()
            })
            .collect();
        let members = (1..=3)
            .map(|id| crate::facts::MemberInfo {
                id,
                name: format!("etcd-{}", id - 1),
                peer_urls: vec![],
                client_urls: vec![],
                is_learner: false,
            })
            .collect();
        Observation {
            unix,
            members: Some(members),
            peers,
            ..Observation::serving(Instant::now(), status)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_schedule_defragments_once_per_period_in_its_slot_not_when_the_sidecar_starts() {
        let hour = Duration::from_secs(3600);
        let policy = DefragPolicy {
            threshold: None,
            schedule: Some(hour),
            ..policy()
        };
        let mut follower = Defrag::new(policy, &mut Registry::default());
        let mut leader = Defrag::new(policy, &mut Registry::default());
        // Started in period 100, past every slot: nothing this period, and no peers asked.
        let p100 = 100 * 3600 + 3000;
        for (me, planner) in [(1, &mut follower), (LEADER, &mut leader)] {
            let seen = scheduled_seen(me, p100);
            assert!(planner.plan(&seen).is_empty());
            assert!(!planner.wants_peers(&seen));
        }
        // Period 101, first slot: the first follower is due, the leader (last slot) is not.
        let p101 = 101 * 3600;
        tokio::time::advance(2 * COOL_DOWN).await;
        assert!(follower.wants_peers(&scheduled_seen(1, p101)));
        assert!(!leader.wants_peers(&scheduled_seen(LEADER, p101)));
        assert!(leader.plan(&scheduled_seen(LEADER, p101)).is_empty());
        let steps = follower.plan(&scheduled_seen(1, p101));
        assert_eq!(
            steps,
            vec![Step::Defrag {
                why: DefragWhy::Scheduled,
                lock: true
            }]
        );
        follower.learn(&Outcome::Done(steps[0].clone()));
        // Done for period 101: not again this period, however long it waits.
        tokio::time::advance(2 * COOL_DOWN).await;
        let later = scheduled_seen(1, p101 + 3000);
        assert!(!follower.wants_peers(&later));
        assert!(follower.plan(&later).is_empty());
        // The leader's slot (the last third of the hour) comes.
        let leaders_slot = scheduled_seen(LEADER, p101 + 2400);
        assert!(leader.wants_peers(&leaders_slot));
        assert!(matches!(
            leader.plan(&leaders_slot).as_slice(),
            [Step::Defrag {
                why: DefragWhy::Scheduled,
                ..
            }]
        ));
        // Next period, the follower's turn again.
        assert!(follower.wants_peers(&scheduled_seen(1, 102 * 3600)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_refused_scheduled_defragmentation_stays_due() {
        let policy = DefragPolicy {
            threshold: None,
            schedule: Some(Duration::from_secs(3600)),
            ..policy()
        };
        let mut p = Defrag::new(policy, &mut Registry::default());
        assert!(p.plan(&scheduled_seen(2, 5 * 3600 + 3500)).is_empty());
        let due = scheduled_seen(2, 6 * 3600 + 1300);
        let steps = p.plan(&due);
        assert_eq!(steps.len(), 1);
        p.learn(&Outcome::NotYet(steps[0].clone()));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(p.wants_peers(&scheduled_seen(2, 6 * 3600 + 1310)));
    }

    fn nospace_policy() -> DefragPolicy {
        DefragPolicy {
            quota: 16 * MIB,
            ..policy()
        }
    }

    #[test]
    fn nospace_with_enough_to_free_defrags_then_disarms() {
        // 16 MiB files with 2 MiB in use: each defragments, followers first, without the lock.
        let full = Some((16, 2));
        let mut i = input(1, [full, full, full]);
        i.nospace = true;
        assert!(matches!(
            decide(&nospace_policy(), &i),
            Decision::Defrag {
                why: DefragWhy::Nospace { .. },
                lock: false
            }
        ));
        let mut leader = input(LEADER, [full, full, full]);
        leader.nospace = true;
        assert_eq!(
            decide(&nospace_policy(), &leader),
            Decision::Wait(Wait::Turn { first: 1 })
        );
        // All lean again: disarm.
        let lean = Some((2, 2));
        let mut done = input(LEADER, [lean, lean, lean]);
        done.nospace = true;
        assert_eq!(decide(&nospace_policy(), &done), Decision::Disarm);
    }

    #[test]
    fn nospace_with_data_too_large_does_not_disarm_and_says_why() {
        let full = Some((16, 15));
        let mut i = input(LEADER, [full, full, full]);
        i.nospace = true;
        let d = decide(&nospace_policy(), &i);
        assert!(matches!(
            d,
            Decision::Wait(Wait::TooLarge { member: 1, .. })
        ));
        let text = match d {
            Decision::Wait(w) => w.to_string(),
            _ => String::new(),
        };
        assert!(text.contains("--quota-backend-bytes"), "{text}");
        assert!(text.contains("delete keys"), "{text}");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn sizes() -> impl Strategy<Value = Option<(u64, u64)>> {
            prop_oneof![
                1 => Just(None),
                8 => (1u64..3000, 0u64..100).prop_map(|(db, pct)| Some((db, db * pct / 100))),
            ]
        }

        proptest! {
            /// Every sidecar sees the same statuses: at most one of them defragments, and the
            /// leader only when no follower needs it.
            #[test]
            fn at_most_one_member_defragments_and_the_leader_last(
                s in proptest::array::uniform3(sizes()),
                nospace in any::<bool>(),
                quota_mib in 8u64..4096,
            ) {
                let policy = DefragPolicy { quota: quota_mib * MIB, ..policy() };
                let decisions: Vec<Decision> = (1..=3)
                    .map(|me| {
                        let mut i = input(me, s);
                        i.nospace = nospace;
                        decide(&policy, &i)
                    })
                    .collect();
                let defrags: Vec<u64> = (1..=3)
                    .zip(&decisions)
                    .filter(|(_, d)| matches!(d, Decision::Defrag { .. }))
                    .map(|(me, _)| me)
                    .collect();
                prop_assert!(defrags.len() <= 1, "{decisions:?}");
                if defrags == [LEADER] {
                    prop_assert!(
                        decisions[..2].iter().all(|d| *d == Decision::Idle),
                        "the leader goes only when no follower needs it: {:?}",
                        decisions
                    );
                }
                if s.iter().any(Option::is_none) {
                    prop_assert!(defrags.is_empty(), "an unhealthy member stops everyone");
                    prop_assert!(!decisions.contains(&Decision::Disarm));
                }
            }

            /// With `--defrag-schedule` due on any members at once (each sidecar knows only
            /// its own slot), the lock is what keeps them one at a time: a scheduled
            /// defragmentation always takes it, at most one member goes without it, and the
            /// leader never goes while a follower is fragmented beyond the threshold.
            #[test]
            fn scheduled_defragmentations_take_the_lock_and_the_leader_still_goes_last(
                s in proptest::array::uniform3(sizes()),
                scheduled in proptest::array::uniform3(any::<bool>()),
                nospace in any::<bool>(),
                quota_mib in 8u64..4096,
            ) {
                let policy = DefragPolicy { quota: quota_mib * MIB, ..policy() };
                let decisions: Vec<Decision> = (1..=3u64)
                    .map(|me| {
                        let mut i = input(me, s);
                        i.nospace = nospace;
                        i.scheduled = scheduled[(me - 1) as usize];
                        decide(&policy, &i)
                    })
                    .collect();
                let unlocked = decisions
                    .iter()
                    .filter(|d| matches!(d, Decision::Defrag { lock: false, .. }))
                    .count();
                prop_assert!(unlocked <= 1, "{decisions:?}");
                for d in &decisions {
                    if let Decision::Defrag { why: DefragWhy::Scheduled, lock } = d {
                        prop_assert!(*lock, "{decisions:?}");
                    }
                }
                let follower_fragmented = s[..2].iter().any(|m| {
                    m.is_some_and(|(db, used)| {
                        policy.threshold.is_some_and(|t| t.reached(db * MIB, used * MIB))
                    })
                });
                if follower_fragmented && !nospace {
                    prop_assert!(
                        !matches!(decisions[2], Decision::Defrag { .. }),
                        "the leader jumped a fragmented follower: {decisions:?}"
                    );
                }
            }
        }
    }
}
