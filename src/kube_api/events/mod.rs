//! Kubernetes Events (`events.k8s.io/v1`) for the agent's consequential acts, posted on the
//! pod that acted (`regarding`: the Pod; `reportingController: etcd-steward`;
//! `reportingInstance`: the pod's name), so that `kubectl describe pod` and
//! `kubectl get events` tell an incident before anyone reads a container's log.
//!
//! - [`Reason`] is the fixed set of reasons, each Normal or Warning.
//! - [`Series`] (pure) aggregates repeats the Kubernetes way: an act repeated with the same
//!   reason and note within [`SERIES_WINDOW`] of the last one joins its Event's `series`
//!   (a count and the last time seen), sent at most every [`HEARTBEAT`]; a ten-minute wait
//!   is one Event with a growing count, not six hundred.
//! - [`Events`] is the handle the roles post through: [`Events::post`] never waits (a
//!   bounded queue; a full one drops the act and counts it), and one task makes the calls,
//!   each within the API's call time-out. A slow, refusing or absent API server delays no
//!   decision; every call that fails is counted (`etcd_steward_events_failed_total`), and an
//!   Event the API did not take is created again under its name until it does
//!   (`retry`).

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use super::{ApiWorkload, KubeAccess, KubeError};

mod retry;
mod series;

use retry::Retries;
pub use series::{Call, Series};

/// `reportingController` of every Event the agent posts.
pub const CONTROLLER: &str = "etcd-steward";

/// A repeat within this long of the last occurrence joins its Event's series (client-go's
/// events recorder uses the same window).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// A series' count is sent at most this often.
pub const HEARTBEAT: Duration = Duration::from_secs(30);

/// Acts waiting for the posting task; beyond this they are dropped and counted.
const QUEUE: usize = 256;

/// The API keeps a note up to 1 KiB.
const NOTE_BYTES: usize = 1024;

/// Why an Event is posted: the fixed set the README documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    Bootstrapped,
    JoinedAsLearner,
    Promoted,
    MemberReplaced,
    DataSetAside,
    PeerURLUpdated,
    RestoredFromBackup,
    RecoveryStarted,
    RecoveredFromSurvivor,
    ScaledIn,
    LeftCluster,
    LearnerRemoved,
    Defragmented,
    NospaceDisarmed,
    UpgradeHeld,
    MemberDiverged,
    MemberRebuilt,
    BackupFailing,
    RestoreHeld,
    WaitingTooLong,
}

impl Reason {
    pub const ALL: [Reason; 20] = [
        Reason::Bootstrapped,
        Reason::JoinedAsLearner,
        Reason::Promoted,
        Reason::MemberReplaced,
        Reason::DataSetAside,
        Reason::PeerURLUpdated,
        Reason::RestoredFromBackup,
        Reason::RecoveryStarted,
        Reason::RecoveredFromSurvivor,
        Reason::ScaledIn,
        Reason::LeftCluster,
        Reason::LearnerRemoved,
        Reason::Defragmented,
        Reason::NospaceDisarmed,
        Reason::UpgradeHeld,
        Reason::MemberDiverged,
        Reason::MemberRebuilt,
        Reason::BackupFailing,
        Reason::RestoreHeld,
        Reason::WaitingTooLong,
    ];

