//! The acts `init` took, as Kubernetes Events on this pod. `init` records each decision it
//! acted on in its journal and then execs etcd: it never waits on the API. The sidecar
//! tails the journal and posts each new entry ([`act_of`], pure), and what `init` notes it
//! waits for ([`wait_act`], pure): a held upgrade or restore at once, any other wait once it
//! lasted over [`TOO_LONG`], repeated every [`WAIT_REPEAT`] into one Event's series.
//!
//! Idempotent by name: each Event is named after the pod, the time of what it tells and a
//! hash of its reason and note ([`event_name`]), so a restarted sidecar that posts an entry
//! again gets the API's AlreadyExists, which is harmless. Entries older than [`HORIZON`]
//! before the sidecar started (an Event's default lifetime in the API server) are not
//! posted: a volume's old history is not replayed as news.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::facts::{ActionKind, Waiting};
use crate::kube_api::events::{Events, Reason};
use crate::volume::journal::{self, Entry};

/// A wait that lasted this long (seconds) is posted as `WaitingTooLong`.
pub const TOO_LONG: u64 = 5 * 60;

/// Journal entries older than this (seconds) before the sidecar started are not posted.
pub const HORIZON: u64 = 60 * 60;

/// A wait still under way is posted again (one more in its Event's series) this often.
pub const WAIT_REPEAT: Duration = Duration::from_secs(30);

/// The waits that hold an upgrade (the decision's reason variant, as `waiting.json` names it).
const UPGRADE_HELD: [&str; 2] = ["VersionHeld", "SnapshotBeforeUpgrade"];
/// The waits that hold a restore: no usable snapshot (a wrong key, a bad checksum), or the
/// one named cannot be used.
const RESTORE_HELD: [&str; 3] = ["NoUsableBackup", "NamedBackupUnusable", "RestoreNotSeen"];

/// The Event a journal entry is posted as (its reason, and a note that is the log's
/// sentence), or `None` for what changes neither membership nor data (a restart, a
/// resumed start, a snapshot before an upgrade).
pub fn act_of(e: &Entry) -> Option<(Reason, String)> {
    let reason = e.reason.clone();
    Some(match e.action {
        ActionKind::Bootstrap => match &e.restored {
            Some(r) => {
                let revisions = match (r.revision, r.revision_after) {
                    (Some(before), Some(after)) if after != before => {
                        format!("revision {before} before the jump, {after} after")
                    }
                    (Some(before), _) => format!("revision {before}, no jump"),
                    _ => "its revision unknown".to_string(),
                };
                let note = match reason.contains(&r.snapshot) {
                    true => format!("{reason} ({revisions})"),
                    false => format!(
                        "restored from backup {} ({revisions}): {reason}",
                        r.snapshot
                    ),
                };
                (Reason::RestoredFromBackup, note)
            }
            None => (Reason::Bootstrapped, reason),
        },
        ActionKind::Join => (Reason::JoinedAsLearner, reason),
        ActionKind::Replace => (Reason::MemberReplaced, reason),
        ActionKind::Recover => (Reason::RecoveryStarted, reason),
        ActionKind::UpdatePeerUrls => (Reason::PeerURLUpdated, reason),
        ActionKind::SetAside => {
            let to = e.set_aside.as_ref().map_or("set-aside/", |s| s.to.as_str());
            let left = e
                .set_aside
                .as_ref()
                .is_some_and(|s| s.why == crate::decision::SetAsideWhy::Left.slug());
            let note = format!("data set aside to {to} (renamed, not deleted): {reason}");
            match left {
                true => (Reason::LeftCluster, note),
                false => (Reason::DataSetAside, note),
            }
        }
        ActionKind::Restart | ActionKind::Resume | ActionKind::Snapshot | ActionKind::Wait => {
            return None
        }
    })
}

/// After a recovery's forced start (`recover`, the journal's last entry) once etcd serves
/// again on this pod: the cluster is back, from this pod's surviving data.
pub fn recovered(recover: &Entry) -> (Reason, String) {
    let note = format!(
        "etcd serves again on this pod's surviving data, as a one-member cluster the other pods join as new learners ({})",
        recover.reason
    );
    (Reason::RecoveredFromSurvivor, note)
}

