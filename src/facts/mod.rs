//! The plain data every decision reads: what a data directory holds, what DNS answered, how
//! the cluster lists its members, what the peers reported. No I/O and no clock: the
//! modules that observe fill these in, the pure decisions (`decision`, the sidecar's
//! planners, the etcd command line) read them.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

mod backups;
pub mod hashes;
pub mod history;
pub mod rebuild;
pub use backups::*;

/// Member and cluster IDs as etcd prints them: lowercase hex.
pub mod hex_id {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{id:x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = String::deserialize(d)?;
        u64::from_str_radix(&text, 16).map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------
// The volume
// ---------------------------------------------------------------------------------------

/// Member and cluster ID read from a WAL's metadata record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalIdentity {
    #[serde(with = "hex_id")]
    pub member_id: u64,
    #[serde(with = "hex_id")]
    pub cluster_id: u64,
}

/// How far a volume's log goes, read from its WAL while etcd is not running (or racing it:
/// a torn tail is ignored): the evidence that says which surviving volume is freshest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalTail {
    /// The index and term of the last entry written (committed or not).
    pub last_index: u64,
    pub last_term: u64,
    /// The commit index of the newest hard state: etcd's raft writes a hard state whose
    /// only change is the commit index without an fsync, so after a SIGKILL it may lag the
    /// entries the cluster acknowledged.
    pub commit: u64,
    /// The term of the newest hard state.
    pub term: u64,
    /// Whether the last WAL file was read whole to its end (the preallocated zeros or the
    /// file's end), every record continuing its CRC chain: only then can a recovery move
    /// the commit index to the last entry and keep the whole log. `false` from a sidecar
    /// older than this field.
    #[serde(default)]
    pub clean_end: bool,
}

impl WalTail {
    /// Orders volumes by raft's up-to-date rule: the last entry's term, then its index
    /// (then the commit index, for a stable choice).
    pub fn freshness(&self) -> (u64, u64, u64) {
        (self.last_term, self.last_index, self.commit)
    }

    /// The entries after the commit index a recovery from this volume keeps: every one
    /// when the tail reads cleanly and no entry is newer than the hard state's term (the
    /// commit index is moved to the last entry before the forced start,
    /// `volume::wal::commit_patch`), none otherwise (`--force-new-cluster` discards them).
    pub fn keeps_beyond_commit(&self) -> u64 {
        if self.clean_end && self.last_term <= self.term {
            self.last_index.saturating_sub(self.commit)
        } else {
            0
        }
    }

    /// The entries after the commit index a recovery from this volume discards.
    pub fn discards_beyond_commit(&self) -> u64 {
        self.last_index
            .saturating_sub(self.commit)
            .saturating_sub(self.keeps_beyond_commit())
    }
}

/// The formation marker a pod writes before a new cluster is formed: its own random
/// nonce, the initial cluster it forms with, and, once it has decided to start etcd,
/// the cluster token derived from every initial pod's nonce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Formation {
    pub nonce: String,
    pub initial_cluster: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The backup the new cluster starts from (every initial pod restores the same one);
    /// `None`: it starts empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// A recovery from the freshest surviving volume, as an operator asked for it
/// (`etcd-steward recover --yes`) and carried to every pod's sidecar. It is a request, not
/// an order: the survivor acts only when its own observations lead to the same plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryRequest {
    pub id: String,
    /// The pod whose volume the cluster is recovered from.
    pub survivor: String,
    /// Pods the operator declared lost for good (`--force-lost`): their silence is not
    /// taken as "could hold fresher data".
    #[serde(default)]
    pub force_lost: Vec<String>,
    /// Unix seconds after which the request is ignored: a request never lingers to act on
    /// a later, different outage.
    pub expires_unix: u64,
}

/// An operator's `restore --snapshot NAME --yes`: the whole cluster goes back to that
/// snapshot, each pod setting its current data aside first (never deleting it). Held by
/// every sidecar until it expires; each pod acts on it once (its volume records the ID).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreRequest {
    pub id: String,
    pub snapshot: String,
    pub expires_unix: u64,
}

/// The survivor's record, written in its volume before etcd is started with
/// `--force-new-cluster`: the recovery's ID and the commit index the forced start begins
/// from (the WAL's last entry, once `init` moved the commit index there). Once
/// the WAL's commit index has moved past it, the forced start has happened and is never
/// repeated (a lone member without quorum cannot advance its commit index).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryMarker {
    pub id: String,
    pub commit: u64,
}

impl RecoveryMarker {
    /// Whether etcd has started from it (its commit index moved past the recorded one).
    pub fn applied(&self, tail: Option<&WalTail>) -> bool {
        tail.is_some_and(|t| t.commit > self.commit)
    }
}

