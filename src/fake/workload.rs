//! [`FakeWorkload`]: the Kubernetes API in memory, for scale-in.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::kube_api::{KubeError, SetSpec, Workload};

/// An in-memory API for tests: set what it answers; it counts the calls.
#[derive(Debug, Default, Clone)]
pub struct FakeWorkload {
    inner: Arc<Mutex<FakeState>>,
    calls: Arc<AtomicUsize>,
}

#[derive(Debug, Default)]
struct FakeState {
    replicas: Option<u32>,
    pods: Vec<String>,
}

impl FakeWorkload {
    /// `replicas: None` answers as an unreachable API.
    pub fn set(&self, replicas: Option<u32>, pods: &[&str]) {
        if let Ok(mut s) = self.inner.lock() {
            s.replicas = replicas;
            s.pods = pods.iter().map(|p| p.to_string()).collect();
        }
    }

    /// How many questions were asked so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn state(&self) -> Result<(u32, Vec<String>), KubeError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let s = self
            .inner
            .lock()
            .map_err(|e| KubeError::Setup(e.to_string()))?;
        match s.replicas {
            Some(r) => Ok((r, s.pods.clone())),
            None => Err(KubeError::Unreachable {
                url: "fake".into(),
                detail: "down".into(),
            }),
        }
    }
}

impl Workload for FakeWorkload {
    async fn statefulset(&self) -> Result<SetSpec, KubeError> {
        self.state().map(|(replicas, _)| SetSpec {
            replicas,
            match_labels: BTreeMap::new(),
        })
    }

    async fn pods(&self, _label_selector: &str) -> Result<Vec<String>, KubeError> {
        self.state().map(|(_, p)| p)
    }
}
