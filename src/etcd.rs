//! A narrow view of etcd: one connection to one member, with the few calls the agent
//! needs, and errors sorted by what the caller should do about them.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, MemberAddOptions};
use thiserror::Error;

pub use crate::facts::{MemberInfo, MemberStatus};

/// What went wrong talking to etcd, sorted by what to do next.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EtcdError {
    #[error("etcd at {endpoint} is unreachable: {detail}")]
    Unreachable { endpoint: String, detail: String },
    /// It took the request but did not answer in time: commonly a quorum operation on a
    /// member without quorum (or an overloaded member), not a network fault.
    #[error("etcd at {endpoint} did not answer in time (no quorum, or overloaded): {detail}")]
    TimedOut { endpoint: String, detail: String },
    #[error("learner {id:x} is not in sync with the leader yet")]
    LearnerNotReady { id: u64 },
    #[error("another learner is already joining (etcd allows one at a time)")]
    TooManyLearners,
    #[error("etcd refuses membership changes until every voter has been connected for a while (unhealthy cluster)")]
    UnhealthyCluster,
    #[error("the peer URL is already a member")]
    PeerUrlExists,
    #[error("member {id:x} is not in the cluster")]
    MemberNotFound { id: u64 },
    #[error("member {id:x} is already a voter")]
    AlreadyVoter { id: u64 },
    #[error("no leader")]
    NoLeader,
    /// etcd answered, but refused the request for want of credentials or permission.
    #[error("etcd at {endpoint} refused the request: {detail} (check --auth-username and the user's role)")]
    Unauthorized { endpoint: String, detail: String },
    #[error("etcd at {endpoint}: {detail}")]
    Other { endpoint: String, detail: String },
}

/// The alarms the agent disarms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alarm {
    /// The database reached its quota: etcd refuses writes.
    Nospace,
    /// etcd's own corruption check found members' data differ: it refuses reads and writes.
    Corrupt,
}

impl Alarm {
    /// How etcd names it in a member's status errors (`alarm:NOSPACE`).
    pub fn word(self) -> &'static str {
        match self {
            Alarm::Nospace => "NOSPACE",
            Alarm::Corrupt => "CORRUPT",
        }
    }
}

/// The calls the agent makes to one member.
pub trait Etcd: Send + Sync {
    fn endpoint(&self) -> &str;
    fn status(&self) -> impl Future<Output = Result<MemberStatus, EtcdError>> + Send;
    /// Members and the cluster ID, as this member has applied them.
    fn members(&self) -> impl Future<Output = Result<(u64, Vec<MemberInfo>), EtcdError>> + Send;
    /// A quorum read through this member: succeeds only with a live leader and quorum, and
    /// brings the member's applied state up to the leader's commit index.
    fn linearizable_read(&self) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// A read this member answers alone, without quorum.
    fn serializable_read(&self) -> impl Future<Output = Result<(), EtcdError>> + Send;
    fn add_learner(
        &self,
        peer_url: &str,
    ) -> impl Future<Output = Result<MemberInfo, EtcdError>> + Send;
    fn remove(&self, id: u64) -> impl Future<Output = Result<(), EtcdError>> + Send;
    fn promote(&self, id: u64) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// Replaces member `id`'s peer URLs (MemberUpdate): the member keeps its ID and data.
    fn update_peer_urls(
        &self,
        id: u64,
        urls: &[String],
    ) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// Defragments this member's backend (it serves no request meanwhile; no time-out).
    fn defragment(&self) -> impl Future<Output = Result<(), EtcdError>> + Send;
    /// `HashKV` at `revision`: the hash of the keyspace up to it and the compacted revision
    /// it starts from. A large database takes seconds to hash: asked on a connection of its
    /// own, bounded by [`HASH_TIMEOUT`].
    fn hash_kv(&self, revision: i64) -> impl Future<Output = Result<(u32, i64), EtcdError>> + Send;
    /// Deactivates every `alarm` in the cluster; returns how many there were.
    fn disarm(&self, alarm: Alarm) -> impl Future<Output = Result<usize, EtcdError>> + Send;
    /// Puts `key` = `value` on a new lease of `ttl_secs` unless `key` exists: the lease ID
    /// when taken, `None` when another holds it.
    fn try_lock(
        &self,
        key: &str,
        value: &str,
        ttl_secs: i64,
    ) -> impl Future<Output = Result<Option<i64>, EtcdError>> + Send;
    /// Revokes `lease`, which deletes the key it holds.
    fn unlock(&self, lease: i64) -> impl Future<Output = Result<(), EtcdError>> + Send;
}