/// Written by `etcd-steward leave` at the data directory's root (outside `member/`, so it
/// stays when the data goes aside): this pod left the cluster and does not rejoin until
/// `etcd-steward rejoin` (or its volume is replaced).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftMarker {
    /// Unix seconds.
    pub ts: u64,
    #[serde(with = "hex_id")]
    pub member_id: u64,
}

/// What the data directory holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataDirState {
    pub wal: WalState,
    /// How far the log goes; read only when a recovery needs it (it scans the last WAL).
    pub tail: Option<WalTail>,
    /// The recovery marker, when this volume was (or is being) recovered from.
    pub recovery: Option<RecoveryMarker>,
    /// The restore request this volume's data was set aside for (and re-formed from).
    pub restored_for: Option<String>,
    /// This pod left the cluster (`etcd-steward leave`).
    pub left: Option<LeftMarker>,
    /// Our formation marker, when a formation is (or was) under way for this volume.
    pub formation: Option<Formation>,
    /// Anomalies worth a line in the decision log (an unreadable marker, …).
    pub notes: Vec<String>,
    /// Snapshots this pod downloaded for a restore and could not use, with what was
    /// wanting (`member/steward/rejected-snapshots.json`).
    pub rejected_snapshots: Vec<Rejection>,
    /// The agent's own records that exist but could not be read or parsed (the leave,
    /// restore, formation and recovery markers, the rejected snapshots, the decision
    /// journal), each naming its file and the error: `init` waits, saying which.
    pub unreadable_markers: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WalState {
    /// No `*.wal` file: etcd would treat this directory as empty.
    #[default]
    None,
    /// A WAL exists: etcd has data here. Its identity, or why it could not be read.
    Present(Result<WalIdentity, String>),
}

impl DataDirState {
    /// An empty volume with no marker.
    pub fn empty() -> Self {
        Self {
            wal: WalState::None,
            tail: None,
            recovery: None,
            restored_for: None,
            left: None,
            formation: None,
            notes: vec![],
            rejected_snapshots: vec![],
            unreadable_markers: vec![],
        }
    }

    pub fn has_data(&self) -> bool {
        matches!(self.wal, WalState::Present(_))
    }

    pub fn wal_identity(&self) -> Option<WalIdentity> {
        match &self.wal {
            WalState::Present(Ok(id)) => Some(*id),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// DNS, the cluster, the peers
// ---------------------------------------------------------------------------------------

/// The answer for one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(Vec<IpAddr>),
    /// The name does not exist (yet): the pod is not published.
    NotFound,
    /// DNS could not answer (time-out, SERVFAIL, refused, …).
    Failed(String),
}

impl Lookup {
    pub fn first(&self) -> Option<IpAddr> {
        match self {
            Lookup::Found(ips) => ips.first().copied(),
            _ => None,
        }
    }
}

/// A member as the cluster lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberInfo {
    #[serde(with = "hex_id")]
    pub id: u64,
    /// Empty until the member has started and published itself.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

impl MemberInfo {
    /// A member that has never started has published no client URLs (its name, by
    /// contrast, is set from `--initial-cluster` for the members a cluster was formed
    /// with). etcd's own `isMemberBootstrapped` uses the same test.
    pub fn never_started(&self) -> bool {
        self.client_urls.is_empty()
    }
}

/// One member's own status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: u64,
    pub cluster_id: u64,
    /// 0 when the member sees no leader.
    pub leader: u64,
    pub raft_index: u64,
    pub raft_term: u64,
    pub is_learner: bool,
    /// Alarms and other errors the member reports (NOSPACE, CORRUPT, …).
    pub errors: Vec<String>,
    /// The backend database file's size, and the part of it in use (etcd 3.4+).
    pub db_size: i64,
    pub db_size_in_use: i64,
    /// The member's etcd version.
    pub version: String,
    /// The member's current key-value revision (the response header's).
    pub revision: i64,
}

/// What `GET /peer/report` answers: a pod's sidecar telling the others about its volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerReport {
    /// The reporting pod's name.
    pub name: String,
    /// The data directory holds a WAL: etcd's own meaning of "has data".
    pub has_data: bool,
    /// The WAL's member and cluster ID, when its metadata could be read.
    #[serde(default)]
    pub wal: Option<WalIdentity>,
    /// Why the WAL's metadata could not be read, when it could not.
    #[serde(default)]
    pub wal_error: Option<String>,
    /// The formation marker, when the pod has one.
    #[serde(default)]
    pub formation: Option<Formation>,
    /// How far the volume's log goes (absent without data, or from older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<WalTail>,
    /// The volume's recovery marker, when it was recovered from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryMarker>,
    /// A recovery an operator asked for, held by this pod's sidecar until it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_request: Option<RecoveryRequest>,
    /// A restore of the live cluster to a snapshot, held by this pod's sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_request: Option<RestoreRequest>,
    /// The restore request this volume was set aside and re-formed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_for: Option<String>,
    /// The last decision `init` acted on for this volume (its journal's last line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<LastDecision>,
    /// The last time this pod's sidecar saw the cluster list its member (see [`Vouch`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vouch: Option<Vouch>,
    /// What `init` waits for, while etcd does not answer here and the note is newer than
    /// init's last act (see [`Waiting::current`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Waiting>,
    /// The newest corruption check this pod's sidecar knows (its own as the leader's, or
    /// the leader's as it last read it): see [`hashes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_check: Option<hashes::HashCheck>,
    /// The rebuild of this pod's member (its data diverged from the majority's) that its
    /// sidecar holds: see [`rebuild`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild_request: Option<rebuild::RebuildRequest>,
}

