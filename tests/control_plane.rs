//! etcd-steward under a Kubernetes control plane: the project's test API server
//! (`tests/kube-apiserver/`: Kubernetes' own generic server, etcd3 storage and watch cache)
//! has the three loopback pods' client URLs as its `--etcd-servers`, and every act that
//! changes the data under it is judged through it, with Kubernetes' own code answering:
//!
//! - no list (consistent, or `resourceVersion=0` from the watch cache) serves a state the
//!   cluster no longer holds for longer than [`STALE`] after the cluster serves again;
//! - a watch opened before a restore ends, and a re-watch from its resource version gets
//!   410 Gone (the client re-lists, as client-go's reflector does);
//! - an object written after gets a resource version above every one served before;
//! - after `recover`, every object the survivor acknowledged is served;
//! - `/readyz` (its etcd check) passes again within [`READY`] of the cluster serving.
//!
//! The requests the API server failed during each act are counted and printed
//! (`control-plane:` lines; docs/operations/control-plane.md has the numbers).
//! etcd 3.5.30, whose etcdutl moves the revision forward (`--bump-revision`,
//! `--mark-compacted`): the jump is what keeps the watch cache right.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use harness::kube_apiserver::{EtcdAccess, KubeApiServer, Token};
use harness::loopback::{first_snapshot, BackedSet, Backups, Set};
use harness::Etcd;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const FORM: Duration = Duration::from_secs(60);
const ACT: Duration = Duration::from_secs(150);
/// How long after the cluster serves again a list may still answer a state it no longer
/// holds.
const STALE: Duration = Duration::from_secs(10);
/// How long after the cluster serves again `/readyz` may still fail.
const READY: Duration = Duration::from_secs(10);
/// How long after the cluster serves again a watch opened before a restore may stay open.
const WATCH_ENDS: Duration = Duration::from_secs(10);

/// The API server on a set's three pods, and its Pod objects in `default`.
struct Plane {
    api: KubeApiServer,
    pods: Api<Pod>,
}

impl Plane {
    async fn on(set: &Set) -> Plane {
        Plane::on_with(set, &[]).await
    }

    async fn on_with(set: &Set, more: &[&str]) -> Plane {
        let servers = (0..3).map(|o| set.client_url(o)).collect();
        let api = KubeApiServer::start_with(&EtcdAccess { servers, tls: None }, more)
            .await
            .unwrap();
        let pods = Api::namespaced(api.client(Token::Admin).unwrap(), "default");
        Plane { api, pods }
    }

    /// Creates Pod `name` (retrying what a client retries: 429 and 5xx); its resource
    /// version.
    async fn create(&self, name: &str) -> u64 {
        self.create_padded(name, 0).await
    }

    /// [`Plane::create`], the Pod carrying an annotation of `pad` bytes.
    async fn create_padded(&self, name: &str, pad: usize) -> u64 {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "control-plane-test"},
                "annotations": {"pad": "x".repeat(pad)}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }))
        .unwrap();
        let deadline = Instant::now() + FORM;
        loop {
            match self.pods.create(&PostParams::default(), &pod).await {
                Ok(p) => return rv(&p.metadata.resource_version),
                Err(e) if Instant::now() < deadline => {
                    eprintln!("create {name}: {e}; again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("create {name}: {e}\n{}", self.api.log()),
            }
        }
    }

    async fn create_all(&self, prefix: &str, n: usize) -> (BTreeSet<String>, u64) {
        let mut names = BTreeSet::new();
        let mut last = 0;
        for i in 0..n {
            let name = format!("{prefix}-{i:03}");
            last = last.max(self.create(&name).await);
            names.insert(name);
        }
        (names, last)
    }

    async fn delete(&self, name: &str) {
        self.pods.delete(name, &Default::default()).await.unwrap();
    }

    /// The names served and the list's resource version: a consistent list, or (`cache`)
    /// `resourceVersion=0`, served from the watch cache whatever etcd holds.
    async fn list(&self, cache: bool) -> Result<(BTreeSet<String>, u64), kube::Error> {
        let params = ListParams::default();
        let list = if cache {
            self.pods.list_metadata(&params.match_any()).await?
        } else {
            self.pods.list_metadata(&params).await?
        };
        let names = list
            .items
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        Ok((names, rv(&list.metadata.resource_version)))
    }
}