/// The Event what `init` notes it waits for is posted as at unix time `now`, if any.
pub fn wait_act(w: &Waiting, now: u64) -> Option<(Reason, String)> {
    if UPGRADE_HELD.contains(&w.kind.as_str()) {
        Some((Reason::UpgradeHeld, w.reason.clone()))
    } else if RESTORE_HELD.contains(&w.kind.as_str()) {
        Some((Reason::RestoreHeld, w.reason.clone()))
    } else if now >= w.since.saturating_add(TOO_LONG) {
        let note = format!("init has waited over 5 minutes ({}): {}", w.kind, w.reason);
        Some((Reason::WaitingTooLong, note))
    } else {
        None
    }
}

/// The name of the Event that tells `reason` and `note` on `pod`, of a thing that happened
/// (or began) at unix time `ts`: the same whoever computes it, whenever.
pub fn event_name(pod: &str, ts: u64, reason: Reason, note: &str) -> String {
    // FNV-1a: stable across releases, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in reason.as_str().bytes().chain([0]).chain(note.bytes()) {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{pod}.{ts:x}-{hash:016x}")
}

fn wall(ts: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(ts)
}

/// Posts what `init` did and waits for; looked at once per tick.
#[derive(Debug)]
pub struct InitEvents {
    events: Events,
    pod: String,
    data_dir: PathBuf,
    /// Entries before this (unix seconds) are not posted.
    oldest: u64,
    /// The journal's size and modification time when last read.
    signature: Option<(u64, Option<SystemTime>)>,
    last: Option<Entry>,
    posted: HashSet<String>,
    /// When each wait was last posted.
    waits: HashMap<(Reason, String), Instant>,
    /// The error last said of a journal that cannot be read.
    unreadable: Option<String>,
}

impl InitEvents {
    /// For the pod `pod` on `data_dir`, by a sidecar started at unix time `started`.
    pub fn new(events: Events, pod: &str, data_dir: &Path, started: u64) -> InitEvents {
        InitEvents {
            events,
            pod: pod.to_string(),
            data_dir: data_dir.to_path_buf(),
            oldest: started.saturating_sub(HORIZON),
            signature: None,
            last: None,
            posted: HashSet::new(),
            waits: HashMap::new(),
            unreadable: None,
        }
    }

    /// One look at unix time `now`: posts the journal's new entries, a finished recovery,
    /// and `waiting` (what init waits for, as `/ready` shows it). Never waits on the API.
    pub fn look(&mut self, now: u64, etcd_running: bool, waiting: Option<&Waiting>) {
        if !self.events.is_on() {
            return;
        }
        let path = journal::path(&self.data_dir);
        let signature = std::fs::metadata(path)
            .ok()
            .map(|m| (m.len(), m.modified().ok()));
        if signature != self.signature {
            // A journal that cannot be read posts no act (and forgets none posted): it is
            // read again at the next look, and said once meanwhile. What init waits for
            // (it waits on that journal) is still posted below.
            match journal::read(&self.data_dir) {
                Ok(entries) => {
                    self.unreadable = None;
                    self.signature = signature;
                    let oldest = self.oldest;
                    for e in entries.iter().filter(|e| e.ts >= oldest) {
                        if let Some((reason, note)) = act_of(e) {
                            self.post(e.ts, reason, note);
                        }
                    }
                    self.last = entries.into_iter().last();
                }
                Err(e) => {
                    let said = e.to_string();
                    if self.unreadable.as_deref() != Some(said.as_str()) {
                        tracing::warn!(error = %said, "the decision journal cannot be read: init's acts are not posted as Events until it is repaired or moved away");
                        self.unreadable = Some(said);
                    }
                }
            }
        }
        if let Some(e) = &self.last {
            if etcd_running && e.action == ActionKind::Recover && e.ts >= self.oldest {
                let (reason, note) = recovered(e);
                self.post(e.ts, reason, note);
            }
        }
        self.waits
            .retain(|_, at| at.elapsed() < crate::kube_api::events::SERIES_WINDOW);
        let Some(w) = waiting.filter(|_| !etcd_running) else {
            return;
        };
        let Some((reason, note)) = wait_act(w, now) else {
            return;
        };
        let key = (reason, note.clone());
        if self
            .waits
            .get(&key)
            .is_some_and(|at| at.elapsed() < WAIT_REPEAT)
        {
            return;
        }
        self.waits.insert(key, Instant::now());
        let name = event_name(&self.pod, w.since, reason, &note);
        self.events.post_named(reason, note, name, wall(now));
    }

