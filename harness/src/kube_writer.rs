//! A writer through Kubernetes' own API server (the project's test API server,
//! [`crate::kube_apiserver`]), writing as a control plane's clients do, and the checks of
//! what it wrote, read back through the API server:
//!
//! - **objects**: Pods `w-<i>` created one after another in [`NAMESPACE`], each counted only
//!   once the API server acknowledged it (a create retried after an answer was lost that
//!   finds its object already there, 409, counts: the earlier attempt was written);
//! - **Leases renewed as controllers do**: [`LEASES`] Leases, each renewed every 2 s by a
//!   leader election's read-modify-update (the update carries the resource version read; a
//!   conflict reads again);
//! - **Events with their leases**: an events.k8s.io/v1 Event every 250 ms, each written by the
//!   API server with the lease of its `--event-ttl` (one hour);
//! - **a watcher** following the Pods as client-go's reflector does: a list, then a watch from
//!   its resource version, re-watched from the last one seen when it ends, and listed again on
//!   410 Gone.
//!
//! [`KubeWriter::check`] then reads through the API server: every acknowledged object in a
//! consistent list and in the watch cache's (`resourceVersion=0`), every one seen by the
//! watcher, no resource version going backwards on the watch or between acknowledgements,
//! every Lease holding at least its last acknowledged renewal, every acknowledged Event
//! served. Its writes' times are a [`WriterReport`], so the chaos checker judges refused
//! writes as it does the etcd writer's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use tokio::time::Instant;

use crate::kube_apiserver::{KubeApiServer, Token};
use crate::writer::{wait_acked, WriterReport};
use crate::{Error, Result};

/// The namespace every object of the writer is in.
pub const NAMESPACE: &str = "chaos";

/// How many Leases are renewed.
pub const LEASES: usize = 3;

/// How often each Lease is renewed (a leader election's retry period).
pub const RENEW: Duration = Duration::from_secs(2);

/// How often an Event is created.
pub const EVENT_EVERY: Duration = Duration::from_millis(250);

/// A request with no answer within this is a failure (the etcd writer's time-out).
const ANSWER: Duration = Duration::from_millis(2500);

/// How long after healing the watch cache and the watcher may take to show every
/// acknowledged object.
pub const CATCH_UP: Duration = Duration::from_secs(10);

/// The name of the `i`-th object.
pub fn object_name(i: u64) -> String {
    format!("w-{i:08}")
}

/// The etcd key the API server stores the `i`-th object under.
pub fn write_key(i: u64) -> String {
    format!("/registry/pods/{NAMESPACE}/{}", object_name(i))
}

