//! Scale-in's executor (its I/O): a task that, while this pod's member leads, asks the Kubernetes API every
//! `--scale-in-interval` and publishes its answer (the main tick never waits on the API),
//! and the voters' probe the loop runs only when a removal waits on nothing else. The rule
//! is [`crate::sidecar::plan::scale_in`].

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::dns::Dns;
use crate::etcd::{Connector, MemberInfo};
use crate::facts::MemberStatus;
use crate::kube_api::{workload_state, Workload};
use crate::sidecar::conn::Connections;
use crate::sidecar::plan::observation::{Observation, WorkloadSeen, WorkloadState};
use crate::sidecar::plan::scale_in::voters_to_ask;

/// The sidecar's share of scale-in: what the loop feeds the planner and tells the API's
/// watcher.
pub struct ScaleInDuty {
    /// The API's last answer, as [`watch_workload`] publishes it.
    pub answers: watch::Receiver<Option<WorkloadSeen>>,
    /// Whether this pod's member leads, as the last observation saw: the watcher asks the
    /// API only while it does.
    pub leading: watch::Sender<bool>,
    pub identity: crate::identity::Identity,
    /// `--replicas`, the initial size.
    pub initial: u32,
    /// `--scale-in-interval`.
    pub interval: Duration,
}

impl ScaleInDuty {
    /// Tells the watcher whether this member leads, and adds to `seen` the API's last
    /// answer and, when a removal waits only on them, the voters' answers.
    pub async fn gather<D: Dns, C: Connector>(
        &self,
        conn: &mut Connections<D, C>,
        seen: &mut Observation,
    ) {
        let leads = matches!(&seen.local.status, Ok(s) if s.leader != 0 && s.leader == s.member_id && !s.is_learner);
        self.leading.send_if_modified(|held| {
            let changed = *held != leads;
            *held = leads;
            changed
        });
        seen.scale_in.workload = self.answers.borrow().clone();
        let ask = voters_to_ask(&self.identity, self.initial, self.interval, seen);
        if let (Some(ids), Some(members)) = (ask, seen.members.clone()) {
            seen.scale_in.voters_answering =
                Some(answering_voters(conn, &members, &ids, &seen.peers).await);
        }
    }
}

/// While `leading` is true, asks the API every `interval` (at once when leadership
/// arrives) until `stop`, and publishes each answer. Only the leader removes members, so a
/// follower does not ask: when leadership goes, the asking stops and the published answer
/// is withdrawn (a later leadership starts from a fresh answer, never a stale one). A
/// failure keeps the last answer, which ages out in the planner: an API that stops
/// answering removes nothing.
pub async fn watch_workload<W: Workload>(
    api: W,
    set: String,
    interval: Duration,
    tx: watch::Sender<Option<WorkloadSeen>>,
    mut leading: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        if !*leading.borrow_and_update() {
            if tx.send_replace(None).is_some() {
                tracing::info!("scale-in: this member no longer leads; the Kubernetes API is not asked meanwhile");
            }
            tokio::select! {
                led = leading.wait_for(|l| *l) => if led.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
            continue;
        }
        let answer = workload_state(&api, &set).await;
        if !*leading.borrow() {
            // Leadership went while the API answered: not this pod's answer to keep.
            continue;
        }
        match answer {
            Ok(answer) => {
                let state = WorkloadState {
                    replicas: answer.replicas,
                    pods: answer.pods,
                };
                if failing {
                    tracing::info!("scale-in: the Kubernetes API answers again");
                    failing = false;
                }
                let changed = tx.borrow().as_ref().map(|w| &w.state) != Some(&state);
                if changed {
                    tracing::info!(replicas = state.replicas, pods = ?state.pods, "scale-in: the StatefulSet as the API has it");
                }
                tx.send_replace(Some(WorkloadSeen {
                    at: Instant::now(),
                    state,
                }));
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "scale-in: no answer from the Kubernetes API; nothing is removed meanwhile");
                    failing = true;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            lost = leading.wait_for(|l| !*l) => if lost.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// The voters among `ids` that answer with a leader: from `known`, the peers' statuses this
/// tick already holds (the defragmentation planner asks them), else asked now, only those.
pub async fn answering_voters<D: Dns, C: Connector>(
    conn: &mut Connections<D, C>,
    members: &[MemberInfo],
    ids: &[u64],
    known: &[MemberStatus],
) -> BTreeSet<u64> {
    let fresh;
    let statuses = if known.is_empty() {
        let asked: Vec<MemberInfo> = members
            .iter()
            .filter(|m| ids.contains(&m.id))
            .cloned()
            .collect();
        fresh = crate::sidecar::gather::peer_statuses(conn, 0, Some(&asked)).await;
        &fresh
    } else {
        known
    };
    statuses
        .iter()
        .filter(|s| ids.contains(&s.member_id) && s.leader != 0)
        .map(|s| s.member_id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeWorkload;

    const INTERVAL: Duration = Duration::from_secs(10);

    /// Lets the watcher run until it waits on a timer or a channel.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_does_not_ask_the_api_and_a_leader_asks_at_once_and_every_interval() {
        let api = FakeWorkload::default();
        api.set(Some(3), &["etcd-0", "etcd-1", "etcd-2"]);
        let (tx, rx) = watch::channel(None);
        let (lead_tx, lead_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(watch_workload(
            api.clone(),
            "etcd".into(),
            INTERVAL,
            tx,
            lead_rx,
            stop_rx,
        ));
        // A follower, over several intervals: not one call.
        settle().await;
        tokio::time::sleep(INTERVAL * 5).await;
        settle().await;
        assert_eq!(api.calls(), 0, "a follower asked the API");
        assert_eq!(*rx.borrow(), None);

        // Leadership arrives: asked at once (both questions), published.
        lead_tx.send_replace(true);
        settle().await;
        assert_eq!(api.calls(), 2);
        let seen = rx.borrow().clone().map(|w| w.state);
        assert_eq!(
            seen.map(|s| (s.replicas, s.pods)),
            Some((3, BTreeSet::from([0, 1, 2])))
        );
        // And again an interval later.
        tokio::time::sleep(INTERVAL).await;
        settle().await;
        assert_eq!(api.calls(), 4);

        // Leadership lost: the answer is withdrawn and the API is no longer asked.
        lead_tx.send_replace(false);
        settle().await;
        assert_eq!(*rx.borrow(), None, "a stale answer outlived leadership");
        let asked = api.calls();
        tokio::time::sleep(INTERVAL * 5).await;
        settle().await;
        assert_eq!(api.calls(), asked, "a former leader kept asking");

        stop_tx.send_replace(true);
        settle().await;
        assert!(task.is_finished());
    }
}