/// How long a defragmentation may take before it counts as failed (etcd goes on with it).
pub const DEFRAG_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a `HashKV` may take before the member counts as not answering.
pub const HASH_TIMEOUT: Duration = Duration::from_secs(120);

/// Opens connections to members by address.
pub trait Connector: Send + Sync {
    type Member: Etcd;
    /// A client for the member at `ip:port`; `host` is its DNS name (for TLS and logs).
    fn connect(
        &self,
        host: &str,
        ip: IpAddr,
        port: u16,
    ) -> impl Future<Output = Result<Self::Member, EtcdError>> + Send;

    /// Whether the member at `ip:port` has etcd's authentication on: asked with no
    /// credentials (a serializable read it refuses, "user name is empty", only when auth is
    /// on). `None` when it did not say either way. Asked only before an upgrade path etcd
    /// calls unsafe with auth on (see `decision::upgrade`).
    fn auth_enabled(
        &self,
        host: &str,
        ip: IpAddr,
        port: u16,
    ) -> impl Future<Output = Option<bool>> + Send {
        let _ = (host, ip, port);
        async { None }
    }

    /// Changes whenever the TLS material new connections are opened with changed (its files
    /// rotated): a holder of connections reopens them, since an open channel would reconnect
    /// with the material it was opened with. Looks at the files.
    fn tls_version(&self) -> u64 {
        0
    }
}

/// Time-outs for the calls made to etcd.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub request: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_millis(700),
            request: Duration::from_millis(1500),
        }
    }
}

/// The etcd-client implementation.
#[derive(Debug, Clone, Default)]
pub struct EtcdClientConnector {
    pub timeouts: Timeouts,
    /// Client TLS: connect over https, verify the member's DNS name, present our cert (as
    /// the files hold it when the connection is opened).
    pub tls: Option<crate::tls::TlsMaterial>,
    /// etcd credentials, when etcd's authentication is enabled.
    pub auth: Option<Auth>,
}

impl EtcdClientConnector {
    pub fn new(access: &Access) -> Self {
        Self {
            timeouts: Timeouts::default(),
            tls: access.tls.clone(),
            auth: access.auth.clone(),
        }
    }
}

/// How the agent reaches etcd's client API (`--client-*-file`, `--etcd-username`…): the
/// settings every etcd connection of the agent is made with.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// Client TLS, when etcd serves its clients over https.
    pub tls: Option<crate::tls::TlsMaterial>,
    /// etcd credentials, when etcd's authentication is enabled.
    pub auth: Option<Auth>,
}

/// etcd credentials; `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
pub struct EtcdClientMember {
    client: Client,
    endpoint: String,
    /// How it was connected, for the defragmentation's own connection (no short time-out).
    url: String,
    options: ConnectOptions,
}

impl Connector for EtcdClientConnector {
    type Member = EtcdClientMember;

    fn tls_version(&self) -> u64 {
        self.tls
            .as_ref()
            .map_or(0, crate::tls::TlsMaterial::version)
    }