fn rv(v: Option<&String>) -> u64 {
    v.and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Failed requests, by what they were for.
type Failures = Arc<Mutex<BTreeMap<&'static str, u64>>>;

fn failed(f: &Failures, what: &'static str) {
    *f.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(what)
        .or_default() += 1;
}

/// What the watcher saw.
#[derive(Debug, Default, Clone)]
struct Watched {
    names: BTreeSet<String>,
    /// The highest resource version seen (an event's or a list's).
    last: u64,
    /// An event or list whose resource version was below one seen before: (before, then).
    backwards: Vec<(u64, u64)>,
    lists: u64,
    watches: u64,
    gone: u64,
}

/// One renewal the API server acknowledged: when it was for and the resource version given.
#[derive(Debug, Clone)]
struct Renewal {
    renew_time: k8s_openapi::jiff::Timestamp,
    rv: u64,
}

/// Told once to stop: a task's pause between requests ends at once.
#[derive(Clone)]
struct Stop(tokio::sync::watch::Receiver<bool>);

impl Stop {
    fn new() -> (tokio::sync::watch::Sender<bool>, Stop) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (tx, Stop(rx))
    }

    fn told(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits `d`, or less if told to stop meanwhile.
    async fn sleep(&mut self, d: Duration) {
        let _ = tokio::time::timeout(d, self.0.wait_for(|s| *s)).await;
    }

    /// Waits until told to stop.
    async fn wait(&mut self) {
        let _ = self.0.wait_for(|s| *s).await;
    }
}

/// A running writer; [`KubeWriter::stop`] ends it.
pub struct KubeWriter {
    stop: tokio::sync::watch::Sender<bool>,
    acked: Arc<AtomicU64>,
    objects: tokio::task::JoinHandle<WriterReport>,
    leases: Vec<tokio::task::JoinHandle<Vec<Renewal>>>,
    events: tokio::task::JoinHandle<Vec<String>>,
    watcher: tokio::task::JoinHandle<()>,
    watch_stop: tokio::sync::watch::Sender<bool>,
    watched: Arc<Mutex<Watched>>,
    failures: Failures,
    client: kube::Client,
}

/// What the writer stopped with, to check once the cluster is healed.
pub struct Written {
    report: WriterReport,
    renewals: Vec<Vec<Renewal>>,
    events: Vec<String>,
    watcher: tokio::task::JoinHandle<()>,
    watch_stop: tokio::sync::watch::Sender<bool>,
    watched: Arc<Mutex<Watched>>,
    failures: Failures,
    client: kube::Client,
}

impl KubeWriter {
    /// Starts writing through `api` (as its administrator); the report's times count from
    /// this call. The namespace needs no object of its own: the test API server admits
    /// objects in any.
    pub fn start(api: &KubeApiServer) -> Result<KubeWriter> {
        let client = api.client(Token::Admin)?;
        let started = Instant::now();
        let (stop, told) = Stop::new();
        let acked = Arc::new(AtomicU64::new(0));
        let failures: Failures = Arc::default();
        let watched: Arc<Mutex<Watched>> = Arc::default();
        let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let objects = tokio::spawn(create_loop(
            pods.clone(),
            started,
            told.clone(),
            acked.clone(),
            failures.clone(),
        ));
        let leases = (0..LEASES)
            .map(|n| {
                tokio::spawn(renew_loop(
                    Api::namespaced(client.clone(), NAMESPACE),
                    format!("controller-{n}"),
                    told.clone(),
                    failures.clone(),
                ))
            })
            .collect();
        let events = tokio::spawn(event_loop(
            Api::namespaced(client.clone(), NAMESPACE),
            told,
            failures.clone(),
        ));
        // The watcher runs on after the writers stop, until the check has seen it catch up.
        let (watch_stop, watch_told) = Stop::new();
        let watcher = tokio::spawn(watch_loop(
            pods,
            watch_told,
            watched.clone(),
            failures.clone(),
        ));
        Ok(KubeWriter {
            stop,
            acked,
            objects,
            leases,
            events,
            watcher,
            watch_stop,
            watched,
            failures,
            client,
        })
    }

    /// How many objects are acknowledged so far.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// Waits until `n` more objects than now are acknowledged.
    pub async fn wait_progress(&self, n: u64, timeout: Duration, what: &str) {
        wait_acked(&self.acked, n, timeout, "the API server writer", what).await;
    }

    /// Stops writing (the watcher goes on until [`Written::check`]).
    pub async fn stop(self) -> Written {
        let _ = self.stop.send(true);
        let report = self
            .objects
            .await
            .unwrap_or_else(|e| panic!("the object writer task: {e}"));
        let mut renewals = Vec::new();
        for l in self.leases {
            renewals.push(l.await.unwrap_or_else(|e| panic!("a lease task: {e}")));
        }
        let events = self
            .events
            .await
            .unwrap_or_else(|e| panic!("the event task: {e}"));
        Written {
            report,
            renewals,
            events,
            watcher: self.watcher,
            watch_stop: self.watch_stop,
            watched: self.watched,
            failures: self.failures,
            client: self.client,
        }
    }
}

impl Written {
    /// The objects' report, as the etcd writer's (its `revisions` are resource versions).
    pub fn report(&self) -> &WriterReport {
        &self.report
    }

    /// Reads everything back through the API server (once the cluster is healed) and stops
    /// the watcher.
    pub async fn check(self) -> KubeSeen {
        let acked: BTreeSet<String> = (0..self.report.acked).map(object_name).collect();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let mut seen = KubeSeen {
            acked: self.report.acked,
            ..KubeSeen::default()
        };
        // Resource versions between acknowledgements: each object written after another
        // was acknowledged gets a higher one.
        for w in self.report.revisions.windows(2) {
            if w[1] <= w[0] {
                seen.acked_backwards.push((w[0] as u64, w[1] as u64));
            }
        }
        // A consistent list: etcd's state (read through the API server).
        seen.unlisted = match names(&pods, false).await {
            Ok(names) => acked.difference(&names).cloned().collect(),
            Err(e) => {
                seen.unread.push(format!("a consistent list: {e}"));
                Vec::new()
            }
        };
        // The watch cache and the watcher: caught up within the bound.
        let deadline = Instant::now() + CATCH_UP;
        loop {
            let cached = names(&pods, true).await;
            let watched = self
                .watched
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .names
                .clone();
            let uncached: Vec<String> = match &cached {
                Ok(c) => acked.difference(c).cloned().collect(),
                Err(_) => acked.iter().cloned().collect(),
            };
            let unwatched: Vec<String> = acked.difference(&watched).cloned().collect();
            if (uncached.is_empty() && unwatched.is_empty()) || Instant::now() >= deadline {
                if let Err(e) = cached {
                    seen.unread
                        .push(format!("a list from the watch cache: {e}"));
                }
                seen.uncached = uncached;
                seen.unwatched = unwatched;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = self.watch_stop.send(true);
        let _ = self.watcher.await;
        {
            let w = self
                .watched
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            seen.watch_backwards = w.backwards.clone();
            seen.watch_lists = w.lists;
            seen.watches = w.watches;
            seen.watch_gone = w.gone;
        }
        // Each Lease holds its last acknowledged renewal, or a later one.
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NAMESPACE);
        for (n, renewals) in self.renewals.iter().enumerate() {
            let name = format!("controller-{n}");
            let mut l = LeaseSeen {
                name: name.clone(),
                renewals: renewals.len(),
                ..LeaseSeen::default()
            };
            for w in renewals.windows(2) {
                if w[1].rv <= w[0].rv {
                    l.backwards += 1;
                }
            }
            match answer(leases.get(&name)).await {
                Ok(served) => {
                    let time = served
                        .spec
                        .as_ref()
                        .and_then(|s| s.renew_time.as_ref())
                        .map(|t| t.0);
                    l.served_rv = rv(served.metadata.resource_version.as_ref());
                    if let Some(last) = renewals.last() {
                        l.last_acked_rv = last.rv;
                        l.lost = time.is_none_or(|t| t < last.renew_time) || l.served_rv < last.rv;
                    }
                }
                Err(e) => seen.unread.push(format!("Lease {name}: {e}")),
            }
            seen.leases.push(l);
        }
        // Every acknowledged Event served.
        let events: Api<Event> = Api::namespaced(self.client.clone(), NAMESPACE);
        seen.events_acked = self.events.len();
        match answer(events.list_metadata(&ListParams::default())).await {
            Ok(list) => {
                let served: BTreeSet<String> = list
                    .items
                    .into_iter()
                    .filter_map(|e| e.metadata.name)
                    .collect();
                seen.events_missing = self
                    .events
                    .iter()
                    .filter(|e| !served.contains(*e))
                    .cloned()
                    .collect();
            }
            Err(e) => seen.unread.push(format!("the Events: {e}")),
        }
        seen.failed = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(k, v)| ((*k).to_string(), *v))
            .collect();
        seen
    }
}

/// A Lease as the check found it.
#[derive(Debug, Clone, Default)]
pub struct LeaseSeen {
    /// Its name.
    pub name: String,
    /// Renewals the API server acknowledged.
    pub renewals: usize,
    /// Acknowledged renewals whose resource version was not above the one before.
    pub backwards: usize,
    /// The resource version of the last acknowledged renewal.
    pub last_acked_rv: u64,
    /// The resource version served after healing.
    pub served_rv: u64,
    /// The Lease served holds less than its last acknowledged renewal.
    pub lost: bool,
}

/// What the API server served after healing, against what it acknowledged.
#[derive(Debug, Clone, Default)]
pub struct KubeSeen {
    /// Objects acknowledged.
    pub acked: u64,
    /// Acknowledged objects missing from a consistent list.
    pub unlisted: Vec<String>,
    /// Acknowledged objects missing from the watch cache's list [`CATCH_UP`] after healing.
    pub uncached: Vec<String>,
    /// Acknowledged objects the watcher never saw, [`CATCH_UP`] after healing.
    pub unwatched: Vec<String>,
    /// Consecutive acknowledgements whose resource version went backwards.
    pub acked_backwards: Vec<(u64, u64)>,
    /// The watcher's events or lists below a resource version it had seen: (before, then).
    pub watch_backwards: Vec<(u64, u64)>,
    /// How many lists, watches and 410 Gone answers the watcher had.
    pub watch_lists: u64,
    /// Watches opened.
    pub watches: u64,
    /// 410 Gone answers.
    pub watch_gone: u64,
    /// The Leases.
    pub leases: Vec<LeaseSeen>,
    /// Events acknowledged.
    pub events_acked: usize,
    /// Acknowledged Events not served.
    pub events_missing: Vec<String>,
    /// Reads of the check that failed.
    pub unread: Vec<String>,
    /// Requests the API server failed during the run (or that got no answer in 2.5 s), by
    /// what they were for.
    pub failed: BTreeMap<String, u64>,
}

impl KubeSeen {
    /// What the API server got wrong, in sentences.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let few = |names: &[String]| names.iter().take(5).cloned().collect::<Vec<_>>();
        if !self.unlisted.is_empty() {
            v.push(format!(
                "{} acknowledged objects missing from a consistent list through the API server: {:?}…",
                self.unlisted.len(),
                few(&self.unlisted)
            ));
        }
        if !self.uncached.is_empty() {
            v.push(format!(
                "{} acknowledged objects missing from the watch cache {CATCH_UP:?} after healing: {:?}…",
                self.uncached.len(),
                few(&self.uncached)
            ));
        }
        if !self.unwatched.is_empty() {
            v.push(format!(
                "{} acknowledged objects never seen by a watcher that re-watched and re-listed: {:?}…",
                self.unwatched.len(),
                few(&self.unwatched)
            ));
        }
        if !self.acked_backwards.is_empty() {
            v.push(format!(
                "objects written after others got lower resource versions: {:?}",
                self.acked_backwards
            ));
        }
        if !self.watch_backwards.is_empty() {
            v.push(format!(
                "the watcher was served resource versions below ones it had seen: {:?}",
                self.watch_backwards
            ));
        }
        for l in &self.leases {
            if l.lost {
                v.push(format!(
                    "Lease {} lost its last acknowledged renewal (resource version {}, served {})",
                    l.name, l.last_acked_rv, l.served_rv
                ));
            }
            if l.backwards > 0 {
                v.push(format!(
                    "Lease {}: {} renewals got a resource version not above the one before",
                    l.name, l.backwards
                ));
            }
            if l.renewals == 0 {
                v.push(format!("Lease {} was never renewed", l.name));
            }
        }
        if !self.events_missing.is_empty() {
            v.push(format!(
                "{} of {} acknowledged Events not served: {:?}…",
                self.events_missing.len(),
                self.events_acked,
                few(&self.events_missing)
            ));
        }
        for u in &self.unread {
            v.push(format!("after healing the API server did not answer {u}"));
        }
        v
    }
}

