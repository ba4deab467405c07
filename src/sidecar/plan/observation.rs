//! The planners' plain data, in and out. In: what one tick saw ([`Observation`]); the
//! health verdict and every planner read it and nothing else; the observer
//! (`sidecar::gather`) and the loop fill it in. Out: the [`Step`]s planners intend, with
//! their reasons, and the [`Outcome`] the executor reports back. Nothing here does I/O or
//! reads a clock.

use std::collections::{BTreeMap, BTreeSet};

use std::fmt;

use tokio::time::Instant;

use crate::facts::hashes::HashCheck;
use crate::facts::rebuild::RebuildRequest;
use crate::facts::{ActionKind, MemberInfo, MemberStatus, Vouch};
use crate::units::Bytes;

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
    /// The archive rounds that ended since the last tick (filled in by the loop).
    pub archive_rounds: Vec<ArchiveEnd>,
    /// The corruption checks this sidecar started that ended since the last tick (filled
    /// in by the loop).
    pub hash_checks: Vec<HashCheck>,
    /// The other voters' status, asked only when the defragmentation planner needs them
    /// (filled in by the loop, see `sidecar::gather::peer_statuses`).
    pub peers: Vec<MemberStatus>,
    /// With `--scale-in`: the Kubernetes API's view and the voters' answers (filled in by
    /// the loop).
    pub scale_in: ScaleInSeen,
    /// With `--auto-recover-after`: the looks for a proof of loss taken since the last tick,
    /// in order (filled in by the loop).
    pub recovery_looks: Vec<LossLook>,
    /// The newest corruption check that judged this member found its data diverged from
    /// the majority's (filled in by the loop): no snapshot is taken through it.
    pub diverged: bool,
    /// With `--tls-issuer-dir`: why this pod's certificates must be issued again, when they
    /// must (filled in by the loop).
    pub certificates_due: Option<String>,
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
            archive_rounds: Vec::new(),
            hash_checks: Vec::new(),
            peers: Vec::new(),
            scale_in: Default::default(),
            recovery_looks: Vec::new(),
            diverged: false,
            certificates_due: None,
        }
    }

    /// The cluster's word for this member, when this tick has it: the local member is a
    /// voter that sees a leader and served a quorum read, and its member list holds it at
    /// this pod's peer URL. `now` is the unix time to stamp it with.
    pub fn vouch(&self, now: u64) -> Option<Vouch> {
        let status = self.local.status.as_ref().ok()?;
        let served = matches!(self.local.linearizable, Some(Ok(())));
        if status.is_learner || status.leader == 0 || !served {
            return None;
        }
        let listed = self.members.as_deref()?.iter().any(|m| {
            m.id == status.member_id && !m.is_learner && m.peer_urls.contains(&self.own_peer_url)
        });
        listed.then(|| Vouch {
            member_id: status.member_id,
            cluster_id: status.cluster_id,
            peer_url: self.own_peer_url.clone(),
            ts: now,
        })
    }
}

/// What etcd's peer API said when the client API did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerApi {
    /// It answered: etcd runs (a member restarted without quorum serves no client
    /// requests until its peers return, but its peer API answers).
    Answered,
    /// Nothing listens: etcd is not running (init is still deciding, or etcd is starting).
    NotListening,
    /// It accepted the connection but did not answer in time: etcd is hung.
    NoAnswer(String),
}

/// One round of observations of the local member.
#[derive(Debug, Clone)]
pub struct LocalObservation {
    pub serializable: Result<(), String>,
    /// Asked only when the serializable read failed.
    pub peer_api: Option<PeerApi>,
    pub status: Result<MemberStatus, String>,
    /// Asked only of a voter that sees a leader.
    pub linearizable: Option<Result<(), String>>,
    /// The leader's raft index, when this member is not the leader.
    pub leader_index: Option<u64>,
}

