//! The time bounds both schedule checkers (chaos and disaster) hold a run to.

use std::time::Duration;

/// etcd's election: its election timeout (1 s by default) randomized up to twice that, so
/// a fault that takes the leader down refuses writes this long before a new one leads.
pub const ELECTION: Duration = Duration::from_secs(2);

/// A write in flight to a member that accepts and never answers (paused, cut off, without a
/// leader) is given up by the writer after 2.5 s; it then turns to the next pod.
pub const HUNG_WRITE: Duration = Duration::from_millis(2500);

/// A killed pod back on its volume: `init`'s rounds (its own DNS name, its sidecar's report,
/// 30 ms for a cluster that vouched for the volume), one back-off step of a round that waited,
/// and etcd replaying its WAL before it serves.
pub const RESTART: Duration = Duration::from_millis(2500);

/// Writes refused that no fault explains (beyond every fault's cost: [`Fault::cost`]) are a
/// violation past this: the writer's own rhythm and a defragmentation or a snapshot on a
/// busy machine.
///
/// [`Fault::cost`]: crate::chaos::Fault::cost
pub const UNEXPLAINED_BOUND: Duration = Duration::from_millis(1500);

/// How long a backup may take before it counts as failed.
pub const BACKUP_TIME_OUT: Duration = Duration::from_secs(60);

/// How long every pod may take to be a ready voter again once everything is healed.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(90);