/// What `init` is waiting for (`member/steward/waiting.json`): written when the reason
/// changes, removed when init goes on to act, shown by `/ready`, the peer report and
/// `status`. Not data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    /// Unix time, seconds, since when init waits for this reason.
    pub since: u64,
    /// A short machine name for the reason (the decision's reason variant, or
    /// `ActionNotDone` for an action that failed and is tried again).
    pub kind: String,
    /// The sentence init logs for it.
    pub reason: String,
}

impl Waiting {
    /// Whether the note still says what init is doing: it is newer than init's last act
    /// (`last_act`, its journal's last entry). A note left behind by an init that went on to
    /// start etcd (its removal failed, or an older etcd-steward) is older, and says nothing.
    pub fn current(&self, last_act: Option<u64>) -> bool {
        last_act.is_none_or(|ts| self.since > ts)
    }
}

/// One decision `init` acted on: when (unix seconds), what, and the sentence it logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastDecision {
    pub ts: u64,
    pub action: ActionKind,
    pub reason: String,
}

/// A member to send a membership change to: its DNS name and the address it answered at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub ip: IpAddr,
}

// ---------------------------------------------------------------------------------------
// One round of `init`
// ---------------------------------------------------------------------------------------

/// Everything `init` observed in one round.
#[derive(Debug, Clone)]
pub struct Facts {
    pub ordinal: u32,
    /// This pod's name (`etcd-1`): its member name.
    pub name: String,
    /// The pods' common name (`etcd`): pod `o` is `<set_name>-<o>`.
    pub set_name: String,
    /// This pod's stable DNS name, the host of its peer URL.
    pub host: String,
    pub peer_url: String,
    pub replicas: u32,
    /// `--initial-cluster` for the configured initial size.
    pub initial_cluster: String,
    pub data: DataDirState,
    pub own_dns: Lookup,
    pub cluster: ClusterFacts,
    /// The other pods of the set that were asked (initial peers, and higher ordinals
    /// whose names exist).
    pub peers: Vec<PeerFacts>,
    /// What the backup store offers, asked only when a new cluster may have to be formed.
    pub backups: BackupFacts,
    /// A random nonce, used if this round prepares a formation marker.
    pub fresh_nonce: String,
    /// A recovery an operator asked for, as a sidecar (a peer's or this pod's) holds it;
    /// one naming this pod first.
    pub recovery_request: Option<RecoveryRequest>,
    /// A restore of the live cluster to a snapshot, as a sidecar holds it.
    pub restore_request: Option<RestoreRequest>,
    /// The rebuild of this pod's member that its own sidecar holds (this member's data
    /// diverged from the majority's): never a peer's.
    pub rebuild_request: Option<rebuild::RebuildRequest>,
    /// The etcd release this pod would start, and the releases its peers run.
    pub versions: VersionFacts,
}

impl Facts {
    /// The pod name of ordinal `o` of this set.
    pub fn pod_name(&self, o: u32) -> String {
        format!("{}-{o}", self.set_name)
    }

    /// The cluster's word for this volume, when this round has it: a voter that sees a
    /// leader and serves a quorum read lists the WAL's member, in the WAL's cluster, at
    /// this pod's peer URL.
    pub fn vouch(&self, ts: u64) -> Option<Vouch> {
        let ClusterFacts::Healthy(view) = &self.cluster else {
            return None;
        };
        let wal = self.data.wal_identity()?;
        let listed = view
            .members
            .iter()
            .any(|m| m.id == wal.member_id && m.peer_urls.contains(&self.peer_url));
        (wal.cluster_id == view.cluster_id && listed).then(|| Vouch {
            member_id: wal.member_id,
            cluster_id: wal.cluster_id,
            peer_url: self.peer_url.clone(),
            ts,
        })
    }
}