    /// Posts one act of the journal, once per sidecar (and once per Event name in the API).
    fn post(&mut self, ts: u64, reason: Reason, note: String) {
        let name = event_name(&self.pod, ts, reason, &note);
        if self.posted.insert(name.clone()) {
            self.events.post_named(reason, note, name, wall(ts));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::events::v1::{Event, EventSeries};
    use prometheus_client::metrics::counter::Counter;

    use super::*;
    use crate::kube_api::events::{EventApi, Regarding};
    use crate::kube_api::KubeError;
    use crate::volume::journal::{Restored, SetAside};

    fn entry(action: ActionKind) -> Entry {
        Entry::new(1_795_000_000, action, "the sentence")
    }

    #[test]
    fn each_act_that_changes_membership_or_data_has_its_reason_and_the_logs_sentence() {
        let cases = [
            (ActionKind::Bootstrap, Some(Reason::Bootstrapped)),
            (ActionKind::Join, Some(Reason::JoinedAsLearner)),
            (ActionKind::Replace, Some(Reason::MemberReplaced)),
            (ActionKind::Recover, Some(Reason::RecoveryStarted)),
            (ActionKind::UpdatePeerUrls, Some(Reason::PeerURLUpdated)),
            (ActionKind::SetAside, Some(Reason::DataSetAside)),
            (ActionKind::Restart, None),
            (ActionKind::Resume, None),
            (ActionKind::Snapshot, None),
            (ActionKind::Wait, None),
        ];
        for (action, reason) in cases {
            let got = act_of(&entry(action));
            assert_eq!(got.as_ref().map(|(r, _)| *r), reason, "{action:?}");
            if let Some((_, note)) = got {
                assert!(note.ends_with("the sentence"), "{action:?}: {note}");
            }
        }
    }

    #[test]
    fn a_set_aside_names_where_the_data_went_and_leaving_is_left_cluster() {
        let moved = |why: &str| Entry {
            set_aside: Some(SetAside {
                why: why.into(),
                to: format!("set-aside/1795000000-{why}/member"),
            }),
            ..entry(ActionKind::SetAside)
        };
        let (reason, note) = act_of(&moved("removed-member")).unwrap();
        assert_eq!(reason, Reason::DataSetAside);
        assert!(
            note.contains("set-aside/1795000000-removed-member/member"),
            "{note}"
        );
        assert!(note.contains("renamed, not deleted"), "{note}");
        let (reason, note) = act_of(&moved("left")).unwrap();
        assert_eq!(reason, Reason::LeftCluster);
        assert!(note.contains("set-aside/1795000000-left/member"), "{note}");
    }

    #[test]
    fn a_restore_names_the_snapshot_and_the_revision_before_and_after_the_jump() {
        let restored = |revision, revision_after| Entry {
            restored: Some(Restored {
                snapshot: "20261123T033912.123Z-r42".into(),
                revision,
                revision_after,
            }),
            ..entry(ActionKind::Bootstrap)
        };
        let (reason, note) = act_of(&restored(Some(42), Some(1_000_000_042))).unwrap();
        assert_eq!(reason, Reason::RestoredFromBackup);
        assert!(note.starts_with("restored from backup 20261123T033912.123Z-r42 (revision 42 before the jump, 1000000042 after): the sentence"), "{note}");
        let named = Entry {
            reason: "form a new cluster, restored from backup 20261123T033912.123Z-r42".into(),
            ..restored(Some(42), Some(1_000_000_042))
        };
        let (_, note) = act_of(&named).unwrap();
        assert_eq!(note, "form a new cluster, restored from backup 20261123T033912.123Z-r42 (revision 42 before the jump, 1000000042 after)");
        let (_, note) = act_of(&restored(Some(42), Some(42))).unwrap();
        assert!(note.contains("(revision 42, no jump)"), "{note}");
        let (_, note) = act_of(&restored(None, None)).unwrap();
        assert!(note.contains("(its revision unknown)"), "{note}");
    }

    fn note(kind: &str, since: u64) -> Waiting {
        Waiting {
            since,
            kind: kind.into(),
            reason: format!("{kind} sentence"),
        }
    }

    #[test]
    fn a_held_upgrade_or_restore_is_posted_at_once_any_other_wait_after_five_minutes() {
        let at = |kind, now| wait_act(&note(kind, 1000), now).map(|(r, _)| r);
        assert_eq!(at("VersionHeld", 1000), Some(Reason::UpgradeHeld));
        assert_eq!(at("SnapshotBeforeUpgrade", 1000), Some(Reason::UpgradeHeld));
        assert_eq!(at("NoUsableBackup", 1000), Some(Reason::RestoreHeld));
        assert_eq!(at("NamedBackupUnusable", 1000), Some(Reason::RestoreHeld));
        assert_eq!(at("NoProofYet", 1000 + TOO_LONG - 1), None);
        assert_eq!(
            at("NoProofYet", 1000 + TOO_LONG),
            Some(Reason::WaitingTooLong)
        );
        let (_, text) = wait_act(&note("NoProofYet", 1000), 2000).unwrap();
        assert!(text.ends_with("NoProofYet sentence"), "{text}");
    }

    #[test]
    fn an_events_name_is_the_same_whoever_computes_it_and_a_valid_name() {
        let a = event_name("etcd-1", 0x10, Reason::MemberReplaced, "n");
        assert_eq!(a, event_name("etcd-1", 0x10, Reason::MemberReplaced, "n"));
        assert_eq!(a, "etcd-1.10-065e320cf3971f9d");
        assert_ne!(a, event_name("etcd-1", 0x10, Reason::MemberReplaced, "m"));
        assert_ne!(a, event_name("etcd-1", 0x11, Reason::MemberReplaced, "n"));
        assert_ne!(a, event_name("etcd-1", 0x10, Reason::JoinedAsLearner, "n"));
        assert!(a
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-'));
    }

    /// An API that keeps what it is sent and, like the real one, refuses a second Event of
    /// a name it holds (409).
    #[derive(Clone, Default)]
    struct Kept {
        events: Arc<Mutex<Vec<Event>>>,
        series: Arc<Mutex<Vec<(String, i32)>>>,
        /// While set, every call goes unanswered.
        down: Arc<Mutex<bool>>,
    }

    impl EventApi for Kept {
        async fn create(&self, event: Event) -> Result<(), KubeError> {
            if *self.down.lock().unwrap() {
                return Err(KubeError::Unreachable {
                    url: "https://kube".into(),
                    detail: "no answer".into(),
                });
            }
            let mut held = self.events.lock().unwrap();
            if held.iter().any(|e| e.metadata.name == event.metadata.name) {
                return Err(KubeError::Status {
                    path: "events".into(),
                    code: 409,
                    message: "already exists".into(),
                });
            }
            held.push(event);
            Ok(())
        }
        async fn update_series(&self, name: &str, series: EventSeries) -> Result<(), KubeError> {
            self.series
                .lock()
                .unwrap()
                .push((name.into(), series.count));
            Ok(())
        }
    }

    fn start(api: &Kept, failed: &Counter) -> Events {
        let regarding = Regarding {
            namespace: "db".into(),
            pod: "etcd-1".into(),
            uid: None,
        };
        Events::start(api.clone(), regarding, failed.clone())
    }

    /// Lets the posting task run.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_ten_minute_wait_is_one_event_whose_count_grows() {
        let (api, failed) = (Kept::default(), Counter::default());
        let tmp = tempfile::tempdir().unwrap();
        let mut init = InitEvents::new(start(&api, &failed), "etcd-1", tmp.path(), 1000);
        let w = note("NoProofYet", 1000);
        let mut counts = Vec::new();
        for t in 0..=600 {
            init.look(1000 + t, false, Some(&w));
            settle().await;
            if t == TOO_LONG - 1 {
                assert!(
                    api.events.lock().unwrap().is_empty(),
                    "not before 5 minutes"
                );
            }
            let last = api.series.lock().unwrap().last().map(|(_, c)| *c);
            if last.is_some() && counts.last() != last.as_ref() {
                counts.push(last.unwrap_or_default());
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let events = api.events.lock().unwrap().clone();
        assert_eq!(events.len(), 1, "{events:#?}");
        assert_eq!(events[0].reason.as_deref(), Some("WaitingTooLong"));
        assert!(
            counts.len() >= 3 && counts.windows(2).all(|c| c[0] < c[1]),
            "{counts:?}"
        );
        assert!(api
            .series
            .lock()
            .unwrap()
            .iter()
            .all(|(n, _)| Some(n) == events[0].metadata.name.as_ref()));
        assert_eq!(failed.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovery_is_recovered_from_survivor_once_etcd_serves_again_and_only_once() {
        let (api, failed) = (Kept::default(), Counter::default());
        let tmp = tempfile::tempdir().unwrap();
        let now = 1_795_000_000;
        let recover = Entry::new(now, ActionKind::Recover, "recovery r1: --force-new-cluster");
        journal::append(tmp.path(), &recover).unwrap();
        let mut init = InitEvents::new(start(&api, &failed), "etcd-1", tmp.path(), now);
        let reasons = |api: &Kept| -> Vec<String> {
            api.events
                .lock()
                .unwrap()
                .iter()
                .filter_map(|e| e.reason.clone())
                .collect()
        };
        init.look(now, false, None);
        settle().await;
        assert_eq!(
            reasons(&api),
            ["RecoveryStarted"],
            "etcd does not serve yet"
        );
        for t in 1..5 {
            init.look(now + t, true, None);
        }
        settle().await;
        assert_eq!(reasons(&api), ["RecoveryStarted", "RecoveredFromSurvivor"]);
    }

    /// Every volume of the cluster's own etcd lost: the API answers only once etcd serves
    /// again, after the restore's entry was read. The Event is created once it answers,
    /// under the same name, and only once.
    #[tokio::test(start_paused = true)]
    async fn a_restore_posted_while_the_api_is_down_is_on_the_pod_once_it_answers() {
        let (api, failed) = (Kept::default(), Counter::default());
        *api.down.lock().unwrap() = true;
        let tmp = tempfile::tempdir().unwrap();
        let now = 1_795_000_000;
        let mut e = Entry::new(now, ActionKind::Bootstrap, "form a new cluster");
        e.restored = Some(Restored {
            snapshot: "20261128T033426.528Z-r21".into(),
            revision: Some(21),
            revision_after: Some(1_000_000_021),
        });
        journal::append(tmp.path(), &e).unwrap();
        let mut init = InitEvents::new(start(&api, &failed), "etcd-1", tmp.path(), now);
        for t in 0..20 {
            init.look(now + t, true, None);
            settle().await;
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(api.events.lock().unwrap().is_empty());
        assert!(failed.get() >= 3, "each try counted: {}", failed.get());
        *api.down.lock().unwrap() = false;
        for t in 20..100 {
            init.look(now + t, true, None);
            settle().await;
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let events = api.events.lock().unwrap().clone();
        let reasons: Vec<_> = events.iter().filter_map(|e| e.reason.clone()).collect();
        assert_eq!(reasons, ["RestoredFromBackup"], "{events:#?}");
        assert!(events[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("20261128T033426.528Z-r21")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_sidecar_posts_no_entry_again_and_old_entries_never() {
        let (api, failed) = (Kept::default(), Counter::default());
        let tmp = tempfile::tempdir().unwrap();
        let now = 1_795_000_000;
        let old = Entry::new(now - HORIZON - 1, ActionKind::Join, "long ago");
        let replaced = Entry::new(now - 60, ActionKind::Replace, "stale entry removed");
        let joined = Entry::new(now - 59, ActionKind::Join, "joined");
        for e in [&old, &replaced, &joined] {
            journal::append(tmp.path(), e).unwrap();
        }
        let mut first = InitEvents::new(start(&api, &failed), "etcd-1", tmp.path(), now);
        first.look(now, true, None);
        first.look(now + 1, true, None);
        settle().await;
        let reasons = |api: &Kept| -> Vec<String> {
            api.events
                .lock()
                .unwrap()
                .iter()
                .filter_map(|e| e.reason.clone())
                .collect()
        };
        assert_eq!(reasons(&api), ["MemberReplaced", "JoinedAsLearner"]);
        let restarted = Counter::default();
        let mut again = InitEvents::new(start(&api, &restarted), "etcd-1", tmp.path(), now + 5);
        again.look(now + 5, true, None);
        settle().await;
        assert_eq!(reasons(&api), ["MemberReplaced", "JoinedAsLearner"]);
        assert_eq!(restarted.get(), 0, "AlreadyExists is not a failure");
        let event = &api.events.lock().unwrap()[0];
        let time = event.event_time.as_ref().map(|t| t.0.as_second());
        assert_eq!(
            time,
            Some(i64::try_from(now - 60).unwrap()),
            "dated when init acted"
        );
    }
}
