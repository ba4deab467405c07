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
use crate::etcd::{Connector, Etcd, MemberInfo};
use crate::kube_api::{workload_state, Workload};

/// How long one voter may take to answer the probe.
const VOTER_TIMEOUT: Duration = Duration::from_secs(1);

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

/// The voters among `ids` that answer with a leader, asked through their client URLs.
pub async fn answering_voters<D: Dns, C: Connector>(
    conn: &mut Connections<D, C>,
    members: &[MemberInfo],
    ids: &[u64],
) -> BTreeSet<u64> {
    let mut answering = BTreeSet::new();
    for m in members.iter().filter(|m| ids.contains(&m.id)) {
        let Some(url) = m.client_urls.first() else {
            continue;
        };
        let answered = tokio::time::timeout(VOTER_TIMEOUT, async {
            match conn.remote(url).await {
                Some(peer) => peer.status().await.ok(),
                None => None,
            }
        })
        .await;
        if matches!(answered, Ok(Some(s)) if s.member_id == m.id && s.leader != 0) {
            answering.insert(m.id);
        }
    }
    answering
}
