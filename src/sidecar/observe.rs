//! One observation per tick: everything the health verdict and the planners read, gathered
//! here and nowhere else (the local member, the leader, the learners, the member list, the
//! init journal, the time). Calls to the local member are bounded, so a busy etcd costs a
//! round, never the loop.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::conn::Connections;
use super::health::{LocalObservation, PeerApi};
use super::plan::backup::RoundEnd;
use super::plan::Outcome;
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

/// What one tick saw. Plain data: the planners read it and nothing else.
#[derive(Debug, Clone)]
pub struct Observation {
    /// When the observation was taken (the planners' clock for waits and ages).
    pub now: Instant,
    /// The same moment in unix seconds: what every sidecar shares, so `--defrag-schedule`'s
    /// periods line up across the cluster.
    pub unix: u64,
    /// The local member, as the health verdict reads it.
    pub local: LocalObservation,
    /// The member list: the local member's, or for a learner (which may be refused it, or
    /// hold a stale one) a voter's.
    pub members: Option<Vec<MemberInfo>>,
    /// This pod's peer URL, by which it finds itself in a member list (a member that has
    /// not started yet has no name).
    pub own_peer_url: String,
    /// When this member leads: every learner, with its raft index if it answered.
    pub learners: Vec<(u64, Option<u64>)>,
    /// When the local etcd runs but serves no client yet after `init` started it as a
    /// joining member: the member list as a voter has it, and that voter's client URL.
    pub joining: Option<(String, Vec<MemberInfo>)>,
    /// When the local member is a voter that sees no leader and its own member list names
    /// it at another peer URL: the member list as a peer has it, and that peer's client URL. A member whose entry still names an old peer URL
    /// (peer TLS switched on while the leader was away) hears from no leader until the
    /// entry is updated, which only the others can do.
    pub cluster_members: Option<(String, Vec<MemberInfo>)>,
    /// What `init` decided, from its journal on the volume.
    pub journal: JournalView,
    /// What the previous tick's steps came to, every planner's (filled in by the loop).
    pub previous: Vec<Outcome>,
    /// The backup rounds that ended since the last tick (filled in by the loop).
    pub backup_rounds: Vec<RoundEnd>,
    /// The other voters' status, asked only when the defragmentation planner needs them
    /// (filled in by the loop, see [`peer_statuses`]).
    pub peers: Vec<MemberStatus>,
    /// With `--scale-in`: the Kubernetes API's view and the voters' answers (filled in by
    /// the loop).
    pub scale_in: super::plan::scale_in::ScaleInSeen,
}

impl Observation {
    /// A member that answers with `status` and serves reads, seen at `now`, and nothing else
    /// seen yet (no member list, no learners, nothing from init's journal): where a planner's
    /// scenario starts, setting the fields it is about.
    pub fn serving(now: Instant, status: MemberStatus) -> Observation {
        Observation {
            now,
            unix: 0,
            local: LocalObservation {
                serializable: Ok(()),
                peer_api: None,
                status: Ok(status),
                linearizable: Some(Ok(())),
                leader_index: None,
            },
            members: None,
            own_peer_url: String::new(),
            learners: Vec::new(),
            joining: None,
            cluster_members: None,
            journal: JournalView::default(),
            previous: Vec::new(),
            backup_rounds: Vec::new(),
            peers: Vec::new(),
            scale_in: Default::default(),
        }
    }

    /// The cluster's word for this member, when this tick has it: the local member is a
    /// voter that sees a leader and served a quorum read, and its member list holds it at
    /// this pod's peer URL. `now` is the unix time to stamp it with.
    pub fn vouch(&self, now: u64) -> Option<crate::facts::Vouch> {
        let status = self.local.status.as_ref().ok()?;
        let served = matches!(self.local.linearizable, Some(Ok(())));
        if status.is_learner || status.leader == 0 || !served {
            return None;
        }
        let listed = self.members.as_deref()?.iter().any(|m| {
            m.id == status.member_id && !m.is_learner && m.peer_urls.contains(&self.own_peer_url)
        });
        listed.then(|| crate::facts::Vouch {
            member_id: status.member_id,
            cluster_id: status.cluster_id,
            peer_url: self.own_peer_url.clone(),
            ts: now,
        })
    }
}

/// The init journal (`member/steward/decisions.jsonl`) as last read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalView {
    /// The action of the last decision.
    pub last: Option<ActionKind>,
    /// When (unix seconds) init last acted: a waiting note older than this is stale.
    pub last_ts: Option<u64>,
    /// How many times each action was taken.
    pub counts: BTreeMap<ActionKind, u64>,
}

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
}

impl Journal {
    pub fn new(data_dir: &Path) -> Self {
        Journal {
            data_dir: data_dir.to_path_buf(),
            path: journal::path(data_dir),
            signature: None,
            view: JournalView::default(),
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
            let entries = journal::read(&self.data_dir);
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
        peers: Vec::new(),
        scale_in: Default::default(),
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