    async fn auth_enabled(&self, host: &str, ip: IpAddr, port: u16) -> Option<bool> {
        let addr = std::net::SocketAddr::new(ip, port);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{host}:{port}");
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.timeouts.connect)
            .with_timeout(self.timeouts.request);
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.etcd_client_tls(host));
        }
        let mut client = Client::connect([format!("{scheme}://{addr}")], Some(options))
            .await
            .ok()?;
        let read = GetOptions::new().with_serializable().with_keys_only();
        match client.get("/etcd-steward/auth-probe", Some(read)).await {
            Ok(_) => Some(false),
            Err(e) => match classify(&endpoint, e) {
                EtcdError::Unauthorized { .. } => Some(true),
                _ => None,
            },
        }
    }

    async fn connect(
        &self,
        host: &str,
        ip: IpAddr,
        port: u16,
    ) -> Result<EtcdClientMember, EtcdError> {
        let addr = std::net::SocketAddr::new(ip, port);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");
        let endpoint = format!("{host}:{port}");
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.timeouts.connect)
            .with_timeout(self.timeouts.request);
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.etcd_client_tls(host));
        }
        if let Some(auth) = &self.auth {
            options = options
                .with_user(auth.username.clone(), auth.password.clone())
                .with_auto_token_refresh(true);
        }
        let client = match Client::connect([url.clone()], Some(options.clone())).await {
            Ok(client) => client,
            // A learner refuses to authenticate anyone; it serves Status without a token.
            Err(e)
                if self.auth.is_some() && e.to_string().contains("not supported for learner") =>
            {
                let options = ConnectOptions::new()
                    .with_connect_timeout(self.timeouts.connect)
                    .with_timeout(self.timeouts.request);
                let options = match &self.tls {
                    Some(tls) => options.with_tls(tls.etcd_client_tls(host)),
                    None => options,
                };
                Client::connect([url.clone()], Some(options.clone()))
                    .await
                    .map_err(|e| classify(&endpoint, e))?
            }
            Err(e) => return Err(classify(&endpoint, e)),
        };
        Ok(EtcdClientMember {
            client,
            endpoint,
            url,
            options,
        })
    }
}

fn classify(endpoint: &str, e: etcd_client::Error) -> EtcdError {
    let detail = match &e {
        etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
        other => other.to_string(),
    };
    let unreachable = match &e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) && !detail.contains("leader")
        }
        _ => false,
    };
    let d = detail.to_ascii_lowercase();
    // A request-level time-out (the connection worked); connect time-outs stay "unreachable".
    let timed_out = matches!(&e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::DeadlineExceeded || s.code() == tonic::Code::Cancelled
            || d.contains("timeout expired"));
    if d.contains("too many learner") {
        EtcdError::TooManyLearners
    } else if d.contains("unhealthy cluster") {
        EtcdError::UnhealthyCluster
    } else if d.contains("peer urls already exists") || d.contains("peerurl exists") {
        EtcdError::PeerUrlExists
    } else if d.contains("member not found") {
        EtcdError::MemberNotFound { id: 0 }
    } else if d.contains("in sync with leader") {
        EtcdError::LearnerNotReady { id: 0 }
    } else if d.contains("can only promote a learner member") {
        EtcdError::AlreadyVoter { id: 0 }
    } else if d.contains("no leader") {
        EtcdError::NoLeader
    } else if d.contains("user name is empty")
        || d.contains("permission denied")
        || d.contains("invalid auth token")
        || d.contains("authentication failed")
    {
        EtcdError::Unauthorized {
            endpoint: endpoint.to_string(),
            detail,
        }
    } else if timed_out {
        EtcdError::TimedOut {
            endpoint: endpoint.to_string(),
            detail,
        }
    } else if unreachable {
        EtcdError::Unreachable {
            endpoint: endpoint.to_string(),
            detail,
        }
    } else {
        EtcdError::Other {
            endpoint: endpoint.to_string(),
            detail,
        }
    }
}

fn with_id(e: EtcdError, id: u64) -> EtcdError {
    match e {
        EtcdError::MemberNotFound { .. } => EtcdError::MemberNotFound { id },
        EtcdError::LearnerNotReady { .. } => EtcdError::LearnerNotReady { id },
        EtcdError::AlreadyVoter { .. } => EtcdError::AlreadyVoter { id },
        other => other,
    }
}

fn member_info(m: &etcd_client::Member) -> MemberInfo {
    MemberInfo {
        id: m.id(),
        name: m.name().to_string(),
        peer_urls: m.peer_urls().to_vec(),
        client_urls: m.client_urls().to_vec(),
        is_learner: m.is_learner(),
    }
}

/// Reads this key; it need not exist, a read of a missing key still proves the path.
const PROBE_KEY: &str = "/etcd-steward/probe";

impl Etcd for EtcdClientMember {
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn status(&self) -> Result<MemberStatus, EtcdError> {
        let s = self
            .client
            .clone()
            .status()
            .await
            .map_err(|e| classify(&self.endpoint, e))?;
        let header = s.header();
        Ok(MemberStatus {
            member_id: header.map(|h| h.member_id()).unwrap_or_default(),
            cluster_id: header.map(|h| h.cluster_id()).unwrap_or_default(),
            leader: s.leader(),
            raft_index: s.raft_index(),
            raft_term: s.raft_term(),
            is_learner: s.is_learner(),
            errors: s.errors().to_vec(),
            db_size: s.db_size(),
            db_size_in_use: s.raft_used_db_size(),
            version: s.version().to_string(),
            revision: header.map(|h| h.revision()).unwrap_or_default(),
        })
    }

