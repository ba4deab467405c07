//! `sidecar`: binds its HTTP port (failing start-up if it is taken), then runs one loop
//! that observes the local member, updates the health verdicts, promotes this pod's
//! learner once it has caught up, and — on the leader — removes stalled learners.
//! Stops cleanly on SIGTERM.

pub mod health;
pub mod promote;
pub mod server;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::{Connector, Etcd, EtcdError, MemberInfo, MemberStatus};
use crate::config::Config;
use crate::dns::Dns;
use crate::http_get::{self, GetError};
use crate::identity::split_url;
use health::{assess, AppState, Health, LocalObservation, PeerApi, Snapshot};
use promote::{next_step, StallTracker, Step};

/// How often the loop looks: once a second while this member is ready; ten times a second
/// while it is not (etcd starting, or waiting for its peers), so `/ready` turns 200 within
/// 100 ms of etcd serving; four times a second while it is a learner.
const TICK: Duration = Duration::from_secs(1);
const FAST_TICK: Duration = Duration::from_millis(100);
const LEARNER_TICK: Duration = Duration::from_millis(250);
const PEER_API_TIMEOUT: Duration = Duration::from_millis(800);
/// The local member's status and serializable read are answered from its memory: when
/// they take longer than this, etcd is busy (applying a log it was sent, or hung), and
/// the loop moves on rather than stall.
const LOCAL_TIMEOUT: Duration = Duration::from_millis(500);

/// `call`, or a time-out error once `limit` has passed.
async fn bounded<T>(
    limit: Duration,
    endpoint: &str,
    call: impl std::future::Future<Output = Result<T, EtcdError>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(EtcdError::TimedOut {
            endpoint: endpoint.to_string(),
            detail: format!("no answer within {limit:?}"),
        }),
    }
}

#[derive(Debug, Error)]
pub enum SidecarError {
    #[error("cannot listen on {addr}: {source}; is another process using --http-port?")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("peer TLS set-up failed: {0}")]
    Tls(String),
}

/// Runs the sidecar until SIGTERM (or `stop` turns true).
pub async fn run<D, C>(
    cfg: Config,
    dns: D,
    connector: C,
    mut stop: watch::Receiver<bool>,
) -> Result<(), SidecarError>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    let addr = SocketAddr::new(cfg.listen_ip, cfg.http_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| SidecarError::Bind { addr, source })?;
    let (tx, rx) = watch::channel(Snapshot {
        health: Health::starting(),
        promotions: 0,
        learners_removed: 0,
    });
    let state = AppState {
        snapshot: rx,
        name: Arc::from(cfg.identity.name()),
        data_dir: Arc::new(cfg.data_dir.clone()),
    };
    let app = match &cfg.peer_tls {
        None => health::router(state.clone()).merge(health::report_router(state.clone())),
        Some(tls) => {
            let report_addr = SocketAddr::new(cfg.listen_ip, cfg.peer_report_port);
            let listener = tokio::net::TcpListener::bind(report_addr)
                .await
                .map_err(|source| SidecarError::Bind {
                    addr: report_addr,
                    source,
                })?;
            let config = tls
                .server_config()
                .map_err(|e| SidecarError::Tls(e.to_string()))?;
            tracing::info!(addr = %report_addr, "serving /peer/report over mutual TLS (peer CA)");
            let reports = health::report_router(state.clone());
            let limits = server::Limits::default();
            tokio::spawn(server::serve(
                listener,
                Some(config),
                reports,
                limits,
                stop.clone(),
            ));
            health::router(state.clone())
        }
    };
    tracing::info!(%addr, pod = %cfg.identity.name(), "sidecar serving /healthz, /ready, /metrics");
    let server = tokio::spawn(server::serve(
        listener,
        None,
        app,
        server::Limits::default(),
        stop.clone(),
    ));
    let mut control = Control {
        cfg,
        dns,
        connector,
        local: None,
        remotes: HashMap::new(),
        tracker: StallTracker::default(),
        tx,
    };
    loop {
        let pause = control.tick().await;
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    tracing::info!("sidecar stopping");
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    Ok(())
}

struct Control<D, C: Connector> {
    cfg: Config,
    dns: D,
    connector: C,
    local: Option<C::Member>,
    /// Connections to other members, by DNS name, with the address they were opened to.
    remotes: HashMap<String, (IpAddr, C::Member)>,
    tracker: StallTracker,
    tx: watch::Sender<Snapshot>,
}

impl<D: Dns, C: Connector> Control<D, C> {
    async fn local(&mut self) -> Result<&C::Member, EtcdError> {
        if self.local.is_none() {
            let id = &self.cfg.identity;
            let member = self
                .connector
                .connect(&id.host(id.ordinal), self.cfg.local_ip(), id.client_port)
                .await?;
            self.local = Some(member);
        }
        self.local.as_ref().ok_or(EtcdError::NoLeader)
    }