/// A request's answer within [`ANSWER`].
async fn answer<T>(
    f: impl std::future::Future<Output = std::result::Result<T, kube::Error>>,
) -> Result<T> {
    match tokio::time::timeout(ANSWER, f).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(Error::Failed(e.to_string())),
        Err(_) => Err(Error::Failed(format!("no answer within {ANSWER:?}"))),
    }
}

/// The names of the Pods served, by a consistent list or (`cache`) the watch cache's.
async fn names(pods: &Api<Pod>, cache: bool) -> Result<BTreeSet<String>> {
    let params = ListParams::default();
    let params = if cache { params.match_any() } else { params };
    let list = answer(pods.list_metadata(&params)).await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect())
}

fn pod(i: u64) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": object_name(i), "labels": {"app": "chaos-writer"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }))
    .unwrap_or_else(|e| unreachable!("a Pod of fixed fields: {e}"))
}

async fn create_loop(
    pods: Api<Pod>,
    started: Instant,
    stop: Stop,
    acked: Arc<AtomicU64>,
    failures: Failures,
) -> WriterReport {
    let mut report = WriterReport::new();
    let mut last_ack = started;
    let mut i = 0u64;
    while !stop.told() {
        let name = object_name(i);
        let written = match answer(pods.create(&PostParams::default(), &pod(i))).await {
            Ok(p) => Ok(rv(p.metadata.resource_version.as_ref())),
            // An earlier attempt whose answer was lost was written.
            Err(e) if e.to_string().contains("already exists") => answer(pods.get(&name))
                .await
                .map(|p| rv(p.metadata.resource_version.as_ref())),
            Err(e) => Err(e),
        };
        match written {
            Ok(version) => {
                report.revisions.push(version as i64);
                report.acknowledged(started, &mut last_ack);
                i += 1;
                acked.store(i, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => {
                report.failures += 1;
                report.last_error = format!("creating {name}: {e}");
                failed(&failures, "create a Pod");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    report.acked = i;
    report
}

fn lease(name: &str, holder: &str, at: k8s_openapi::jiff::Timestamp) -> Lease {
    let time = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(at);
    let mut l: Lease = serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }))
    .unwrap_or_else(|e| unreachable!("a Lease of fixed fields: {e}"));
    if let Some(spec) = l.spec.as_mut() {
        spec.acquire_time = Some(time.clone());
        spec.renew_time = Some(time);
    }
    l
}

/// Renews Lease `name` every [`RENEW`] as a leader election does: read it, set its renew
/// time, update it with the resource version read. The renewals acknowledged.
async fn renew_loop(
    leases: Api<Lease>,
    name: String,
    mut stop: Stop,
    failures: Failures,
) -> Vec<Renewal> {
    let holder = format!("{name}-holder");
    let mut renewals = Vec::new();
    while !stop.told() {
        let now = k8s_openapi::jiff::Timestamp::now();
        let result = match answer(leases.get_opt(&name)).await {
            Ok(None) => {
                answer(leases.create(&PostParams::default(), &lease(&name, &holder, now))).await
            }
            Ok(Some(mut l)) => {
                if let Some(spec) = l.spec.as_mut() {
                    spec.renew_time = Some(
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now),
                    );
                }
                answer(leases.replace(&name, &PostParams::default(), &l)).await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(l) => renewals.push(Renewal {
                // As stored: the API server keeps microseconds.
                renew_time: l.spec.and_then(|s| s.renew_time).map_or(now, |t| t.0),
                rv: rv(l.metadata.resource_version.as_ref()),
            }),
            Err(_) => failed(&failures, "renew a Lease"),
        }
        stop.sleep(RENEW).await;
    }
    renewals
}

/// Creates an Event every [`EVENT_EVERY`], regarding the newest objects; the names of those
/// acknowledged.
async fn event_loop(events: Api<Event>, mut stop: Stop, failures: Failures) -> Vec<String> {
    let mut acked = Vec::new();
    let mut i = 0u64;
    while !stop.told() {
        let name = format!("ev-{i:06}");
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut e: Event = serde_json::from_value(serde_json::json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name},
            "reportingController": "kubelet", "reportingInstance": "node-1",
            "action": "Started", "reason": "Started", "type": "Normal",
            "note": "Started container c",
            "regarding": {"kind": "Pod", "namespace": NAMESPACE, "name": object_name(i)},
        }))
        .unwrap_or_else(|e| unreachable!("an Event of fixed fields: {e}"));
        e.event_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            now,
        ));
        match answer(events.create(&PostParams::default(), &e)).await {
            Ok(_) => {
                acked.push(name);
                i += 1;
            }
            Err(e) if e.to_string().contains("already exists") => {
                acked.push(name);
                i += 1;
            }
            Err(_) => failed(&failures, "create an Event"),
        }
        stop.sleep(EVENT_EVERY).await;
    }
    acked
}

