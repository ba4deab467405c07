//! [`FakeDns`]: names that answer what a test scripted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::dns::{Dns, Lookup};

/// DNS in memory: each name answers what the test scripted (`NotFound` until then).
/// Clones share the same answers.
#[derive(Debug, Clone, Default)]
pub struct FakeDns {
    state: Arc<Mutex<DnsState>>,
}

impl FakeDns {
    fn lock(&self) -> MutexGuard<'_, DnsState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// From now on, `host` answers `answer`.
    pub fn answer(&self, host: &str, answer: Lookup) {
        self.lock().answers.insert(host.to_string(), answer);
    }

    /// Every name looked up so far, in order.
    pub fn lookups(&self) -> Vec<String> {
        self.lock().lookups.clone()
    }
}

impl Dns for FakeDns {
    async fn lookup(&self, host: &str) -> Lookup {
        let mut s = self.lock();
        s.lookups.push(host.to_string());
        s.answers.get(host).cloned().unwrap_or(Lookup::NotFound)
    }
}

#[derive(Debug, Default)]
struct DnsState {
    answers: HashMap<String, Lookup>,
    lookups: Vec<String>,
}