    async fn members(&self) -> Result<(u64, Vec<MemberInfo>), EtcdError> {
        let r = self
            .client
            .clone()
            .member_list()
            .await
            .map_err(|e| classify(&self.endpoint, e))?;
        let cluster_id = r.header().map(|h| h.cluster_id()).unwrap_or_default();
        Ok((cluster_id, r.members().iter().map(member_info).collect()))
    }

    async fn linearizable_read(&self) -> Result<(), EtcdError> {
        let opts = GetOptions::new().with_keys_only().with_limit(1);
        self.client
            .clone()
            .get(PROBE_KEY, Some(opts))
            .await
            .map(drop)
            .map_err(|e| classify(&self.endpoint, e))
    }

    async fn serializable_read(&self) -> Result<(), EtcdError> {
        let opts = GetOptions::new()
            .with_serializable()
            .with_keys_only()
            .with_limit(1);
        self.client
            .clone()
            .get(PROBE_KEY, Some(opts))
            .await
            .map(drop)
            .map_err(|e| classify(&self.endpoint, e))
    }

    async fn add_learner(&self, peer_url: &str) -> Result<MemberInfo, EtcdError> {
        let r = self
            .client
            .clone()
            .member_add([peer_url], Some(MemberAddOptions::new().with_is_learner()))
            .await
            .map_err(|e| classify(&self.endpoint, e))?;
        r.member().map(member_info).ok_or_else(|| EtcdError::Other {
            endpoint: self.endpoint.clone(),
            detail: "member add answered without the new member".into(),
        })
    }

    async fn remove(&self, id: u64) -> Result<(), EtcdError> {
        self.client
            .clone()
            .member_remove(id)
            .await
            .map(drop)
            .map_err(|e| with_id(classify(&self.endpoint, e), id))
    }

    async fn promote(&self, id: u64) -> Result<(), EtcdError> {
        self.client
            .clone()
            .member_promote(id)
            .await
            .map(drop)
            .map_err(|e| with_id(classify(&self.endpoint, e), id))
    }

    async fn update_peer_urls(&self, id: u64, urls: &[String]) -> Result<(), EtcdError> {
        self.client
            .clone()
            .member_update(id, urls.to_vec())
            .await
            .map(drop)
            .map_err(|e| with_id(classify(&self.endpoint, e), id))
    }

    async fn defragment(&self) -> Result<(), EtcdError> {
        let options = self.options.clone().with_timeout(DEFRAG_TIMEOUT);
        let mut client = Client::connect([self.url.clone()], Some(options))
            .await
            .map_err(|e| classify(&self.endpoint, e))?;
        client
            .defragment()
            .await
            .map(drop)
            .map_err(|e| classify(&self.endpoint, e))
    }

    async fn hash_kv(&self, revision: i64) -> Result<(u32, i64), EtcdError> {
        let options = self.options.clone().with_timeout(HASH_TIMEOUT);
        let mut client = Client::connect([self.url.clone()], Some(options))
            .await
            .map_err(|e| classify(&self.endpoint, e))?;
        let r = client
            .hash_kv(revision)
            .await
            .map_err(|e| classify(&self.endpoint, e))?;
        Ok((r.hash(), r.compact_version()))
    }

    async fn disarm(&self, alarm: Alarm) -> Result<usize, EtcdError> {
        use etcd_client::{AlarmAction, AlarmOptions, AlarmType};
        let kind = match alarm {
            Alarm::Nospace => AlarmType::Nospace,
            Alarm::Corrupt => AlarmType::Corrupt,
        };
        let mut client = self.client.clone();
        let listed = client
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .map_err(|e| classify(&self.endpoint, e))?;
        let mut disarmed = 0;
        for a in listed.alarms() {
            if a.alarm() != kind {
                continue;
            }
            let mut options = AlarmOptions::new();
            options.with_member(a.member_id());
            client
                .alarm(AlarmAction::Deactivate, kind, Some(options))
                .await
                .map_err(|e| classify(&self.endpoint, e))?;
            disarmed += 1;
        }
        Ok(disarmed)
    }

