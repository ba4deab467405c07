//! The rebuild of this pod's member, its own pod's part (issue 27). The leader's sidecar
//! hands this sidecar a rebuild request (`POST /peer/rebuild`, authenticated as every
//! control request; held only once the proof stands and this member's own hash still
//! differs: `sidecar::checks`). Then, each tick ([`phase`] is the pure part):
//! - while etcd still serves as the diverged member, it is stopped once (as a recovery's
//!   survivor is), so that the container restarts and `init` — reading the request from
//!   this sidecar's report — sets the data aside to `set-aside/<time>-diverged/` (renamed,
//!   never deleted) and joins the cluster again as a new member, whose stale entry it
//!   replaces as for any lost volume;
//! - once etcd serves here as a new voter, the member is rebuilt: the request is dropped,
//!   `etcd_steward_members_rebuilt_total` counts it and a `MemberRebuilt` Event names the
//!   old and the new member and where the old data went.
//!
//! Meanwhile `/ready` says what the rebuild waits for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::facts::rebuild::RebuildRequest;
use crate::kube_api::events::{Events, Reason};

use super::recovery::{Inbox, Stop, Stopper};

/// Where a held rebuild stands, from what this pod sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// etcd still runs as the diverged member (or its data is still here): stop it, so that
    /// `init` sets the data aside.
    Stop,
    /// The data is aside; the member joins again (as a learner until promoted).
    Rejoining,
    /// etcd serves here as voter `new`: rebuilt.
    Rebuilt { new: u64 },
}

/// Pure: the phase of a rebuild of member `diverged`, when etcd serves here as `serving`
/// (its member ID and whether it is a learner; `None`: it does not answer) and the
/// volume's WAL names member `wal` (`None`: no data, or unreadable).
pub fn phase(diverged: u64, serving: Option<(u64, bool)>, wal: Option<u64>) -> Phase {
    match serving {
        Some((id, _)) if id == diverged => Phase::Stop,
        Some((id, false)) => Phase::Rebuilt { new: id },
        Some((_, true)) => Phase::Rejoining,
        None if wal == Some(diverged) => Phase::Stop,
        None => Phase::Rejoining,
    }
}

/// The rebuild request this pod holds, and what to do for it.
pub struct RebuildDuty {
    pub inbox: Arc<Inbox<RebuildRequest>>,
    stopper: Stopper,
    data_dir: PathBuf,
    pub events: Events,
    rebuilt: Counter,
    /// The last state logged, so that a state is logged once.
    reported: Option<String>,
}

impl RebuildDuty {
    /// Registers `etcd_steward_members_rebuilt_total` in `registry`.
    pub fn new(data_dir: &Path, registry: &mut Registry) -> Self {
        let rebuilt = Counter::default();
        registry.register(
            "etcd_steward_members_rebuilt",
            "Members of this pod rebuilt from their peers after their data diverged from the majority's",
            rebuilt.clone(),
        );
        RebuildDuty {
            inbox: Arc::new(Inbox::default()),
            stopper: Stopper::new(data_dir),
            data_dir: data_dir.to_path_buf(),
            events: Events::off(),
            rebuilt,
            reported: None,
        }
    }

    /// One tick: `serving` is this member's ID and whether it is a learner, when etcd
    /// answers here. Returns what `/ready` says while a rebuild is under way.
    pub fn tick(&mut self, serving: Option<(u64, bool)>) -> Option<String> {
        let request = self.inbox.current()?;
        let old = request.member;
        let wal = crate::volume::inspect(&self.data_dir)
            .ok()
            .and_then(|s| s.wal_identity())
            .map(|w| w.member_id);
        let text = match phase(old, serving, wal) {
            Phase::Stop => {
                // Once per proof: a request held again after it expired (init found the
                // proof wanting and started etcd again) may stop etcd again.
                let once = format!("{}@{}", request.id, request.check.at);
                let how = match self.stopper.stop(&once) {
                    Stop::Signalled(pid) => format!("etcd (pid {pid}) stopped"),
                    Stop::CoolingDown | Stop::Done => "etcd was stopped; init decides".into(),
                    Stop::NotVisible if serving.is_none() => {
                        "etcd does not run here (it refused to start on this data, or init waits)".into()
                    }
                    Stop::NotVisible => format!(
                        "no etcd process for {} is visible here (set shareProcessNamespace: true, or delete this pod so that init runs again)",
                        self.data_dir.display()
                    ),
                    Stop::Failed(e) => format!("etcd cannot be stopped: {e}"),
                };
                format!(
                    "member {old:x}'s data diverged from the majority's ({}): it is rebuilt from its peers; {how}, init sets the data aside and joins again as a new member",
                    request.check.verdict
                )
            }
            Phase::Rejoining => format!(
                "member {old:x}'s data diverged and was set aside: this pod joins again as a new member"
            ),
            Phase::Rebuilt { new } => {
                let aside = newest_diverged(&self.data_dir);
                let note = format!(
                    "member {old:x}, whose data diverged from the majority's, was rebuilt from its peers as member {new:x}; its data is at {}",
                    aside.as_deref().map_or("set-aside/ (not found)".into(), |p| p.display().to_string())
                );
                tracing::warn!(old = %format!("{old:x}"), new = %format!("{new:x}"), set_aside = ?aside, "{note}");
                self.events.post(Reason::MemberRebuilt, note);
                self.rebuilt.inc();
                self.inbox.clear(&request.id);
                self.reported = None;
                return None;
            }
        };
        if self.reported.as_deref() != Some(text.as_str()) {
            tracing::warn!(request = %request.id, state = %text, "rebuild step");
            self.reported = Some(text.clone());
        }
        Some(text)
    }
}

/// The newest `set-aside/<time>-diverged/member` on the volume.
fn newest_diverged(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir.join("set-aside"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stamp = name.strip_suffix("-diverged")?.parse().ok()?;
            Some((stamp, e.path().join("member")))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diverged_member_is_stopped_until_a_new_voter_serves() {
        // etcd serves as the diverged member: stop it.
        assert_eq!(phase(7, Some((7, false)), Some(7)), Phase::Stop);
        // Stopped, data still here: init has not set it aside yet.
        assert_eq!(phase(7, None, Some(7)), Phase::Stop);
        // Set aside: joining again.
        assert_eq!(phase(7, None, None), Phase::Rejoining);
        assert_eq!(phase(7, None, Some(9)), Phase::Rejoining);
        assert_eq!(phase(7, Some((9, true)), Some(9)), Phase::Rejoining);
        // A new voter serves: rebuilt.
        assert_eq!(
            phase(7, Some((9, false)), Some(9)),
            Phase::Rebuilt { new: 9 }
        );
    }

    #[test]
    fn the_newest_diverged_set_aside_is_named() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for name in ["100-diverged", "300-removed-member", "200-diverged"] {
            std::fs::create_dir_all(dir.path().join("set-aside").join(name).join("member"))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(
            newest_diverged(dir.path()),
            Some(dir.path().join("set-aside/200-diverged/member"))
        );
    }
}
