//! Pure: what to do after an action failed, and how long rounds that wait sleep. The
//! back-off keys on the kind of reason ([`Why::kind`]), never on its text, so a reason whose
//! details change (another peer missing) keeps backing off.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use crate::backup::restore::RestoreError;
use crate::etcd::EtcdError;

use super::act::ActError;
use crate::decision::{Why, WhyKind};

/// etcd refuses membership changes for 5 s after one ("unhealthy cluster"): retry on a
/// flat period rather than a growing back-off, which would overshoot the window by seconds.
pub const UNHEALTHY_CLUSTER_RETRY: Duration = Duration::from_millis(250);

/// After a failed action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Look again after this fixed pause.
    After(Duration),
    /// Look again after the back-off's next delay.
    Backoff,
    /// Stop: `init` exits with this error (the container restarts and tries afresh).
    GiveUp,
}

/// Maps an action's error to what the loop does next.
pub fn policy(e: &ActError) -> Retry {
    match e {
        // The volume cannot be written: nothing this loop can fix; say so and exit.
        ActError::Volume(_) => Retry::GiveUp,
        // The store is unreachable, or a download failed its checksum, or the agreed
        // snapshot is gone: look again (never form an empty cluster instead).
        ActError::Restore(
            RestoreError::Store(_) | RestoreError::Checksum { .. } | RestoreError::Decrypt(_),
        )
        | ActError::SnapshotMissing { .. } => Retry::Backoff,
        // The snapshot before a new minor release: the store or the member did not answer;
        // etcd does not start without it (said in the waiting note), tried again.
        ActError::Snapshot { .. } => Retry::After(SNAPSHOT_RETRY),
        // The archive's store, or the replay's throw-away etcd, failed: look again.
        ActError::Replay(_) => Retry::Backoff,
        // etcd's restore tool cannot run, or refuses the snapshot: it fails the same way at
        // every try, so a restart would only loop. Wait, saying why at every round, until
        // an operator fixes the tool (or the store): never an empty cluster instead.
        ActError::Restore(RestoreError::Tool { .. }) => Retry::Backoff,
        // The volume cannot be written, or (never expected) the volume holds data: exit, so
        // `kubectl describe pod` shows why.
        ActError::Restore(_) => Retry::GiveUp,
        ActError::Membership { source, .. } => match source {
            EtcdError::UnhealthyCluster => Retry::After(UNHEALTHY_CLUSTER_RETRY),
            // Already done by an earlier attempt, or another learner's turn, or the cluster
            // is in flux: look again, the next round sees what is true now.
            _ => Retry::Backoff,
        },
    }
}

/// After a failed snapshot before a new minor release: long enough not to hammer a store
/// that is down, short next to an upgrade.
pub const SNAPSHOT_RETRY: Duration = Duration::from_secs(10);

/// The back-off between rounds that wait: from 50 ms (peers started together answer within
/// a few rounds) up to 5 s (a long wait costs its peers and DNS little), with jitter;
/// restarted whenever the kind of reason changes, or a wait makes progress (fewer pods
/// still to prepare, fewer peers unaccounted for).
pub struct Backoff {
    delays: backon::ExponentialBackoff,
    key: Option<(WhyKind, usize)>,
}

fn delays() -> backon::ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(5))
        .with_factor(1.6)
        .with_jitter()
        .without_max_times()
        .build()
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            delays: delays(),
            key: None,
        }
    }
}

impl Backoff {
    /// Notes this round's reason; a new kind of reason, or progress within one, starts the
    /// back-off afresh.
    pub fn observe(&mut self, why: &Why) {
        let key = (why.kind(), why.outstanding());
        let progress = self
            .key
            .is_some_and(|(kind, left)| kind == key.0 && key.1 < left);
        if self.key.map(|k| k.0) != Some(key.0) || progress {
            self.delays = delays();
        }
        self.key = Some(key);
    }

    pub fn next_delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(Duration::from_secs(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::ActionKind;

    fn membership(source: EtcdError) -> ActError {
        ActError::Membership {
            action: ActionKind::Join,
            via: "etcd-0".into(),
            source,
        }
    }

    #[test]
    fn each_error_maps_to_its_retry() {
        let other = |detail: &str| EtcdError::Other {
            endpoint: "e".into(),
            detail: detail.into(),
        };
        let table = [
            (
                membership(EtcdError::UnhealthyCluster),
                Retry::After(UNHEALTHY_CLUSTER_RETRY),
            ),
            (membership(EtcdError::TooManyLearners), Retry::Backoff),
            (membership(EtcdError::PeerUrlExists), Retry::Backoff),
            (
                membership(EtcdError::MemberNotFound { id: 1 }),
                Retry::Backoff,
            ),
            (membership(EtcdError::NoLeader), Retry::Backoff),
            (membership(other("leader changed")), Retry::Backoff),
            (
                ActError::Restore(RestoreError::Checksum {
                    name: "s1".into(),
                    detail: "sha256 mismatch".into(),
                }),
                Retry::Backoff,
            ),
            (
                ActError::SnapshotMissing {
                    name: "s1".into(),
                    why: "it is not in the backup store",
                },
                Retry::Backoff,
            ),
            (
                ActError::Restore(RestoreError::Tool {
                    name: "s1".into(),
                    error: crate::backup::tool::ToolError::Spawn {
                        bin: "etcdutl".into(),
                        error: std::io::Error::from(std::io::ErrorKind::NotFound),
                    },
                }),
                Retry::Backoff,
            ),
            (
                ActError::Restore(RestoreError::HasData {
                    path: "/var/lib/etcd".into(),
                }),
                Retry::GiveUp,
            ),
            (
                ActError::Volume(crate::volume::VolumeError::Unwritable {
                    path: "/x".into(),
                    source: std::io::Error::other("read-only file system"),
                }),
                Retry::GiveUp,
            ),
        ];
        for (e, want) in table {
            assert_eq!(policy(&e), want, "{e}");
        }
    }

    #[test]
    fn the_backoff_grows_for_one_kind_of_reason_and_restarts_for_another() {
        let mut b = Backoff::default();
        let waiting = |pods: &[&str]| Why::WaitingForPrepare {
            pods: pods.iter().map(|p| p.to_string()).collect(),
        };
        b.observe(&waiting(&["etcd-1", "etcd-2"]));
        let first = b.next_delay();
        for _ in 0..12 {
            // The same wait, whatever its text says: it keeps growing.
            b.observe(&waiting(&["etcd-2", "etcd-1"]));
            b.next_delay();
        }
        b.observe(&waiting(&["etcd-2", "etcd-3"]));
        let late = b.next_delay();
        assert!(
            late > first * 4,
            "same kind keeps growing: {first:?} → {late:?}"
        );
        assert!(late <= Duration::from_secs(10));
        b.observe(&waiting(&["etcd-2"]));
        let progressed = b.next_delay();
        assert!(
            progressed < Duration::from_millis(200),
            "one pod fewer to wait for: looked at again soon, {progressed:?}"
        );
        for _ in 0..12 {
            b.next_delay();
        }
        b.observe(&Why::ReadyToPrepare { snapshot: None });
        let fresh = b.next_delay();
        assert!(fresh < Duration::from_millis(200), "{fresh:?}");
    }
}