/// A volume the cluster vouched for: its member, its cluster, the peer URL the member was
/// listed at, and when (unix seconds). `init` records one in its journal when it decides
/// on the cluster's answer; the sidecar keeps the last one it saw while etcd served (a
/// voter that sees a leader and serves a quorum read listing its own member) and reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vouch {
    #[serde(with = "hex_id")]
    pub member_id: u64,
    #[serde(with = "hex_id")]
    pub cluster_id: u64,
    pub peer_url: String,
    pub ts: u64,
}

/// An etcd release: `3.5.30`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EtcdVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl EtcdVersion {
    /// Parses `3.5.30` (or the first line of `etcd --version`: `etcd Version: 3.5.30`).
    pub fn parse(text: &str) -> Option<EtcdVersion> {
        let line = text.lines().find(|l| !l.trim().is_empty())?;
        let v = line.trim().rsplit(' ').next()?.trim_start_matches('v');
        let mut parts = v.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        // A pre-release or build suffix (3.6.0-rc.1) keeps its number.
        let patch: String = parts
            .next()?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Some(EtcdVersion {
            major,
            minor,
            patch: patch.parse().ok()?,
        })
    }
}

impl std::fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What a peer's etcd answered at `/version` on its peer port: its own release, and the
/// cluster version its cluster agreed on (`None` while not decided).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerVersion {
    pub name: String,
    pub server: EtcdVersion,
    pub cluster: Option<EtcdVersion>,
}

/// The releases an upgrade decision reads. Unknown is not a reason to wait: a binary whose
/// version could not be read, or peers that did not answer, hold nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionFacts {
    /// `etcd --version` of the binary this pod starts, or why it could not be read.
    pub binary: Option<EtcdVersion>,
    /// The peers whose etcd answered this round.
    pub peers: Vec<PeerVersion>,
    /// Whether a peer still on etcd 3.4 has authentication on, asked (without credentials)
    /// only when this binary is 3.5 or newer; `None` when not asked or it did not say.
    pub auth_on_3_4: Option<bool>,
    /// With backups, asked only when this binary would be the first of a newer minor release:
    /// the age in seconds of the store's newest verified snapshot (`Ok(None)`: none).
    pub snapshot_age: Option<Result<Option<u64>, String>>,
}

#[derive(Debug, Clone)]
pub enum ClusterFacts {
    /// A voter that sees a leader answered and a linearizable read through it succeeded,
    /// so its member list is current.
    Healthy(ClusterView),
    /// No member could give a current view; why, per endpoint tried.
    NotReached { tried: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// The member that answered (membership changes go there).
    pub source: Endpoint,
    pub cluster_id: u64,
    pub leader: u64,
    pub members: Vec<MemberInfo>,
}

#[derive(Debug, Clone)]
pub struct PeerFacts {
    pub ordinal: u32,
    pub name: String,
    pub dns: Lookup,
    /// The sidecar's report; `None` when it was not asked (name not resolved).
    pub report: Option<Result<PeerReport, String>>,
}

/// The kinds of action `init` takes, as logs, metrics and the journal name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionKind {
    Restart,
    Bootstrap,
    Join,
    Resume,
    Replace,
    SetAside,
    Wait,
    Recover,
    UpdatePeerUrls,
    Snapshot,
}

impl ActionKind {
    pub const ALL: [ActionKind; 10] = [
        ActionKind::Restart,
        ActionKind::Bootstrap,
        ActionKind::Join,
        ActionKind::Resume,
        ActionKind::Replace,
        ActionKind::SetAside,
        ActionKind::Wait,
        ActionKind::Recover,
        ActionKind::UpdatePeerUrls,
        ActionKind::Snapshot,
    ];

    /// The name users see in logs, metrics and `init --dry-run`.
    pub fn name(self) -> &'static str {
        match self {
            ActionKind::Restart => "restart",
            ActionKind::Bootstrap => "bootstrap",
            ActionKind::Join => "join",
            ActionKind::Resume => "resume",
            ActionKind::Replace => "replace",
            ActionKind::SetAside => "set-aside",
            ActionKind::Wait => "wait",
            ActionKind::Recover => "recover",
            ActionKind::UpdatePeerUrls => "update-peer-urls",
            ActionKind::Snapshot => "snapshot",
        }
    }
}

impl std::str::FromStr for ActionKind {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        ActionKind::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| format!("no action is named {name:?}"))
    }
}

impl std::fmt::Display for ActionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