fn rv(v: &Option<String>) -> u64 {
    v.as_deref().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// What a poller saw: each answer (when, which list, the names) and the failures by
/// status code (0: no answer).
#[derive(Default)]
struct Seen {
    answers: Vec<(Instant, bool, BTreeSet<String>)>,
    failed: BTreeMap<u16, usize>,
    asked: usize,
}

/// Lists the Pods every 100 ms, consistent and from the cache in turn, until stopped.
struct Poller {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Poller {
    fn start(plane: &Plane) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let pods = plane.pods.clone();
        let (s, k) = (stop.clone(), seen.clone());
        let task = tokio::spawn(async move {
            let plane_pods = pods;
            let mut cache = false;
            while !s.load(Ordering::Relaxed) {
                let params = if cache {
                    ListParams::default().match_any()
                } else {
                    ListParams::default()
                };
                let answer =
                    tokio::time::timeout(Duration::from_secs(5), plane_pods.list_metadata(&params))
                        .await;
                {
                    let mut seen = k.lock().unwrap();
                    seen.asked += 1;
                    match answer {
                        Ok(Ok(list)) => {
                            let names = list
                                .items
                                .iter()
                                .filter_map(|p| p.metadata.name.clone())
                                .collect();
                            seen.answers.push((Instant::now(), cache, names));
                        }
                        Ok(Err(kube::Error::Api(status))) => {
                            *seen.failed.entry(status.code).or_default() += 1;
                        }
                        _ => *seen.failed.entry(0).or_default() += 1,
                    }
                }
                cache = !cache;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Poller { stop, seen, task }
    }

    async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        Arc::try_unwrap(self.seen)
            .ok()
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

/// How a watch opened before an act ended: when, and the status code of its last error
/// event (`None`: the stream just closed).
struct WatchEnd {
    at: Instant,
    code: Option<u16>,
}

fn watch_from(plane: &Plane, from: u64) -> tokio::task::JoinHandle<WatchEnd> {
    let pods = plane.pods.clone();
    tokio::spawn(async move {
        let params = WatchParams::default().timeout(290);
        let stream = match pods.watch(&params, &from.to_string()).await {
            Ok(s) => s,
            Err(kube::Error::Api(s)) => {
                return WatchEnd {
                    at: Instant::now(),
                    code: Some(s.code),
                }
            }
            Err(_) => {
                return WatchEnd {
                    at: Instant::now(),
                    code: Some(0),
                }
            }
        };
        let mut stream = stream.boxed();
        let mut code = None;
        loop {
            match stream.try_next().await {
                Ok(Some(WatchEvent::Error(e))) => code = Some(e.code),
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    code = code.or(Some(0));
                    break;
                }
            }
        }
        WatchEnd {
            at: Instant::now(),
            code,
        }
    })
}

/// The first answer of a watch from `from`: its error code, or `None` when it streams.
async fn rewatch_code(plane: &Plane, from: u64) -> Option<u16> {
    let params = WatchParams::default().timeout(5);
    match plane.pods.watch(&params, &from.to_string()).await {
        Err(kube::Error::Api(s)) => Some(s.code),
        Err(e) => panic!("re-watch from {from}: {e}"),
        Ok(stream) => {
            let mut stream = stream.boxed();
            match tokio::time::timeout(Duration::from_secs(8), stream.try_next()).await {
                Ok(Ok(Some(WatchEvent::Error(e)))) => Some(e.code),
                _ => None,
            }
        }
    }
}

/// What an act did to the API server, printed as one `control-plane:` line.
struct Report {
    act: &'static str,
    /// From the act's start until the cluster served again.
    act_took: Duration,
    /// From then until the last list that answered another state than the one held.
    stale_after: Duration,
    /// From then until `/readyz` passed.
    ready_after: Duration,
    /// From then until the watch opened before ended (`None`: no watch was watched).
    watch_ended_after: Option<Duration>,
    /// Answers, before the cluster served again, of a state it no longer holds (the watch
    /// cache answers `resourceVersion=0` lists from memory while etcd is away).
    stale_before: usize,
    failed: BTreeMap<u16, usize>,
    asked: usize,
}

impl Report {
    fn print(&self) {
        let failed: usize = self.failed.values().sum();
        println!(
            "control-plane: act={} took={:.1}s stale_after_serving={:.1}s readyz_after_serving={:.1}s \
             old_watch_ended_after_serving={} stale_answers_before_serving={} \
             failed_requests={failed}/{} by_code={:?}",
            self.act,
            self.act_took.as_secs_f64(),
            self.stale_after.as_secs_f64(),
            self.ready_after.as_secs_f64(),
            self.watch_ended_after
                .map_or("-".to_string(), |d| format!("{:.1}s", d.as_secs_f64())),
            self.stale_before,
            self.asked,
            self.failed,
        );
    }
}

/// After an act that started at `started` and whose cluster serves from `serving`: waits
/// until every list serves `expected` and `/readyz` passes, each within its bound, and
/// judges what the poller saw after `serving`.
async fn judged(
    act: &'static str,
    plane: &Plane,
    poller: Poller,
    started: Instant,
    serving: Instant,
    expected: &BTreeSet<String>,
) -> Report {
    let deadline = serving + STALE.max(READY) + Duration::from_secs(20);
    let mut ready_at = None;
    let mut fresh = (false, false);
    while ready_at.is_none() || !(fresh.0 && fresh.1) {
        if ready_at.is_none() && plane.api.readyz().await.is_some_and(|(c, _)| c == 200) {
            ready_at = Some(Instant::now());
        }
        fresh.0 = plane.list(false).await.is_ok_and(|(n, _)| n == *expected);
        fresh.1 = plane.list(true).await.is_ok_and(|(n, _)| n == *expected);
        assert!(
            Instant::now() < deadline,
            "{act}: the API server never served the cluster's state (consistent list {}, \
             cache {}, readyz {:?}); expected {expected:?}, got {:?} / {:?}\n{}",
            fresh.0,
            fresh.1,
            plane.api.readyz().await,
            plane.list(false).await.map(|l| l.0),
            plane.list(true).await.map(|l| l.0),
            plane.api.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two more seconds of lists: none may go back to another state.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = poller.stop().await;
    let last_stale = seen
        .answers
        .iter()
        .filter(|(at, _, names)| *at >= serving && names != expected)
        .map(|(at, _, _)| *at)
        .max();
    let stale_after = last_stale.map_or(Duration::ZERO, |at| at - serving);
    let after_fresh: Vec<_> = seen
        .answers
        .iter()
        .filter(|(at, _, _)| last_stale.is_none_or(|s| *at > s))
        .collect();
    assert!(
        !after_fresh.is_empty(),
        "{act}: the poller saw no answer after the last stale one"
    );
    let report = Report {
        act,
        act_took: serving - started,
        stale_after,
        ready_after: ready_at.unwrap().saturating_duration_since(serving),
        watch_ended_after: None,
        stale_before: seen
            .answers
            .iter()
            .filter(|(at, _, names)| *at < serving && names != expected)
            .count(),
        failed: seen.failed,
        asked: seen.asked,
    };
    assert!(
        report.stale_after <= STALE,
        "{act}: lists served a state the cluster no longer holds {:?} after it served again",
        report.stale_after
    );
    assert!(
        report.ready_after <= READY,
        "{act}: /readyz passed {:?} after the cluster served again",
        report.ready_after
    );
    report
}

/// A watch opened before a restore ended within [`WATCH_ENDS`] of the cluster serving
/// again, a re-watch from the resource version it had is 410 Gone, and a new object's
/// resource version is above every one served before.
async fn watchers_told(
    plane: &Plane,
    watch: tokio::task::JoinHandle<WatchEnd>,
    serving: Instant,
    served: u64,
    report: &mut Report,
) {
    let end = tokio::time::timeout(
        WATCH_ENDS.saturating_sub(serving.elapsed()) + Duration::from_secs(1),
        watch,
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{}: a watch opened before the restore was still open {WATCH_ENDS:?} after the \
             cluster served again",
            report.act
        )
    })
    .unwrap();
    report.watch_ended_after = Some(end.at.saturating_duration_since(serving));
    eprintln!(
        "{}: the old watch ended with code {:?}",
        report.act, end.code
    );
    assert_eq!(
        rewatch_code(plane, served).await,
        Some(410),
        "{}: a re-watch from resource version {served} (served before the restore) must be 410 Gone",
        report.act
    );
    let new = plane.create(&format!("{}-after", report.act)).await;
    assert!(
        new > served,
        "{}: an object written after got resource version {new}, not above the {served} served before",
        report.act
    );
}

/// `recover --yes` in pod 1, asked again while a wiped pod's sidecar is not up yet to say
/// it holds nothing ("did not answer").
async fn recover_yes(set: &mut Set) {
    let deadline = Instant::now() + FORM;
    loop {
        let cmd = set.steward_in(1, &["recover", "--yes", "--timeout=120s"]);
        let out = set.run_restarting(cmd).await;
        if out.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            err.contains("did not answer") && Instant::now() < deadline,
            "recover --yes: {err}\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn all_ready_voters(set: &mut Set) -> Instant {
    let deadline = Instant::now() + ACT;
    loop {
        set.restart_exited().unwrap();
        if set.all_linearizable(&[0, 1, 2], 3).await && set.all_ready(&[0, 1, 2]).await {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "not three ready voters after {ACT:?}\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `etcd-steward backup` through pod `o`'s member.
async fn backup_now(set: &Set, o: u32) {
    let out = tokio::process::Command::new(STEWARD)
        .arg("backup")
        .args(set.common_args(o))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "backup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn backed(store: &Path, more: &[&str]) -> BackedSet {
    let backups = Backups::file(store).with(more.iter().copied());
    let set = BackedSet::form(STEWARD, Etcd::V3_5Current, 3, &backups, FORM)
        .await
        .unwrap();
    first_snapshot(store, FORM).await;
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_volume_lost_the_api_server_serves_the_newest_backup_and_its_watchers_relist() {
    let store = tempfile::tempdir().unwrap();
    let mut set = backed(
        store.path(),
        &[
            "--backup-interval=1h",
            "--archive-interval=0",
            "--restore=latest",
        ],
    )
    .await;
    let plane = Plane::on(&set).await;
    let (kept, _) = plane.create_all("kept", 20).await;
    backup_now(&set, 0).await;
    // Written after the newest backup: the restore cannot have them.
    let (_, served) = plane.create_all("lost", 5).await;
    let watch = watch_from(&plane, served);
    let poller = Poller::start(&plane);
    let started = Instant::now();
    for o in 0..3 {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in 0..3 {
        set.start(o).unwrap();
    }
    let serving = all_ready_voters(&mut set).await;
    let mut report = judged("every-volume-lost", &plane, poller, started, serving, &kept).await;
    watchers_told(&plane, watch, serving, served, &mut report).await;
    report.print();
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_to_revision_the_api_server_serves_that_moment_and_its_watchers_relist() {
    let store = tempfile::tempdir().unwrap();
    let mut set = backed(
        store.path(),
        &[
            "--backup-interval=1h",
            "--archive-interval=1s",
            "--restore=never",
        ],
    )
    .await;
    let plane = Plane::on(&set).await;
    let (mut expected, moment) = plane.create_all("early", 12).await;
    // Later, someone deletes two and writes more.
    plane.delete("early-000").await;
    plane.delete("early-001").await;
    let (_, served) = plane.create_all("late", 6).await;
    let to = format!("--to-revision={moment}");
    // Once the archive holds the moment.
    let deadline = Instant::now() + FORM;
    while !set.steward(1, &["restore", &to]).await.status.success() {
        assert!(
            Instant::now() < deadline,
            "the archive never reached {moment}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let watch = watch_from(&plane, served);
    let poller = Poller::start(&plane);
    let started = Instant::now();
    let cmd = set.steward_in(1, &["restore", &to, "--yes", "--timeout=110s"]);
    let out = set.run_restarting(cmd).await;
    assert!(
        out.status.success(),
        "restore {to} --yes: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        set.dump()
    );
    let serving = all_ready_voters(&mut set).await;
    expected.retain(|n| n.starts_with("early-"));
    let mut report = judged(
        "restore-to-revision",
        &plane,
        poller,
        started,
        serving,
        &expected,
    )
    .await;
    watchers_told(&plane, watch, serving, served, &mut report).await;
    report.print();
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_after_a_majority_lost_the_api_server_serves_every_acknowledged_object() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Current, 3).await.unwrap();
    set.start_all(FORM).await.unwrap();
    let plane = Plane::on(&set).await;
    let (acknowledged, served) = plane.create_all("acked", 20).await;
    let poller = Poller::start(&plane);
    let started = Instant::now();
    for o in [0, 2] {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in [0, 2] {
        set.start(o).unwrap();
    }
    recover_yes(&mut set).await;
    let serving = all_ready_voters(&mut set).await;
    let report = judged("recover", &plane, poller, started, serving, &acknowledged).await;
    let new = plane.create("acked-after").await;
    assert!(
        new > served,
        "resource version {new} after recover, {served} before"
    );
    report.print();
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_replaced_the_api_server_serves_throughout() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Current, 3).await.unwrap();
    set.start_all(FORM).await.unwrap();
    let plane = Plane::on(&set).await;
    let (objects, served) = plane.create_all("obj", 20).await;
    let watch = watch_from(&plane, served);
    let poller = Poller::start(&plane);
    let started = Instant::now();
    set.kill(2).await.unwrap();
    set.wipe(2).unwrap();
    set.start(2).unwrap();
    let serving = all_ready_voters(&mut set).await;
    let report = judged(
        "member-replaced",
        &plane,
        poller,
        started,
        serving,
        &objects,
    )
    .await;
    // No restore: the watch opened before goes on, and sees what is written after.
    assert!(!watch.is_finished(), "a member replaced ended a watch");
    watch.abort();
    assert_eq!(
        rewatch_code(&plane, served).await,
        None,
        "a member replaced made resource version {served} too old"
    );
    report.print();
    set.shutdown().await;
}

/// The sidecar's `etcd_steward_defrag_last_freed_bytes` on pod `o`.
async fn freed(set: &Set, o: u32) -> f64 {
    let Some((_, text)) = set.http(o, "/metrics").await else {
        return 0.0;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("etcd_steward_defrag_last_freed_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defragmented_after_the_api_servers_compaction_the_api_server_serves_throughout() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Current, 3).await.unwrap();
    set.extra_args = vec!["--defrag-threshold=30%,2MiB".into()];
    set.start_all(FORM).await.unwrap();
    // The API server compacts etcd as kube-apiserver does (every 5 minutes by default).
    let plane = Plane::on_with(&set, &["--etcd-compaction-interval=2s"]).await;
    let (objects, _) = plane.create_all("kept", 10).await;
    let mut big = Vec::new();
    for i in 0..40 {
        let name = format!("big-{i:03}");
        plane.create_padded(&name, 200 << 10).await;
        big.push(name);
    }
    let served = plane.list(false).await.unwrap().1;
    let watch = watch_from(&plane, served);
    for name in &big {
        plane.delete(name).await;
    }
    let poller = Poller::start(&plane);
    let started = Instant::now();
    let deadline = Instant::now() + ACT;
    loop {
        let mut all = true;
        for o in 0..3 {
            all &= freed(&set, o).await > 4e6;
        }
        if all {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every member defragmented after the API server compacted\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let serving = Instant::now();
    let report = judged(
        "defragmentation",
        &plane,
        poller,
        started,
        serving,
        &objects,
    )
    .await;
    // Defragmentation changes no revision, but a member blocked while it defragments can
    // cut the API server's own etcd watch; resumed from a revision its 2-second compaction
    // already removed, the watch cache re-lists and ends its watchers (kube-apiserver's
    // default compaction, every 5 minutes, leaves far more room). Said, not failed: what
    // must hold is that every list served the cluster's state (judged above).
    if watch.is_finished() {
        let end = watch.await.unwrap();
        eprintln!(
            "defragmentation: a watch opened before ended (code {:?}) while the members defragmented",
            end.code
        );
    } else {
        watch.abort();
    }
    report.print();
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_snapshot_on_a_live_cluster_the_api_server_serves_it_and_its_watchers_relist() {
    let store = tempfile::tempdir().unwrap();
    let mut set = backed(
        store.path(),
        &[
            "--backup-interval=1h",
            "--archive-interval=0",
            "--restore=never",
        ],
    )
    .await;
    let plane = Plane::on(&set).await;
    let (expected, _) = plane.create_all("snap", 15).await;
    let out = tokio::process::Command::new(STEWARD)
        .arg("backup")
        .args(set.common_args(0))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let name = manifest["name"].as_str().unwrap().to_string();
    plane.delete("snap-000").await;
    let (_, served) = plane.create_all("after-snapshot", 5).await;
    let watch = watch_from(&plane, served);
    let poller = Poller::start(&plane);
    let started = Instant::now();
    let cmd = set.steward_in(
        1,
        &["restore", "--snapshot", &name, "--yes", "--timeout=110s"],
    );
    let out = set.run_restarting(cmd).await;
    assert!(
        out.status.success(),
        "restore --snapshot {name} --yes: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        set.dump()
    );
    let serving = all_ready_voters(&mut set).await;
    let mut report = judged(
        "restore-snapshot",
        &plane,
        poller,
        started,
        serving,
        &expected,
    )
    .await;
    watchers_told(&plane, watch, serving, served, &mut report).await;
    report.print();
    set.shutdown().await;
}

/// An hour of Events as kube-apiserver stores them: each with the 1-hour lease of
/// `--event-ttl`. `n` Events regarding Pods `obj-*`.
async fn post_events(plane: &Plane, n: usize) {
    use k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = Api::namespaced(plane.api.client(Token::Admin).unwrap(), "default");
    for i in 0..n {
        let e: Event = serde_json::from_value(serde_json::json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": format!("ev-{i:05}")},
            "eventTime": "2026-12-02T07:00:00.000000Z",
            "reportingController": "kubelet", "reportingInstance": "node-1",
            "action": "Started", "reason": "Started", "type": "Normal",
            "note": "Started container c",
            "regarding": {"kind": "Pod", "namespace": "default", "name": format!("obj-{:05}", i % 1000)},
        }))
        .unwrap();
        events.create(&PostParams::default(), &e).await.unwrap();
    }
}

/// BENCHMARKS.md, *Under a Kubernetes control plane*: 10,000 Pods (1 KiB annotation each) and
/// 3,600 Events with their leases written through the API server, then every volume lost
/// and the newest backup restored, a majority lost and `recover`, one member replaced: each
/// act's time to a serving cluster and to the API server serving the cluster's state, and
/// the API server's failed requests. Ignored (minutes): `cargo test --test control_plane --
/// --ignored --nocapture measure_`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_a_control_planes_data_through_every_act() {
    let store = tempfile::tempdir().unwrap();
    let mut set = backed(
        store.path(),
        &[
            "--backup-interval=1h",
            "--archive-interval=0",
            "--restore=latest",
        ],
    )
    .await;
    let plane = Plane::on(&set).await;
    let t = Instant::now();
    let mut objects = BTreeSet::new();
    for i in 0..10_000 {
        let name = format!("obj-{i:05}");
        plane.create_padded(&name, 1024).await;
        objects.insert(name);
    }
    post_events(&plane, 3600).await;
    println!(
        "control-plane-bench: wrote 10000 pods and 3600 events in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    backup_now(&set, 0).await;

    // Every volume lost, the newest backup restored.
    let served = plane.list(false).await.unwrap().1;
    let watch = watch_from(&plane, served);
    let poller = Poller::start(&plane);
    let started = Instant::now();
    for o in 0..3 {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in 0..3 {
        set.start(o).unwrap();
    }
    let serving = all_ready_voters(&mut set).await;
    let mut report = judged(
        "bench-every-volume-lost",
        &plane,
        poller,
        started,
        serving,
        &objects,
    )
    .await;
    watchers_told(&plane, watch, serving, served, &mut report).await;
    objects.insert("bench-every-volume-lost-after".into());
    report.print();

    // A majority lost, recover.
    let poller = Poller::start(&plane);
    let started = Instant::now();
    for o in [0, 2] {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in [0, 2] {
        set.start(o).unwrap();
    }
    recover_yes(&mut set).await;
    let serving = all_ready_voters(&mut set).await;
    judged("bench-recover", &plane, poller, started, serving, &objects)
        .await
        .print();

    // One member replaced.
    let poller = Poller::start(&plane);
    let started = Instant::now();
    set.kill(2).await.unwrap();
    set.wipe(2).unwrap();
    set.start(2).unwrap();
    let serving = all_ready_voters(&mut set).await;
    judged(
        "bench-member-replaced",
        &plane,
        poller,
        started,
        serving,
        &objects,
    )
    .await
    .print();
    set.shutdown().await;
}