    async fn try_lock(
        &self,
        key: &str,
        value: &str,
        ttl_secs: i64,
    ) -> Result<Option<i64>, EtcdError> {
        use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
        let mut client = self.client.clone();
        let lease = client
            .lease_grant(ttl_secs, None)
            .await
            .map_err(|e| classify(&self.endpoint, e))?
            .id();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let taken = client
            .txn(txn)
            .await
            .map_err(|e| classify(&self.endpoint, e))?
            .succeeded();
        if taken {
            return Ok(Some(lease));
        }
        let _ = client.lease_revoke(lease).await;
        Ok(None)
    }

    async fn unlock(&self, lease: i64) -> Result<(), EtcdError> {
        self.client
            .clone()
            .lease_revoke(lease)
            .await
            .map(drop)
            .map_err(|e| classify(&self.endpoint, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(code: tonic::Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
    }

    /// etcd's own messages (server/etcdserver/api/v3rpc/rpctypes) and the transport's
    /// failures, each sorted into the variant the callers act on.
    #[test]
    fn etcd_errors_are_sorted_by_what_to_do_next() {
        use tonic::Code::*;
        let ep = "etcd-0:2379";
        let other = |detail: &str| EtcdError::Other {
            endpoint: ep.into(),
            detail: detail.into(),
        };
        let table: Vec<(etcd_client::Error, EtcdError)> = vec![
            (
                grpc(
                    FailedPrecondition,
                    "etcdserver: too many learner members in cluster",
                ),
                EtcdError::TooManyLearners,
            ),
            (
                grpc(Unavailable, "etcdserver: unhealthy cluster"),
                EtcdError::UnhealthyCluster,
            ),
            (
                grpc(FailedPrecondition, "etcdserver: Peer URLs already exists"),
                EtcdError::PeerUrlExists,
            ),
            (
                grpc(NotFound, "etcdserver: member not found"),
                EtcdError::MemberNotFound { id: 0 },
            ),
            (
                grpc(
                    FailedPrecondition,
                    "etcdserver: can only promote a learner member which is in sync with leader",
                ),
                EtcdError::LearnerNotReady { id: 0 },
            ),
            (
                grpc(
                    FailedPrecondition,
                    "etcdserver: can only promote a learner member",
                ),
                EtcdError::AlreadyVoter { id: 0 },
            ),
            (
                grpc(Unavailable, "etcdserver: no leader"),
                EtcdError::NoLeader,
            ),
            (
                grpc(InvalidArgument, "etcdserver: user name is empty"),
                EtcdError::Unauthorized {
                    endpoint: ep.into(),
                    detail: "etcdserver: user name is empty".into(),
                },
            ),
            (
                grpc(PermissionDenied, "etcdserver: permission denied"),
                EtcdError::Unauthorized {
                    endpoint: ep.into(),
                    detail: "etcdserver: permission denied".into(),
                },
            ),
            (
                grpc(DeadlineExceeded, "context deadline exceeded"),
                EtcdError::TimedOut {
                    endpoint: ep.into(),
                    detail: "context deadline exceeded".into(),
                },
            ),
            (
                grpc(
                    Unavailable,
                    "error trying to connect: tcp connect error: Connection refused",
                ),
                EtcdError::Unreachable {
                    endpoint: ep.into(),
                    detail: "error trying to connect: tcp connect error: Connection refused".into(),
                },
            ),
            (
                grpc(Unknown, "etcdserver: leader changed"),
                other("etcdserver: leader changed"),
            ),
            (
                grpc(Unavailable, "etcdserver: leader changed"),
                other("etcdserver: leader changed"),
            ),
        ];
        for (error, want) in table {
            let text = error.to_string();
            assert_eq!(classify(ep, error), want, "{text}");
        }
    }

    #[test]
    fn the_member_id_is_filled_in_where_the_error_names_one() {
        assert_eq!(
            with_id(EtcdError::LearnerNotReady { id: 0 }, 7),
            EtcdError::LearnerNotReady { id: 7 }
        );
        assert_eq!(with_id(EtcdError::NoLeader, 7), EtcdError::NoLeader);
    }
}
