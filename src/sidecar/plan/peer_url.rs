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
        // With a leader, the local member's list and the local member to ask; without one,
        // a peer's list and that peer (the leader may be unable to reach this member at
        // the URL its entry still names).
        let (listing, via) = match (status.leader, &seen.cluster_members) {
            (0, Some((peer, members))) => (Some(members.as_slice()), Some(peer.clone())),
            (0, None) => return vec![],
            _ => (seen.members.as_deref(), None),
        };
        let Some(me) = listing.and_then(|ms| ms.iter().find(|m| m.id == status.member_id)) else {
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
            via,
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{MemberInfo, MemberStatus};

    const NEW: &str = "https://etcd-1.etcd.default.svc.cluster.local:2380";

    fn seen(now: Instant, leader: u64, listed_at: &str) -> Observation {
        let member = |id: u64, url: &str| MemberInfo {
            id,
            name: format!("m{id}"),
            peer_urls: vec![url.into()],
            client_urls: vec!["http://x:2379".into()],
            is_learner: false,
        };
        Observation {
            members: Some(vec![member(1, listed_at), member(2, "http://other:2380")]),
            own_peer_url: NEW.into(),
            ..Observation::serving(
                now,
                MemberStatus {
                    member_id: 1,
                    leader,
                    ..Default::default()
                },
            )
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_at_an_old_url_is_updated_once_per_retry_period_and_only_with_a_leader() {
        let old = "http://etcd-1.etcd.default.svc.cluster.local:2380";
        let mut p = PeerUrl::default();
        let t = Instant::now();
        assert!(
            p.plan(&seen(t, 0, old)).is_empty(),
            "no leader: no quorum to ask"
        );
        let update = vec![Step::UpdatePeerUrls {
            id: 1,
            url: NEW.into(),
            via: None,
        }];
        assert_eq!(p.plan(&seen(t, 2, old)), update);
        assert!(p.plan(&seen(t + Duration::from_secs(1), 2, old)).is_empty());
        assert_eq!(p.plan(&seen(t + RETRY, 2, old)), update);
        assert!(
            p.plan(&seen(t + RETRY * 3, 2, NEW)).is_empty(),
            "listed at its own URL: nothing to do"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_hears_no_leader_has_its_old_entry_updated_through_a_peer() {
        // Peer TLS switched on while this member led: the others elected a leader that
        // dials this member at the old http:// URL, so it never hears from it.
        let old = "http://etcd-1.etcd.default.svc.cluster.local:2380";
        let peer = "http://etcd-2.etcd.default.svc.cluster.local:2379".to_string();
        let t = Instant::now();
        let mut leaderless = seen(t, 0, old);
        leaderless.members = None;
        leaderless.cluster_members =
            Some((peer.clone(), seen(t, 2, old).members.unwrap_or_default()));
        assert_eq!(
            PeerUrl::default().plan(&leaderless),
            vec![Step::UpdatePeerUrls {
                id: 1,
                url: NEW.into(),
                via: Some(peer.clone()),
            }]
        );
        leaderless.cluster_members = Some((peer, seen(t, 2, NEW).members.unwrap_or_default()));
        assert!(
            PeerUrl::default().plan(&leaderless).is_empty(),
            "the peer lists it at its own URL: nothing to do"
        );
    }
}