    /// The Event's `reason` (and `action`).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Bootstrapped => "Bootstrapped",
            Reason::JoinedAsLearner => "JoinedAsLearner",
            Reason::Promoted => "Promoted",
            Reason::MemberReplaced => "MemberReplaced",
            Reason::DataSetAside => "DataSetAside",
            Reason::PeerURLUpdated => "PeerURLUpdated",
            Reason::RestoredFromBackup => "RestoredFromBackup",
            Reason::RecoveryStarted => "RecoveryStarted",
            Reason::RecoveredFromSurvivor => "RecoveredFromSurvivor",
            Reason::ScaledIn => "ScaledIn",
            Reason::LeftCluster => "LeftCluster",
            Reason::LearnerRemoved => "LearnerRemoved",
            Reason::Defragmented => "Defragmented",
            Reason::NospaceDisarmed => "NospaceDisarmed",
            Reason::UpgradeHeld => "UpgradeHeld",
            Reason::MemberDiverged => "MemberDiverged",
            Reason::MemberRebuilt => "MemberRebuilt",
            Reason::BackupFailing => "BackupFailing",
            Reason::RestoreHeld => "RestoreHeld",
            Reason::WaitingTooLong => "WaitingTooLong",
        }
    }

    /// Warning: a person should look (data set aside, a restore, a recovery, something held
    /// or failing); Normal otherwise.
    pub fn is_warning(self) -> bool {
        matches!(
            self,
            Reason::MemberReplaced
                | Reason::DataSetAside
                | Reason::RestoredFromBackup
                | Reason::RecoveryStarted
                | Reason::RecoveredFromSurvivor
                | Reason::UpgradeHeld
                | Reason::MemberDiverged
                | Reason::MemberRebuilt
                | Reason::BackupFailing
                | Reason::RestoreHeld
                | Reason::WaitingTooLong
        )
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One act to post: its reason, and the note (the log's sentence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Act {
    pub reason: Reason,
    pub note: String,
}

/// The pod the Events regard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regarding {
    pub namespace: String,
    pub pod: String,
    /// The pod's UID when known (`POD_UID` from the downward API), so that an Event of an
    /// earlier pod of the same name is not shown on this one.
    pub uid: Option<String>,
}

/// The Event a [`Call::Create`] posts.
pub fn event(regarding: &Regarding, name: &str, act: &Act, time: SystemTime) -> Event {
    let mut note = act.note.clone();
    if note.len() > NOTE_BYTES {
        let mut cut = NOTE_BYTES - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    Event {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(regarding.namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(micro_time(time)),
        action: Some(act.reason.as_str().to_string()),
        reason: Some(act.reason.as_str().to_string()),
        note: Some(note),
        type_: Some(
            if act.reason.is_warning() {
                "Warning"
            } else {
                "Normal"
            }
            .to_string(),
        ),
        reporting_controller: Some(CONTROLLER.to_string()),
        reporting_instance: Some(regarding.pod.clone()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(regarding.pod.clone()),
            namespace: Some(regarding.namespace.clone()),
            uid: regarding.uid.clone(),
            ..ObjectReference::default()
        }),
        ..Event::default()
    }
}

fn micro_time(t: SystemTime) -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::try_from(t).unwrap_or_default())
}

/// The two calls the posting task makes.
pub trait EventApi: Send + Sync + 'static {
    fn create(&self, event: Event) -> impl Future<Output = Result<(), KubeError>> + Send;
    fn update_series(
        &self,
        name: &str,
        series: EventSeries,
    ) -> impl Future<Output = Result<(), KubeError>> + Send;
}

/// The real API, with the same access (URL, token, CA) as the rest of the agent's calls.
pub struct ApiEvents {
    api: ApiWorkload,
}

impl ApiEvents {
    pub fn new(access: &KubeAccess) -> Result<ApiEvents, KubeError> {
        Ok(ApiEvents {
            api: ApiWorkload::new(access)?,
        })
    }
}

impl EventApi for ApiEvents {
    async fn create(&self, event: Event) -> Result<(), KubeError> {
        let ns = self.api.access.namespace.clone();
        let path = format!("/apis/events.k8s.io/v1/namespaces/{ns}/events");
        self.api
            .call(&path, |c| async move {
                Api::<Event>::namespaced(c, &ns)
                    .create(&PostParams::default(), &event)
                    .await
            })
            .await
            .map(|_| ())
    }

    async fn update_series(&self, name: &str, series: EventSeries) -> Result<(), KubeError> {
        let ns = self.api.access.namespace.clone();
        let path = format!("/apis/events.k8s.io/v1/namespaces/{ns}/events/{name}");
        let patch = serde_json::json!({ "series": series });
        self.api
            .call(&path, |c| async move {
                Api::<Event>::namespaced(c, &ns)
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            })
            .await
            .map(|_| ())
    }
}

/// Where the roles post their acts. Cloning shares the queue.
#[derive(Debug, Clone)]
pub struct Events {
    tx: Option<mpsc::Sender<Posting>>,
    failed: Counter,
    /// Every act posted, kept and counted whether or not Events are on.
    acts: super::acts::Acts,
}

impl Default for Events {
    fn default() -> Events {
        Events::off()
    }
}

