//! The acts this process posted (through [`super::events::Events::post`]), kept whether or
//! not Events are on: the newest [`KEPT`] in a ring, which the sidecar serves on
//! `/peer/history` for `status --history`, and a count per reason
//! (`etcd_steward_acts_total{reason}`, the dashboard's acts panel).
//!
//! The ring is in memory, not a file: the sidecar mounts the data volume read-only (it never
//! writes the data directory), and every act in it is also a Kubernetes Event when the API
//! is configured. A restarted sidecar starts with an empty ring; `init`'s decisions, which
//! matter most after a restart, are on the volume (`decisions.jsonl`) and outlive it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// How many acts the ring keeps (the newest).
pub const KEPT: usize = 200;

/// The longest note kept (the Event's own limit is 1 KiB).
const NOTE_CHARS: usize = 1024;

/// One act: when, why, and the log's sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub at: SystemTime,
    /// The Event's reason (`Promoted`).
    pub reason: &'static str,
    pub note: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// The ring and the counters. Cloning shares both.
#[derive(Debug, Clone, Default)]
pub struct Acts {
    ring: Arc<Mutex<VecDeque<Recorded>>>,
    total: Family<ReasonLabel, Counter>,
}

impl Acts {
    /// Acts whose count is in `registry` (`etcd_steward_acts_total{reason}`).
    pub fn register(registry: &mut Registry) -> Acts {
        let acts = Acts::default();
        registry.register(
            "etcd_steward_acts",
            "The agent's consequential acts (each one a Kubernetes Event when Events are on), by the Event's reason",
            acts.total.clone(),
        );
        acts
    }

    /// The act of reason `reason` (an Event's, `Promoted`) happened at `at`: kept (the oldest dropped beyond [`KEPT`]) and counted.
    pub fn record(&self, reason: &'static str, note: &str, at: SystemTime) {
        self.total
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() >= KEPT {
            ring.pop_front();
        }
        ring.push_back(Recorded {
            at,
            reason,
            note: note.chars().take(NOTE_CHARS).collect(),
        });
    }

    /// The kept acts, oldest first.
    pub fn recent(&self) -> Vec<Recorded> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_ring_keeps_the_newest_acts_and_counts_every_one() {
        let mut registry = Registry::default();
        let acts = Acts::register(&mut registry);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        for i in 0..(KEPT as u64 + 5) {
            acts.record("Promoted", &format!("act {i}"), t0 + Duration::from_secs(i));
        }
        acts.record("ScaledIn", "removed", t0 + Duration::from_secs(999));
        let kept = acts.recent();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].note, "act 6", "the oldest are dropped first");
        assert_eq!(kept[KEPT - 1].reason, "ScaledIn");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        assert!(
            text.contains("etcd_steward_acts_total{reason=\"Promoted\"} 205"),
            "{text}"
        );
        assert!(
            text.contains("etcd_steward_acts_total{reason=\"ScaledIn\"} 1"),
            "{text}"
        );
    }
}
