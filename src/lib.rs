//! etcd-steward: an agent inside every pod of an etcd StatefulSet.
//!
//! `init` observes (data directory, DNS, peers, cluster), calls the pure
//! [`decision::decide`] on the [`facts`], acts (membership change, formation marker,
//! set-aside) and finally execs etcd. `sidecar` promotes this pod's learner, removes dead
//! learners, and serves health, readiness, metrics and the peer report other pods use as
//! bootstrap evidence. `docs/ARCHITECTURE.md` maps each guarantee to its code and test.

pub mod backup;
pub mod clock;
pub mod commands;
pub mod config;
pub mod control;
pub mod decision;
pub mod dns;
pub mod etcd;
pub mod exec;
pub mod facts;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod http_client;
pub mod identity;
pub mod init;
pub mod kube_api;
pub mod logs;
pub mod observe;
pub mod policy;
pub mod recovery;
pub mod report;
pub mod sidecar;
pub mod tls;
pub mod units;
pub mod volume;
