//! etcd-steward: an agent inside every pod of an etcd StatefulSet.
//!
//! `init` observes (data directory, DNS, peers, cluster), calls the pure [`decide::decide`],
//! acts (membership change, formation marker, set-aside) and finally execs etcd.
//! `sidecar` promotes this pod's learner, removes dead learners, and serves health,
//! readiness, metrics and the peer report other pods use as bootstrap evidence.

pub mod backup;
pub mod cluster;
pub mod config;
pub mod datadir;
pub mod decide;
pub mod dns;
pub mod etcd_args;
pub mod exec;
pub mod http_get;
pub mod identity;
pub mod init;
pub mod observe;
pub mod report;
pub mod sidecar;
pub mod tls;
