//! Scale-in's I/O: a task that asks the Kubernetes API every `--scale-in-interval` and
//! publishes its answer (the main tick never waits on the API), and the voters' probe the
//! loop runs only when a removal waits on nothing else. The rule is
//! [`super::plan::scale_in`].

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::conn::Connections;
use super::plan::scale_in::WorkloadSeen;
use crate::dns::Dns;
use crate::etcd::{Connector, MemberInfo};
use crate::facts::MemberStatus;
use crate::kube_api::{workload_state, Workload};

/// Asks the API every `interval` until `stop`; publishes each answer. A failure keeps the
/// last answer, which ages out in the planner: an API that stops answering removes nothing.
pub async fn watch_workload<W: Workload>(
    api: W,
    set: String,
    interval: Duration,
    tx: watch::Sender<Option<WorkloadSeen>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        match workload_state(&api, &set).await {
            Ok(state) => {
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
        fresh = crate::sidecar::observe::peer_statuses(conn, 0, Some(&asked)).await;
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