/// Whether `status` reports the NOSPACE alarm (etcd refuses writes): a fact of the member's
/// status, which the health verdict and the defragmentation planner both read.
pub fn nospace(status: &MemberStatus) -> bool {
    status.errors.iter().any(|e| e.contains("NOSPACE"))
}

/// Whether `status` reports etcd's `CORRUPT` alarm (its own check found members' data
/// differ; etcd refuses every read and write meanwhile).
pub fn corrupt(status: &MemberStatus) -> bool {
    status.errors.iter().any(|e| e.contains("CORRUPT"))
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

/// How a backup round ended, as the loop hands it to the backup planner on a later tick
/// (what the round counted and measured goes to the metrics on the executor's side).
#[derive(Debug, Clone, PartialEq)]
pub enum RoundEnd {
    /// The round ran (a snapshot that failed inside it is named in `take_error`).
    Ran {
        /// The store's newest verified snapshot after the round: its Unix time and revision.
        newest_verified: Option<(u64, i64)>,
        take_error: Option<String>,
    },
    /// The round could not run to its end (etcd or the store unreachable, …); the error, as
    /// logged.
    Failed { error: String },
    /// The round's snapshot step is done (a snapshot taken if one was due, retention
    /// applied) and its drills run on: the store's newest verified snapshot, as in `Ran`.
    /// The same round still ends as `Ran` or `Failed`.
    Stored { newest_verified: Option<(u64, i64)> },
    /// A snapshot asked for by [`Step::SnapshotNow`] (not a round): its Unix time and
    /// revision once stored and verified, or why not.
    Requested {
        request: u64,
        taken: Result<(u64, i64), String>,
    },
}

/// How an archive round ended, as the loop hands it to the archive planner on a later tick
/// (what it counted goes to the metrics on the executor's side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveEnd {
    /// Every revision up to `last_revision` is in the store (or a snapshot taken at it,
    /// after a break).
    Archived { last_revision: i64 },
    /// The round could not run to its end; the error, as logged.
    Failed { error: String },
}

/// One look for a proof of loss (`--auto-recover-after`), as `recover --yes` would see it
/// from this pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossLook {
    /// Nothing to judge: the look failed, or this volume holds no data.
    Unknown,
    /// `recover::plan::automatic` holds at `at`: the recovery it would carry out.
    Proven {
        at: Instant,
        id: String,
        why: String,
    },
    /// It does not hold, and why.
    NotProven { why: String },
}

/// The StatefulSet as the Kubernetes API last described it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadState {
    /// `spec.replicas`.
    pub replicas: u32,
    /// The ordinals of the set's pods that exist.
    pub pods: BTreeSet<u32>,
}

/// The API's answer as the loop last had it, and when it had it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadSeen {
    pub at: Instant,
    pub state: WorkloadState,
}

/// What the loop adds to an observation for the scale-in planner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScaleInSeen {
    /// The Kubernetes API's last answer; `None` until it answered.
    pub workload: Option<WorkloadSeen>,
    /// When a removal waits only on them: the voters (by ID) that answered with a leader.
    /// `None` when they were not asked.
    pub voters_answering: Option<BTreeSet<u64>>,
}

