//! Keeps this member's peer URL right in the member list. `init` updates it before etcd
//! starts when a cluster answers in time (`update-peer-urls`); when none did (a restart
//! never waits long on its peers), etcd runs on its data while the cluster still lists the
//! old URL, and this planner asks the local member to update the entry (MemberUpdate): the
//! member keeps its ID and data.

use std::time::Duration;

use tokio::time::Instant;

use super::{Observation, Planner, Step};

/// Between two attempts (MemberUpdate needs quorum; the next tick may have it).
const RETRY: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct PeerUrl {
    last_try: Option<Instant>,
}

impl Planner for PeerUrl {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        let Ok(status) = &seen.local.status else {
            return vec![];
        };
        if status.leader == 0 {
            return vec![];
        }
        let Some(me) = seen
            .members
            .as_deref()
            .and_then(|ms| ms.iter().find(|m| m.id == status.member_id))
        else {
            return vec![];
        };
        if me.peer_urls.contains(&seen.own_peer_url) {
            return vec![];
        }
        if self
            .last_try
            .is_some_and(|t| seen.now.duration_since(t) < RETRY)
        {
            return vec![];
        }
        self.last_try = Some(seen.now);
        vec![Step::UpdatePeerUrls {
            id: status.member_id,
            url: seen.own_peer_url.clone(),
        }]
    }
}