/// Follows the Pods as client-go's reflector does: list, watch from the list's resource
/// version, re-watch from the last one seen when a watch ends, list again on 410 Gone.
async fn watch_loop(
    pods: Api<Pod>,
    mut stop: Stop,
    watched: Arc<Mutex<Watched>>,
    failures: Failures,
) {
    // A list answers at its own resource version, not below what was seen; a watch's
    // events come strictly above it.
    let seen = |w: &Mutex<Watched>, names: Vec<String>, version: u64, list: bool| {
        let mut w = w.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let behind = if list {
            version < w.last
        } else {
            version <= w.last
        };
        if behind {
            let last = w.last;
            w.backwards.push((last, version));
        }
        w.last = w.last.max(version);
        w.names.extend(names);
    };
    let mut from: Option<u64> = None;
    while !stop.told() {
        let Some(version) = from else {
            match answer(pods.list_metadata(&ListParams::default())).await {
                Ok(list) => {
                    let version = rv(list.metadata.resource_version.as_ref());
                    watched
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .lists += 1;
                    let names = list.items.into_iter().filter_map(|p| p.metadata.name);
                    seen(&watched, names.collect(), version, true);
                    from = Some(version);
                }
                Err(_) => {
                    failed(&failures, "list (watcher)");
                    stop.sleep(Duration::from_millis(200)).await;
                }
            }
            continue;
        };
        let params = WatchParams::default().timeout(10);
        let stream = match answer(pods.watch(&params, &version.to_string())).await {
            Ok(s) => s,
            Err(e) => {
                failed(&failures, "watch");
                if e.to_string().contains("410") || e.to_string().contains("too old") {
                    from = None;
                }
                stop.sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .watches += 1;
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                () = stop.wait() => None,
            };
            let Some(next) = next else {
                break;
            };
            match next {
                Ok(WatchEvent::Added(p) | WatchEvent::Modified(p) | WatchEvent::Deleted(p)) => {
                    let version = rv(p.metadata.resource_version.as_ref());
                    seen(
                        &watched,
                        p.metadata.name.into_iter().collect(),
                        version,
                        false,
                    );
                    from = Some(version);
                }
                Ok(WatchEvent::Bookmark(b)) => {
                    let version: u64 = b.metadata.resource_version.parse().unwrap_or(0);
                    seen(&watched, Vec::new(), version, true);
                    from = Some(version);
                }
                Ok(WatchEvent::Error(e)) => {
                    if e.code == 410 {
                        watched
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .gone += 1;
                        from = None;
                    }
                    break;
                }
                Err(_) => {
                    failed(&failures, "watch");
                    break;
                }
            }
        }
    }
}
