//! One observation per tick (its data is [`super::plan::observation`]): everything the
//! health verdict and the planners read, gathered here and nowhere else (the local member, the leader, the learners, the member list, the
//! init journal, the time). Calls to the local member are bounded, so a busy etcd costs a
//! round, never the loop.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::conn::Connections;
/// The plain data this module gathers, where the planners read it.
pub use super::plan::observation::{JournalView, LocalObservation, Observation, PeerApi};
use crate::dns::Dns;
use crate::etcd::{Connector, Etcd, EtcdError};
use crate::facts::{ActionKind, MemberInfo, MemberStatus};
use crate::http_client::{self, GetError};
use crate::volume::journal;

/// The local member's status and serializable read are answered from its memory: when
/// they take longer than this, etcd is busy (applying a log it was sent, or hung), and
/// the loop moves on rather than stall.
pub const LOCAL_TIMEOUT: Duration = Duration::from_millis(500);
const PEER_API_TIMEOUT: Duration = Duration::from_millis(800);

/// Asks whether the local etcd's peer API answers, for when its client API does not.
pub trait PeerProbe: Send + Sync {
    fn peer_api(&self) -> impl Future<Output = PeerApi> + Send;
}

/// The real probe: GET `/version` on the local etcd's peer port.
pub struct HttpPeerProbe {
    /// This pod.
    pub identity: crate::identity::Identity,
    /// Where this pod's etcd listens for its peers.
    pub ip: std::net::IpAddr,
    /// The peer TLS etcd's peer port requires, if any.
    pub peer_tls: Option<crate::tls::TlsMaterial>,
}

impl PeerProbe for HttpPeerProbe {
    async fn peer_api(&self) -> PeerApi {
        match http_client::etcd_peer_version(
            &self.identity,
            self.peer_tls.as_ref(),
            self.identity.ordinal,
            self.ip,
            PEER_API_TIMEOUT,
        )
        .await
        {
            Ok(()) => PeerApi::Answered,
            Err(GetError::Refused(_)) => PeerApi::NotListening,
            Err(GetError::Failed(e)) => PeerApi::NoAnswer(e),
        }
    }
}

/// Reads the init journal again only when its size or modification time changed.
#[derive(Debug)]
pub struct Journal {
    data_dir: PathBuf,
    path: PathBuf,
    signature: Option<(u64, Option<SystemTime>)>,
    view: JournalView,
    /// The error last said of a journal that cannot be read.
    unreadable: Option<String>,
}

impl Journal {
    pub fn new(data_dir: &Path) -> Self {
        Journal {
            data_dir: data_dir.to_path_buf(),
            path: journal::path(data_dir),
            signature: None,
            view: JournalView::default(),
            unreadable: None,
        }
    }

    /// The data directory the journal lives in.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn read(&mut self) -> &JournalView {
        let signature = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.len(), m.modified().ok()));
        if signature != self.signature {
            // A journal that cannot be read keeps the view last read (its counts are not
            // counted again, nor reset) and is read again next tick; it is said once.
            let entries = match journal::read(&self.data_dir) {
                Ok(entries) => entries,
                Err(e) => {
                    let said = e.to_string();
                    if self.unreadable.as_deref() != Some(said.as_str()) {
                        tracing::warn!(error = %said, "the decision journal cannot be read: init's counts and last act are kept as last read until it is repaired or moved away");
                        self.unreadable = Some(said);
                    }
                    return &self.view;
                }
            };
            self.unreadable = None;
            let mut counts = BTreeMap::new();
            for e in &entries {
                *counts.entry(e.action).or_insert(0) += 1;
            }
            self.view = JournalView {
                last: entries.last().map(|e| e.action),
                last_ts: entries.last().map(|e| e.ts),
                counts,
            };
            self.signature = signature;
        }
        &self.view
    }
}

/// `call`, or a time-out error once `limit` has passed.
async fn bounded<T>(
    limit: Duration,
    endpoint: &str,
    call: impl Future<Output = Result<T, EtcdError>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(EtcdError::TimedOut {
            endpoint: endpoint.to_string(),
            detail: format!("no answer within {limit:?}"),
        }),
    }
}

