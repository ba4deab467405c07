//! In-memory fakes of the outside world, for tests: a [`FakeCluster`] behind the etcd
//! traits ([`Connector`], [`Etcd`]), a [`FakeDns`] behind [`Dns`], and [`FakeReports`]
//! (the peers' sidecars) behind [`PeerReports`]. No network, no
//! process, no clock: a test scripts the cluster (members, leader, raft indexes, members that
//! are down, calls that fail), runs the code under test, and reads back every call it made.
//!
//! Never in the release build: compiled under `cfg(test)` and, for `tests/`, the `testing`
//! feature (the crate's own dev-dependency turns it on).
//!
//! The cluster follows etcd's rules closely enough for the agent's loops: a member that is
//! down answers nothing (`Unreachable`); a learner refuses quorum reads and membership
//! changes; a promotion goes through any voter to the leader, which refuses it while the
//! learner's raft index is under 90% of its own; one learner at a time may join; without a
//! leader, quorum calls time out.

mod cluster;
mod dns;
mod reports;
mod workload;

pub use cluster::{Call, FakeCluster, FakeMember, Op, Times};
pub use dns::FakeDns;
pub use reports::FakeReports;
pub use workload::FakeWorkload;
