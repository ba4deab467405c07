//! The pod harness of etcd-steward: what the integration tests (`tests/`), the Docker fault
//! suite (`tests/fault.rs`) and the benchmark (`bench/`) start pods with.
//!
//! - [`loopback`]: a "StatefulSet" on one 127.0.N.0/24 with a dnsmasq serving the pods'
//!   stable names; per pod the agent (`init`, which execs real etcd, in a private mount
//!   namespace, and a `sidecar`), or a plain etcd started by hand (the benchmark's baseline).
//! - [`docker`]: pods as Docker containers, for faults loopback cannot make (partitions,
//!   read-only root file systems, graceful stops).
//! - [`dns`] (a loopback set's dnsmasq), [`pki`] (test certificates), [`etcd`] (which etcd
//!   binary), [`client`] (etcd clients and the sidecar's HTTP), [`wait`], [`writer`]
//!   (acknowledged writes), [`logs`], [`procs`]; [`chaos`]: seeded fault schedules and the
//!   checker of what they left ([`wal_kept`]: the WAL files it requires kept); [`disaster`]: generator 3's disasters (every volume lost, a
//!   majority lost for good) and their checker; [`fake_kube`]: a fake Kubernetes API (a StatefulSet and its
//!   pods) for scale-in; [`moto`]: an S3-compatible server for the backup tests;
//!   [`kubelet`]: the etcd container's probe as the chart renders it, run as kubelet runs it;
//!   [`per_etcd_version!`]: a test file's scenarios as one test per etcd release.
//!
//! The `etcd-steward` binary is always passed in ([`loopback::Setup::steward`]): only the main
//! crate's own tests know it (`env!("CARGO_BIN_EXE_etcd-steward")`).

mod backup_taken;
mod bounds;
pub mod chaos;
pub mod chaos_docker;
pub mod client;
pub mod disaster;
pub mod dns;
pub mod docker;
pub mod etcd;
pub mod fake_kube;
pub mod kube_apiserver;
pub mod kube_writer;
pub mod kubelet;
pub mod logs;
pub mod loopback;
pub mod moto;
pub mod paced;
pub mod pki;
pub mod procs;
mod rng;
pub mod wait;
pub mod wal_kept;
pub mod writer;

pub use etcd::Etcd;
pub use loopback::{Kind, PlainStart, Set, Setup};
pub use wait::{wait_for, wait_for_or, wait_until};

use std::path::PathBuf;
use std::time::Duration;

/// What the harness could not do. `Debug` prints the sentence (with its line breaks), so a
/// test's `.unwrap()` reads like a failed assertion.
#[derive(thiserror::Error)]
pub enum Error {
    /// A file or directory of the harness could not be written or read.
    #[error("{what}: {source}")]
    Io {
        /// What the harness was doing.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A process could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// etcd refused or did not answer.
    #[error("etcd at {url}: {source}")]
    Etcd {
        /// The endpoint asked.
        url: String,
        /// etcd's error.
        source: etcd_client::Error,
    },
    /// etcd did not answer within the client's time-out.
    #[error("etcd at {url} did not answer within {after:?}")]
    Unanswered {
        /// The endpoint asked.
        url: String,
        /// How long the harness waited.
        after: Duration,
    },
    /// A condition did not hold in time.
    #[error("timed out after {after:?} waiting for {what}")]
    TimedOut {
        /// The condition (and, for scenarios, the pods' last log lines).
        what: String,
        /// The time-out.
        after: Duration,
    },
    /// Anything else that went wrong, said in a sentence.
    #[error("{0}")]
    Failed(String),
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl Error {
    /// An [`Error::Io`] saying what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// The harness's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
