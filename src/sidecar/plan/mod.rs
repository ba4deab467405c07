//! Pure planners: each reads one [`Observation`] (plain data, [`observation`]) and returns
//! the steps it intends; the executor (`sidecar::execute`) performs them and tells each
//! planner what came of its own. No I/O, no clock (the time is in the observation, and in
//! [`Planner::learned`]), no metrics of the HTTP side. A planner imports only the crate's
//! leaves and this folder. A new behaviour (backup schedule, defragmentation, scale-in) is
//! a new planner: one file here, its step's arm in the executor, and one line in
//! `sidecar::planners`.

pub mod archive;
pub mod auto_recover;
pub mod backup;
pub mod certificates;
pub mod corruption;
pub mod defrag;
pub mod evict;
pub mod observation;
pub mod peer_url;
pub mod promote;
pub mod rebuild;
pub mod scale_in;
pub mod snapshot_guard;

use tokio::time::Instant;

pub use observation::{ArchiveEnd, DefragWhy, Observation, Outcome, Step, Why};

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