/// A change to the cluster a planner intends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Ask the voter at client URL `via` to promote learner `id` (a learner cannot promote
    /// itself; a follower forwards the request to the leader).
    Promote { id: u64, via: String, why: Why },
    /// Remove learner `id` through the local member (this pod's member leads).
    RemoveLearner { id: u64 },
    /// Update this member's peer URLs to `url` (MemberUpdate) through the local member, or,
    /// when it sees no leader, through the peer at client URL `via`.
    UpdatePeerUrls {
        id: u64,
        url: String,
        via: Option<String>,
    },
    /// Start a backup round (take if due → prune → drill) in the background; it reports
    /// back through the observation of a later tick (`Observation::backup_rounds`).
    BackupRound,
    /// Start an archive round in the background: the changes since the last archived
    /// revision into the store (see `plan::archive`). `from_store`: forget what the
    /// previous rounds remembered and read where to continue from the store (the first
    /// round since this member leads). It reports back through a later observation
    /// (`Observation::archive_rounds`).
    ArchiveRound { from_store: bool },
    /// Defragment the local member (under the lock key when `lock`); `/ready` says so
    /// meanwhile.
    Defrag { why: DefragWhy, lock: bool },
    /// Deactivate every NOSPACE alarm, through the local member.
    DisarmNospace,
    /// Remove member `id` of a scaled-away ordinal through the local member (this pod's
    /// member leads; see [`scale_in`]).
    RemoveMember { id: u64, ordinal: u32 },
    /// Take a snapshot at once, in the background, before removing the member of `ordinal`
    /// (see `plan::snapshot_guard`); it reports back through the observation of a later
    /// tick as [`RoundEnd::Requested`] `request`.
    SnapshotNow { request: u64, ordinal: u32 },
    /// Compare every voter's `HashKV` at one common revision, in the background (see
    /// `plan::corruption`); it reports back through the observation of a later tick
    /// (`Observation::hash_checks`).
    CheckHashes {
        voters: Vec<MemberInfo>,
        checker: u64,
    },
    /// Hand this sidecar the recovery request `id` (survivor `survivor`, this pod) that
    /// `recover --yes` would have handed it (see `plan::auto_recover`).
    OfferRecovery { id: String, survivor: String },
    /// Hand the sidecar of member `target` (its data diverged) the rebuild request whose
    /// proof is this member's own check, as control requests travel (see `plan::rebuild`).
    TellRebuild {
        target: MemberInfo,
        request: Box<RebuildRequest>,
    },
    /// Deactivate every CORRUPT alarm, through the local member: every voter answered the
    /// majority's hash.
    DisarmCorrupt,
    /// Issue this pod's certificates again from the CAs (`--tls-issuer-dir`; see
    /// `plan::certificates`).
    IssueCertificates { why: String },
}

/// Why a step is intended: the log says it, tests match on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The learner's raft index is within 90% of the leader's.
    CaughtUp,
    /// The local etcd runs as a joining member but serves no client yet: etcd accepts the
    /// promotion as soon as the leader sees the log caught up, seconds before it serves.
    BeforeServing,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::CaughtUp => "caught up with the leader",
            Why::BeforeServing => "before it serves clients",
        })
    }
}

/// What came of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It took effect.
    Done(Step),
    /// It was in effect already (the learner is a voter): nothing was changed.
    Moot(Step),
    /// etcd refused for now (the learner is not in sync yet): the planner asks again.
    NotYet(Step),
    /// It failed; the error, as logged.
    Failed(Step, String),
}

impl Outcome {
    pub fn step(&self) -> &Step {
        match self {
            Outcome::Done(s) | Outcome::Moot(s) | Outcome::NotYet(s) | Outcome::Failed(s, _) => s,
        }
    }
}

/// Why this member is defragmented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefragWhy {
    /// Fragmented beyond `--defrag-threshold`.
    Fragmented { db_size: u64, in_use: u64 },
    /// `--defrag-schedule` is due.
    Scheduled,
    /// NOSPACE is raised and defragmenting brings the file under the quota with margin.
    Nospace { db_size: u64, in_use: u64 },
}

impl fmt::Display for DefragWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DefragWhy::Fragmented { db_size, in_use } => write!(
                f,
                "the database file ({}) is fragmented beyond --defrag-threshold ({} in use)",
                Bytes(*db_size),
                Bytes(*in_use)
            ),
            DefragWhy::Scheduled => f.write_str("--defrag-schedule is due"),
            DefragWhy::Nospace { db_size, in_use } => write!(
                f,
                "NOSPACE is raised and defragmenting frees enough (file {}, {} in use)",
                Bytes(*db_size),
                Bytes(*in_use)
            ),
        }
    }
}