    /// A connection to the member whose URL is `url`, resolving its name afresh.
    async fn remote(&mut self, url: &str) -> Option<&C::Member> {
        let (host, port) = split_url(url)?;
        let ip = match host.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => {
                let answer = self.dns.lookup(&host).await;
                tracing::debug!(%host, ?answer, "resolved");
                answer.first()?
            }
        };
        let stale = self.remotes.get(&host).is_some_and(|(old, _)| *old != ip);
        if stale || !self.remotes.contains_key(&host) {
            let member = self.connector.connect(&host, ip, port).await.ok()?;
            self.remotes.insert(host.clone(), (ip, member));
        }
        self.remotes.get(&host).map(|(_, m)| m)
    }

    async fn peer_api(&self) -> PeerApi {
        let ordinal = self.cfg.identity.ordinal;
        match http_get::etcd_peer_version(&self.cfg, ordinal, self.cfg.local_ip(), PEER_API_TIMEOUT)
            .await
        {
            Ok(()) => PeerApi::Answered,
            Err(GetError::Refused(_)) => PeerApi::NotListening,
            Err(GetError::Failed(e)) => PeerApi::NoAnswer(e),
        }
    }

    /// One round: observe, assess, act. Returns how long to wait before the next.
    async fn tick(&mut self) -> Duration {
        let (serializable, status, members) = match self.local().await {
            Err(e) => (Err(e.to_string()), Err(e.to_string()), None),
            Ok(local) => {
                let endpoint = local.endpoint();
                let (ser, st) = tokio::join!(
                    bounded(LOCAL_TIMEOUT, endpoint, local.serializable_read()),
                    bounded(LOCAL_TIMEOUT, endpoint, local.status())
                );
                // A refusal for want of credentials is still etcd answering locally.
                let ser = match ser {
                    Err(EtcdError::Unauthorized { .. }) => Ok(()),
                    other => other,
                };
                let members = match &st {
                    Ok(_) => local.members().await.ok().map(|(_, m)| m),
                    Err(_) => None,
                };
                (
                    ser.map_err(|e| e.to_string()),
                    st.map_err(|e| e.to_string()),
                    members,
                )
            }
        };
        // A learner may be refused the member list, or hold a stale one: ask the voters.
        let members = match &status {
            Ok(s) if s.is_learner => match self.members_from_peers().await {
                Some((_, m)) => Some(m),
                None => members,
            },
            _ => members,
        };
        let peer_api = match serializable {
            Ok(()) => None,
            Err(_) => Some(self.peer_api().await),
        };
        let mut linearizable = None;
        let mut leader_index = None;
        if let Ok(s) = &status {
            if !s.is_learner && s.leader != 0 {
                if let Ok(local) = self.local().await {
                    let read = local.linearizable_read().await;
                    // Opened without a token while a learner: reopen with credentials.
                    if matches!(read, Err(EtcdError::Unauthorized { .. })) {
                        self.local = None;
                    }
                    linearizable = Some(read.map_err(|e| e.to_string()));
                }
            }
            if s.leader != 0 && s.leader != s.member_id {
                leader_index = self
                    .leader_status(s.leader, members.as_deref())
                    .await
                    .map(|l| l.raft_index);
            }
        }
        let observation = LocalObservation {
            serializable,
            peer_api,
            status: status.clone(),
            linearizable,
            leader_index,
        };
        let health = assess(&observation);
        let ready = health.ready.ok;
        let etcd_runs = observation.peer_api == Some(PeerApi::Answered);
        let changed = self.tx.borrow().health.ready != health.ready
            || self.tx.borrow().health.live != health.live;
        if changed {
            tracing::info!(live = health.live.ok, ready = health.ready.ok, live_reason = %health.live.reason, ready_reason = %health.ready.reason, "health changed");
        }
        self.tx.send_modify(|s| s.health = health);

        let Ok(status) = status else {
            self.tracker.reset();
            if etcd_runs {
                self.promote_before_serving().await;
            }
            return FAST_TICK;
        };
        if status.is_learner {
            let promoted = self
                .try_promote(&status, leader_index, members.as_deref())
                .await;
            // Once promoted, look again soon: the member is ready as a voter at once.
            return if promoted { FAST_TICK } else { LEARNER_TICK };
        }
        if status.leader == status.member_id {
            self.remove_stalled_learners(&status, members.as_deref())
                .await;
        } else {
            self.tracker.reset();
        }
        if ready {
            TICK
        } else {
            FAST_TICK
        }
    }

    /// Promotes this pod's learner while its etcd runs but does not serve clients yet.
    ///
    /// A new member receives the leader's log (or a snapshot) and serves clients only once
    /// it has applied all of it, which with a large keyspace takes seconds. etcd accepts the
    /// promotion earlier, as soon as the leader sees the learner's log caught up. Its own
    /// status is out of reach meanwhile, so its entry is found in a voter's member list, by
    /// this pod's peer URL, and the promotion is asked of that voter (a follower forwards it
    /// to the leader, which refuses it while the learner is behind).
    ///
    /// Only when `init` last started etcd as a member joining a running cluster: a voter
    /// restarted without quorum also runs without serving, and its peers, equally without
    /// quorum, would only keep the loop waiting.
    async fn promote_before_serving(&mut self) {
        if crate::datadir::last_decision(&self.cfg.data_dir).as_deref() != Some("resume") {
            return;
        }
        let own = self.cfg.identity.peer_url(self.cfg.identity.ordinal);
        let Some((via, members)) = self.members_from_peers().await else {
            return;
        };
        let Some(me) = members.iter().find(|m| m.peer_urls.contains(&own)) else {
            return;
        };
        if me.is_learner {
            let id = me.id;
            self.promote_via(&via, id, "before it serves clients").await;
        }
    }

    /// Asks the member at `url` to promote learner `id`, and logs what came of it.
    /// Returns whether the member is a voter now.
    async fn promote_via(&mut self, url: &str, id: u64, when: &str) -> bool {
        let Some(voter) = self.remote(url).await else {
            return false;
        };
        match voter.promote(id).await {
            Ok(()) => {
                tracing::info!(member_id = %format!("{id:x}"), via = url, when, "learner promoted to voter");
                self.tx.send_modify(|s| s.promotions += 1);
                true
            }
            Err(EtcdError::LearnerNotReady { .. }) => {
                tracing::debug!("etcd says the learner is not in sync yet; retrying");
                false
            }
            Err(EtcdError::AlreadyVoter { .. }) => {
                tracing::info!("already a voter");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "promotion failed; retrying");
                false
            }
        }
    }

    /// The member list as the first other pod that answers has it, with that pod's URL.
    async fn members_from_peers(&mut self) -> Option<(String, Vec<MemberInfo>)> {
        let id = self.cfg.identity.clone();
        let top = self.cfg.replicas.max(id.ordinal + 1) + 2;
        for o in (0..top).filter(|o| *o != id.ordinal) {
            let url = id.client_url(o);
            if let Some(peer) = self.remote(&url).await {
                match peer.members().await {
                    Ok((_, members)) => return Some((url, members)),
                    Err(e) => tracing::debug!(peer = o, error = %e, "member list from peer failed"),
                }
            }
        }
        None
    }

    async fn leader_status(
        &mut self,
        leader: u64,
        members: Option<&[MemberInfo]>,
    ) -> Option<MemberStatus> {
        let url = members?
            .iter()
            .find(|m| m.id == leader)?
            .client_urls
            .first()?
            .clone();
        self.remote(&url).await?.status().await.ok()
    }

    /// Returns whether this member was promoted.
    async fn try_promote(
        &mut self,
        status: &MemberStatus,
        leader_index: Option<u64>,
        members: Option<&[MemberInfo]>,
    ) -> bool {
        let step = next_step(status, leader_index);
        tracing::debug!(?step, leader = %format!("{:x}", status.leader), members = members.map(<[MemberInfo]>::len), "learner step");
        match step {
            Step::Promote { id } => {
                // A learner cannot promote itself: the request goes to the leader (a voter).
                let leader_url = members
                    .and_then(|ms| ms.iter().find(|m| m.id == status.leader))
                    .and_then(|m| m.client_urls.first())
                    .cloned();
                let Some(url) = leader_url else { return false };
                self.promote_via(&url, id, "caught up with the leader")
                    .await
            }
            Step::CatchingUp {
                index,
                leader_index,
            } => {
                tracing::debug!(index, leader_index, "learner catching up");
                false
            }
            Step::NoLeader | Step::Voter => false,
        }
    }

    async fn remove_stalled_learners(
        &mut self,
        status: &MemberStatus,
        members: Option<&[MemberInfo]>,
    ) {
        let Some(members) = members else { return };
        let mut learners = Vec::new();
        for m in members.iter().filter(|m| m.is_learner) {
            let index = match m.client_urls.first() {
                Some(url) => match self.remote(url).await {
                    Some(c) => c.status().await.ok().map(|s| s.raft_index),
                    None => None,
                },
                None => None,
            };
            learners.push((m.id, index));
        }
        let stalled = self.tracker.observe(
            Instant::now(),
            &learners,
            status.raft_index,
            self.cfg.learner_stall_timeout,
        );
        for id in stalled {
            let Ok(local) = self.local().await else {
                return;
            };
            match local.remove(id).await {
                Ok(()) => {
                    tracing::warn!(member_id = %format!("{id:x}"), timeout = ?self.cfg.learner_stall_timeout, "removed a learner that did not start or stopped progressing, so it cannot block the next join");
                    self.tx.send_modify(|s| s.learners_removed += 1);
                }
                Err(e) => {
                    tracing::warn!(member_id = %format!("{id:x}"), error = %e, "could not remove stalled learner; retrying")
                }
            }
        }
    }
}
