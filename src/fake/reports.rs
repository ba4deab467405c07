//! [`FakeReports`]: the peers' sidecars, each answering the report a test set.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::facts::PeerReport;
use crate::observe::PeerReports;

/// The peers' sidecars, for `init`: each pod's report as the test sets it; a pod without
/// one does not answer (as a sidecar that is not running).
#[derive(Debug, Clone, Default)]
pub struct FakeReports {
    reports: Arc<Mutex<HashMap<String, PeerReport>>>,
}

impl FakeReports {
    /// From now on, pod `name`'s sidecar answers `report`.
    pub fn set(&self, name: &str, report: PeerReport) {
        self.reports
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(name.to_string(), report);
    }
}

impl PeerReports for FakeReports {
    async fn report(
        &self,
        name: &str,
        _host: &str,
        _ip: IpAddr,
        _timeout: Duration,
    ) -> Result<PeerReport, String> {
        self.reports
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| "connection refused (fake: no sidecar)".to_string())
    }
}
