//! The defragmentation planner: builds the decision's input from each observation (every
//! member's sizes, NOSPACE, its schedule slot, its cool-down, a refused lock), remembers
//! what came of its steps, counts them, and logs each wait once.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::decide::{decide, Decision, Input, MemberView, Wait};
use super::schedule::schedule_slot;
use super::{DefragPolicy, COOL_DOWN, NOSPACE_COOL_DOWN};
use crate::facts::MemberStatus;
use crate::sidecar::plan::observation::{nospace, Observation};
use crate::sidecar::plan::{Outcome, Planner, Step};

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

    fn learned(&mut self, outcome: &Outcome, at: Instant) {
        if let (Outcome::Done(Step::Defrag { .. }), Some(started)) = (outcome, self.last) {
            self.metrics
                .last_seconds
                .set(at.saturating_duration_since(started).as_secs_f64());
        }
        self.learn(outcome);
    }

    fn learn(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Done(Step::Defrag { .. }) => {
                self.metrics.total.inc();
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
    use crate::sidecar::plan::defrag::fixtures::{policy, LEADER, MIB};
    use crate::sidecar::plan::defrag::DefragWhy;

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
}
