//! Randomized fault schedules on a loopback set, and the checker of what they left.
//!
//! [`Schedule::generate`] lays overlapping faults on a timeline from a seed (the same seed,
//! the same schedule); [`run`] plays it against a running [`Set`] under a steady
//! [`Writer`], heals everything, and [`Outcome::violations`] says what went wrong: an
//! acknowledged write missing from a linearizable read through any member, more than one
//! cluster ID, a member ID reused after its volume was lost (or after the agent rebuilt the
//! member), a member whose volume was never lost (nor rebuilt) that is no longer the same
//! member, a member serving a value the writer never wrote (generator 5 corrupts one on disk:
//! [`Schedule::generate_corrupt`]), a pod not back as a ready voter in time, data
//! deleted rather than set aside (a sentinel, or a WAL segment recorded before a fault:
//! [`crate::wal_kept`]), or writes refused for longer than each fault, with its cost after
//! healing, explains ([`Fault::cost`], [`Outcome::unexplained`]).
//!
//! By job: `schedule.rs` generates, `runner.rs` plays (`corrupt.rs` changes a value on disk
//! and reads what the members serve), `check.rs` judges. The seeded
//! sequence ([`Rng`]), the time bounds and [`BackupTaken`] live in modules of their own that
//! [`crate::disaster`] shares, so that neither module needs the other's.
//!
//! [`Set`]: crate::loopback::Set
//! [`Writer`]: crate::writer::Writer

mod check;
mod corrupt;
mod runner;
mod schedule;

pub use crate::backup_taken::BackupTaken;
pub use crate::bounds::{
    BACKUP_TIME_OUT, ELECTION, HUNG_WRITE, RECOVERY_BOUND, RESTART, UNEXPLAINED_BOUND,
};
pub use crate::rng::Rng;
pub use check::{explained, uncovered, Outcome, Sentinels, Unexplained, SENTINEL_PREFIX};
pub use runner::{prepare, run, run_writing, Writes, VOLUME_MIB};
pub use schedule::{Event, Fault, Schedule, CORRUPTION_CHECK, DEFRAG_THRESHOLD};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