/// Takes one observation.
pub async fn observe<D: Dns, C: Connector>(
    conn: &mut Connections<D, C>,
    probe: &impl PeerProbe,
    journal: &mut Journal,
    own_peer_url: &str,
) -> Observation {
    let now = Instant::now();
    let journal = journal.read().clone();
    let (serializable, status, members) = local_member(conn).await;
    // A learner may be refused the member list, or hold a stale one: ask the voters.
    let members = match &status {
        Ok(s) if s.is_learner => match conn.members_from_peers().await {
            Some((_, m)) => Some(m),
            None => members,
        },
        _ => members,
    };
    let peer_api = match serializable {
        Ok(()) => None,
        Err(_) => Some(probe.peer_api().await),
    };
    let mut linearizable = None;
    let mut leader_index = None;
    let mut learners = Vec::new();
    if let Ok(s) = &status {
        if !s.is_learner && s.leader != 0 {
            if let Ok(local) = conn.local().await {
                let read = local.linearizable_read().await;
                // Opened without a token while a learner: reopen with credentials.
                if matches!(read, Err(EtcdError::Unauthorized { .. })) {
                    conn.forget_local();
                }
                linearizable = Some(read.map_err(|e| e.to_string()));
            }
        }
        if s.leader != 0 && s.leader != s.member_id {
            leader_index = member_status(conn, s.leader, members.as_deref())
                .await
                .map(|l| l.raft_index);
        }
        if s.leader != 0 && s.leader == s.member_id {
            learners = learner_progress(conn, members.as_deref()).await;
        }
    }
    // Etcd up but not serving, after init let it join: a voter may promote it already.
    let joining = if status.is_err()
        && peer_api == Some(PeerApi::Answered)
        && journal.last == Some(ActionKind::Resume)
    {
        conn.members_from_peers().await
    } else {
        None
    };
    // Only when the local member list itself names this member at another peer URL:
    // a leaderless tick (a quorum loss) does not go asking every peer.
    let listed_elsewhere = |s: &MemberStatus| {
        members.as_deref().is_some_and(|ms| {
            ms.iter()
                .any(|m| m.id == s.member_id && !m.peer_urls.iter().any(|u| u == own_peer_url))
        })
    };
    let cluster_members = match &status {
        Ok(s) if !s.is_learner && s.leader == 0 && listed_elsewhere(s) => {
            conn.members_from_peers().await
        }
        _ => None,
    };
    Observation {
        now,
        unix: crate::clock::unix_now(),
        local: LocalObservation {
            serializable,
            peer_api,
            status: status.map_err(|e| e.to_string()),
            linearizable,
            leader_index,
        },
        members,
        own_peer_url: own_peer_url.to_string(),
        learners,
        joining,
        cluster_members,
        journal,
        previous: Vec::new(),
        backup_rounds: Vec::new(),
        archive_rounds: Vec::new(),
        hash_checks: Vec::new(),
        peers: Vec::new(),
        scale_in: Default::default(),
        recovery_looks: Vec::new(),
        diverged: false,
        certificates_due: None,
    }
}

/// Every other member's status, each asked through its first client URL (those that do
/// not answer are left out).
pub async fn peer_statuses<D: Dns, C: Connector>(
    conn: &mut Connections<D, C>,
    me: u64,
    members: Option<&[MemberInfo]>,
) -> Vec<MemberStatus> {
    let mut out = Vec::new();
    // Learners are not asked: their sizes do not count, and the leader asked them already.
    let voters = members.unwrap_or_default().iter();
    for m in voters.filter(|m| m.id != me && !m.is_learner) {
        let ask = member_status(conn, m.id, Some(std::slice::from_ref(m)));
        if let Ok(Some(s)) = tokio::time::timeout(PEER_API_TIMEOUT, ask).await {
            out.push(s);
        }
    }
    out
}

type LocalAnswers = (
    Result<(), String>,
    Result<MemberStatus, EtcdError>,
    Option<Vec<MemberInfo>>,
);

/// The local member's serializable read, status and (when it has a status) member list.
async fn local_member<D: Dns, C: Connector>(conn: &mut Connections<D, C>) -> LocalAnswers {
    let local = match conn.local().await {
        Ok(local) => local,
        Err(e) => return (Err(e.to_string()), Err(e), None),
    };
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
    (ser.map_err(|e| e.to_string()), st, members)
}

/// The status of member `id`, asked of that member through its first client URL.
async fn member_status<D: Dns, C: Connector>(
    conn: &mut Connections<D, C>,
    id: u64,
    members: Option<&[MemberInfo]>,
) -> Option<MemberStatus> {
    let url = members?
        .iter()
        .find(|m| m.id == id)?
        .client_urls
        .first()?
        .clone();
    conn.remote(&url).await?.status().await.ok()
}

/// Every learner in `members`, with its raft index if it answered.
async fn learner_progress<D: Dns, C: Connector>(
    conn: &mut Connections<D, C>,
    members: Option<&[MemberInfo]>,
) -> Vec<(u64, Option<u64>)> {
    let mut learners = Vec::new();
    for m in members.unwrap_or_default().iter().filter(|m| m.is_learner) {
        let index = member_status(conn, m.id, Some(std::slice::from_ref(m)))
            .await
            .map(|s| s.raft_index);
        learners.push((m.id, index));
    }
    learners
}