impl Events {
    /// Posts nothing (`--events=false`, or no Kubernetes API).
    pub fn off() -> Events {
        Events {
            tx: None,
            failed: Counter::default(),
            acts: super::acts::Acts::default(),
        }
    }

    /// Starts the posting task on the current runtime. `failed` counts every act not
    /// posted (a refused or unanswered call, a full queue).
    pub fn start<A: EventApi>(api: A, regarding: Regarding, failed: Counter) -> Events {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(api, regarding, rx, failed.clone()));
        Events {
            tx: Some(tx),
            failed,
            acts: super::acts::Acts::default(),
        }
    }

    /// The same handle, keeping and counting its acts in `acts`.
    pub fn with_acts(mut self, acts: super::acts::Acts) -> Events {
        self.acts = acts;
        self
    }

    /// Where the acts posted are kept and counted.
    pub fn acts(&self) -> &super::acts::Acts {
        &self.acts
    }

    /// Keeps and counts `reason` with `note`, and queues it for the API; never waits.
    pub fn post(&self, reason: Reason, note: impl Into<String>) {
        let note = note.into();
        // The sidecar's own acts, for `status --history` and `etcd_steward_acts_total`
        // (init's come from its journal: not kept here twice).
        self.acts.record(reason.as_str(), &note, SystemTime::now());
        self.queue(Posting {
            act: Act { reason, note },
            name: None,
            at: None,
        });
    }

    /// Queues `reason` with `note`, as the Event `name` if it is a new one, happened `at`;
    /// never waits. The same act posted again under the same name (by a restarted sidecar)
    /// is the API's AlreadyExists: harmless, not counted as a failure.
    pub fn post_named(&self, reason: Reason, note: String, name: String, at: SystemTime) {
        self.queue(Posting {
            act: Act { reason, note },
            name: Some(name),
            at: Some(at),
        });
    }

    fn queue(&self, posting: Posting) {
        let Some(tx) = &self.tx else { return };
        if tx.try_send(posting).is_err() {
            self.failed.inc();
        }
    }

    /// Whether acts are posted at all.
    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }
}

/// An act on its way to the posting task.
#[derive(Debug)]
struct Posting {
    act: Act,
    name: Option<String>,
    /// When it happened, if not now.
    at: Option<SystemTime>,
}

/// tokio's clock (paused in tests), as a std `Instant`.
fn monotonic() -> Instant {
    tokio::time::Instant::now().into_std()
}

