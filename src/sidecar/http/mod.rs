//! The sidecar's HTTP surface: the routes kubelet and scrapers use, the peer report other
//! pods read, the metrics registry they encode, and the hardened server that serves them.
//! Handlers read what the loop last published, so they answer at once even while etcd is
//! slow or without quorum.

pub mod control;
pub mod history;
pub mod metrics;
pub mod report;
pub mod routes;
pub mod server;

use std::path::PathBuf;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::health::Health;
use super::recovery::{Inbox, TailCache};

pub use routes::{peer_router, router};

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    /// The latest health verdicts, published by the loop.
    pub health: watch::Receiver<Health>,
    /// Every metric, registered once at start; values are updated by the loop.
    pub registry: Arc<Registry>,
    /// This pod's name, for the peer report.
    pub name: Arc<str>,
    /// The data volume (mounted read-only), for the peer report.
    pub data_dir: Arc<PathBuf>,
    /// The recovery request an operator sent, held until it expires.
    pub recovery: Arc<Inbox<crate::facts::RecoveryRequest>>,
    /// The restore-to-a-snapshot request an operator sent, held until it expires.
    pub restore: Arc<Inbox<crate::facts::RestoreRequest>>,
    /// The rebuild of this pod's member the leader's sidecar asked for (its data diverged),
    /// held until it is done or expires.
    pub rebuild: Arc<Inbox<crate::facts::rebuild::RebuildRequest>>,
    /// How far the volume's log goes, read at most every few seconds.
    pub tail: Arc<TailCache>,
    /// The last time the loop saw the cluster list this pod's member, for the report.
    pub vouch: watch::Receiver<Option<crate::facts::Vouch>>,
    /// Who may send control requests, how they are checked, and the refusals counted.
    pub control: control::Control,
    /// The newest corruption check the loop knows, for the report.
    pub hash_check: watch::Receiver<Option<crate::facts::hashes::HashCheck>>,
    /// The acts this sidecar posted, for `/peer/history`.
    pub acts: crate::kube_api::acts::Acts,
}

impl AppState {
    pub fn new(
        health: watch::Receiver<Health>,
        registry: Arc<Registry>,
        name: &str,
        data_dir: &std::path::Path,
    ) -> Self {
        AppState {
            health,
            registry,
            name: Arc::from(name),
            data_dir: Arc::new(data_dir.to_path_buf()),
            recovery: Arc::new(Inbox::default()),
            restore: Arc::new(Inbox::default()),
            rebuild: Arc::new(Inbox::default()),
            tail: Arc::new(TailCache::new(data_dir)),
            vouch: watch::channel(None).1,
            hash_check: watch::channel(None).1,
            acts: crate::kube_api::acts::Acts::default(),
            // Off until the sidecar says how control requests are authenticated.
            control: control::Control::unregistered(
                crate::control::ControlAuth::Off,
                Arc::new(control::CannotCheck),
            ),
        }
    }

    /// The WAL's tail (cached briefly).
    pub async fn log_tail(&self) -> Option<crate::facts::WalTail> {
        self.tail.get().await
    }
}
