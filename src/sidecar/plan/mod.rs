//! Pure planners: each reads one [`Observation`] (plain data, [`observation`]) and returns
//! the steps it intends; the executor (`sidecar::execute`) performs them and tells each
//! planner what came of its own. No I/O, no clock (the time is in the observation, and in
//! [`Planner::learned`]), no metrics of the HTTP side. A planner imports only the crate's
//! leaves and this folder. A new behaviour (backup schedule, defragmentation, scale-in) is
//! a new planner: one file here, its step's arm in the executor, and one line in
//! `sidecar::planners`.

pub mod auto_recover;
pub mod backup;
pub mod defrag;
pub mod evict;
pub mod observation;
pub mod peer_url;
pub mod promote;
pub mod scale_in;

use std::fmt;

use tokio::time::Instant;

pub use observation::Observation;

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
    /// Defragment the local member (under the lock key when `lock`); `/ready` says so
    /// meanwhile.
    Defrag { why: defrag::DefragWhy, lock: bool },
    /// Deactivate every NOSPACE alarm, through the local member.
    DisarmNospace,
    /// Remove member `id` of a scaled-away ordinal through the local member (this pod's
    /// member leads; see [`scale_in`]).
    RemoveMember { id: u64, ordinal: u32 },
    /// Hand this sidecar the recovery request `id` (survivor `survivor`, this pod) that
    /// `recover --yes` would have handed it (see [`auto_recover`]).
    OfferRecovery { id: String, survivor: String },
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

/// One behaviour of the sidecar.
pub trait Planner: Send {
    /// The steps this planner intends after this observation.
    fn plan(&mut self, seen: &Observation) -> Vec<Step>;
    /// What came of each of its steps, right after they ran (to count them, or to remember
    /// a refusal until the next tick).
    fn learn(&mut self, outcome: &Outcome) {
        let _ = outcome;
    }
    /// The same, told when the outcome came (the loop's clock, read right after the step
    /// ran: a planner has none of its own). The loop calls this one.
    fn learned(&mut self, outcome: &Outcome, at: Instant) {
        let _ = at;
        self.learn(outcome);
    }
    /// Whether this tick must ask the other voters' status ([`Observation::peers`]) for this
    /// planner: asked only when some planner needs them, so a quiet cluster costs nothing.
    fn wants_peers(&self, seen: &Observation) -> bool {
        let _ = seen;
        false
    }
}