async fn run<A: EventApi>(
    api: A,
    regarding: Regarding,
    mut rx: mpsc::Receiver<Posting>,
    failed: Counter,
) {
    let mut series = Series::new(&regarding.pod);
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retries: Retries<Call> = Retries::default();
    let mut warned = false;
    // Every sender dropped and every act queued taken: the counts not sent yet go now, then
    // the task ends. (Ending as soon as the queue was found closed and empty lost them
    // whenever the handle went while acts were still queued: the last act was taken, and
    // the flush below never ran.)
    let mut stopped = false;
    loop {
        let next = retries.next().map(tokio::time::Instant::from_std);
        let (calls, again) = tokio::select! {
            act = rx.recv() => match act {
                Some(p) => {
                    let wall = p.at.unwrap_or_else(SystemTime::now);
                    (series.record_named(p.act, p.name, monotonic(), wall).into_iter().collect(), Vec::new())
                }
                None => {
                    stopped = true;
                    (series.due(monotonic() + HEARTBEAT), Vec::new())
                }
            },
            _ = heartbeat.tick() => (series.due(monotonic()), Vec::new()),
            _ = tokio::time::sleep_until(next.unwrap_or_else(tokio::time::Instant::now)), if next.is_some() => {
                (Vec::new(), retries.due(monotonic()))
            }
        };
        let fresh = calls.into_iter().map(|c| (c, None));
        let again = again.into_iter().map(|r| (r.item.clone(), Some(r)));
        for (call, retry) in fresh.chain(again) {
            let result = match &call {
                Call::Create { name, act, time } => {
                    match api.create(event(&regarding, name, act, *time)).await {
                        // Posted before, under the name the act always has.
                        Err(KubeError::Status { code: 409, .. }) => Ok(()),
                        other => other,
                    }
                }
                Call::Patch {
                    name,
                    count,
                    last_observed,
                } => {
                    let series = EventSeries {
                        count: i32::try_from(*count).unwrap_or(i32::MAX),
                        last_observed_time: micro_time(*last_observed),
                    };
                    api.update_series(name, series).await
                }
            };
            let e = match result {
                Ok(()) => {
                    warned = false;
                    continue;
                }
                Err(e) => e,
            };
            failed.inc();
            if !warned {
                tracing::warn!(error = %e, "a Kubernetes Event could not be posted (counted in etcd_steward_events_failed_total; tried again until the API takes it, for up to an hour; said once until one is posted)");
                warned = true;
            }
            // A create is tried again under its name (a later count is sent by the next
            // heartbeat); one the API found malformed would be refused again.
            let malformed = matches!(
                e,
                KubeError::Status {
                    code: 400 | 422,
                    ..
                }
            );
            if !matches!(call, Call::Create { .. }) || malformed {
                continue;
            }
            let given_up = match retry {
                None => retries.failed(call, monotonic()),
                Some(r) => retries.failed_again(r, monotonic()),
            };
            if let Some(Call::Create { name, act, .. }) = given_up {
                tracing::warn!(event = %name, reason = %act.reason, "a Kubernetes Event was given up after an hour of tries, or for newer ones");
            }
        }
        if stopped {
            return;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000 + secs)
    }

    fn waiting() -> Act {
        Act {
            reason: Reason::WaitingTooLong,
            note: "waiting for etcd-2 to prepare".into(),
        }
    }

    #[test]
    fn the_event_regards_the_pod_and_keeps_a_long_note_within_the_apis_limit() {
        let r = Regarding {
            namespace: "db".into(),
            pod: "etcd-1".into(),
            uid: Some("u-1".into()),
        };
        let act = Act {
            reason: Reason::MemberReplaced,
            note: "é".repeat(2000),
        };
        let e = event(&r, "etcd-1.abc", &act, at(0));
        assert!(e.note.as_ref().unwrap().len() <= NOTE_BYTES);
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reporting_controller.as_deref(), Some(CONTROLLER));
        assert_eq!(e.reporting_instance.as_deref(), Some("etcd-1"));
        let regarding = e.regarding.unwrap();
        assert_eq!(regarding.kind.as_deref(), Some("Pod"));
        assert_eq!(regarding.name.as_deref(), Some("etcd-1"));
        assert_eq!(regarding.uid.as_deref(), Some("u-1"));
        let json = serde_json::to_value(event(&r, "etcd-1.abc", &waiting(), at(0))).unwrap();
        assert_eq!(json["eventTime"], "2026-11-18T11:06:40.000000Z");
        assert_eq!(json["type"], "Warning");
        let promoted = Act {
            reason: Reason::Promoted,
            note: "promoted".into(),
        };
        assert_eq!(
            event(&r, "n", &promoted, at(0)).type_.as_deref(),
            Some("Normal")
        );
    }

    #[test]
    fn every_reason_has_its_own_name() {
        let names: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len());
    }

    /// Records each call and answers it at once.
    #[derive(Clone, Default)]
    struct Recorded(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl EventApi for Recorded {
        async fn create(&self, event: Event) -> Result<(), KubeError> {
            let reason = event.reason.unwrap_or_default();
            self.0.lock().unwrap().push(format!("create {reason}"));
            Ok(())
        }
        async fn update_series(&self, _: &str, series: EventSeries) -> Result<(), KubeError> {
            self.0
                .lock()
                .unwrap()
                .push(format!("series {}", series.count));
            Ok(())
        }
    }

    #[tokio::test]
    async fn repeats_still_queued_when_the_poster_stops_are_in_the_last_count_sent() {
        let api = Recorded::default();
        let regarding = Regarding {
            namespace: "db".into(),
            pod: "etcd-1".into(),
            uid: None,
        };
        let events = Events::start(api.clone(), regarding, Counter::default());
        for _ in 0..5 {
            events.post(waiting().reason, waiting().note);
        }
        // Dropped with the five acts still queued: the task has not run yet.
        drop(events);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            *api.0.lock().unwrap(),
            ["create WaitingTooLong", "series 5"]
        );
    }
}
