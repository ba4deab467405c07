//! Promotion of this pod's learner: once the leader's raft index shows it caught up, or,
//! when `init` let it join and its etcd runs without serving yet, as soon as etcd accepts.
//! Asked of a voter, never of the learner itself.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::observation::{Observation, PeerApi};
use super::{Outcome, Planner, Step, Why};
use crate::facts::{ActionKind, MemberInfo, MemberStatus};

/// etcd promotes a learner whose match index is at least 90% of the leader's
/// (`isLearnerReady` in etcdserver); ask at that point and let etcd judge exactly.
pub fn caught_up(index: u64, leader_index: u64) -> bool {
    leader_index > 0 && u128::from(index) * 10 >= u128::from(leader_index) * 9
}

/// Promotes this pod's learner; counts the promotions it made.
#[derive(Debug)]
pub struct Promote {
    promotions: Counter,
}

impl Promote {
    pub fn new(registry: &mut Registry) -> Self {
        let promotions = Counter::default();
        registry.register(
            "etcd_steward_promotions",
            "Learner promotions this sidecar made",
            promotions.clone(),
        );
        Promote { promotions }
    }
}

impl Planner for Promote {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        plan(seen).into_iter().collect()
    }

    fn learn(&mut self, outcome: &Outcome) {
        if let Outcome::Done(Step::Promote { .. }) = outcome {
            self.promotions.inc();
        }
    }
}

/// The promotion this observation calls for, if any.
pub fn plan(seen: &Observation) -> Option<Step> {
    match &seen.local.status {
        Ok(status) if status.is_learner => caught_up_learner(status, seen),
        Ok(_) => None,
        Err(_) => joining_learner(seen),
    }
}

/// A learner whose status answers: promote it once the leader's index shows it caught up,
/// through the leader.
fn caught_up_learner(status: &MemberStatus, seen: &Observation) -> Option<Step> {
    let leader_index = seen.local.leader_index?;
    if status.leader == 0 || !caught_up(status.raft_index, leader_index) {
        return None;
    }
    let via = seen
        .members
        .as_deref()?
        .iter()
        .find(|m| m.id == status.leader)?
        .client_urls
        .first()?
        .clone();
    Some(Step::Promote {
        id: status.member_id,
        via,
        why: Why::CaughtUp,
    })
}

/// The local etcd runs but does not serve clients yet: while it applies the log it was
/// sent, its own status is out of reach. Its entry is found in a voter's member list by
/// this pod's peer URL, and the promotion is asked of that voter; etcd refuses until the
/// leader sees the learner caught up.
///
/// Only when `init` last started etcd as a member joining a running cluster: a voter
/// restarted without quorum also runs without serving, and its peers, equally without
/// quorum, would only keep the loop waiting.
fn joining_learner(seen: &Observation) -> Option<Step> {
    let etcd_runs = seen.local.peer_api == Some(PeerApi::Answered);
    if !etcd_runs || seen.journal.last != Some(ActionKind::Resume) {
        return None;
    }
    let (via, members) = seen.joining.as_ref()?;
    let me: &MemberInfo = members
        .iter()
        .find(|m| m.peer_urls.contains(&seen.own_peer_url))?;
    me.is_learner.then(|| Step::Promote {
        id: me.id,
        via: via.clone(),
        why: Why::BeforeServing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learner_is_caught_up_within_ninety_percent_of_the_leader() {
        assert!(!caught_up(89, 100));
        assert!(caught_up(90, 100));
        assert!(!caught_up(0, 0), "no leader index: nothing to compare with");
        assert!(caught_up(u64::MAX, u64::MAX), "no overflow");
    }
}
