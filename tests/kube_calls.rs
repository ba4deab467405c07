//! The agent's Kubernetes calls against a real API server: the project's test API server
//! (`tests/kube-apiserver/`, started by `harness::kube_apiserver`), Kubernetes' own generic
//! server and etcd3 storage, over https with its CA and a bearer token, authorizing each
//! call (an administrator, a reader that may only get/list/watch, a nobody refused
//! everything with 403), validating each Event as kube-apiserver does and giving every
//! write a new resource version. What a client creates is what the agent reads: the
//! StatefulSet and Pod objects are created, merge-patched and deleted through `kube`.
//!
//! - Scale-in on five loopback pods whose members the API server stores in: spec.replicas 5
//!   with every Pod object present removes nothing; with nobody's token (403) nothing is
//!   removed and the leader says why; spec.replicas 5 → 3 with pods 3 and 4 deleted (and a
//!   Pod named like ordinal 4 of another set in their place) removes ordinals 4 then 3 with
//!   a reader's token, the cluster serving; the ScaledIn Events the reader may not create
//!   are created once the token may. `leave --if-scaled-in` is a no-op for a kept ordinal.
//! - Events: an act is an Event the server accepted, regarding the real Pod (its UID); a
//!   repeat is a merge patch of its series that the server accepted; a note over 1 KiB is
//!   cut by the agent (the server refuses it whole); 403 is counted and never waited on; an
//!   Event already under its name is the server's 409 AlreadyExists, harmless, and its
//!   series is the agent's to patch.
//! - `init`'s Events: a lost volume is a MemberReplaced Event on that pod's real Pod object,
//!   and a restarted sidecar's second post of it is the server's 409, not a failure.
//!
//! What a real server cannot be made to do here (a 500, an API that hangs or drops its
//! connections) stays with `harness::fake_kube` (tests/events.rs, tests/scale_in.rs,
//! tests/init_events.rs; docs/TESTING.md, *Which tests use which Kubernetes API*).
//! etcd 3.5.30 only (the calls do not depend on etcd's release).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use etcd_steward::kube_api::events::{
    self, Act, ApiEvents, EventApi, Events, Reason, Regarding, CONTROLLER,
};
use etcd_steward::kube_api::{KubeAccess, KubeError};
use harness::kube_apiserver::{EtcdAccess, KubeApiServer, Token};
use harness::loopback::{Set, SERVICE};
use harness::{wait_for, wait_for_or, Etcd};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use prometheus_client::metrics::counter::Counter;
use serde_json::json;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const WAIT: Duration = Duration::from_secs(60);
/// Long enough for several looks of the API (every second) and ticks of the leader.
const QUIET: Duration = Duration::from_secs(4);
const NS: &str = "default";

// ---- the API server and its objects ---------------------------------------------------------

/// A one-member etcd on 127.0.0.1 for an API server to store in; killed when dropped.
struct PlainEtcd {
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
    url: String,
}

impl PlainEtcd {
    fn start() -> PlainEtcd {
        let dir = tempfile::tempdir().unwrap();
        // Both bound at once: two different ports.
        let ports: Vec<std::net::TcpListener> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let port = |i: usize| ports[i].local_addr().unwrap().port();
        let (url, peer) = (
            format!("http://127.0.0.1:{}", port(0)),
            format!("http://127.0.0.1:{}", port(1)),
        );
        drop(ports);
        let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
        let child = tokio::process::Command::new(Etcd::V3_5Current.bin())
            .arg("--name=solo")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=solo={peer}"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        PlainEtcd {
            _child: child,
            _dir: dir,
            url,
        }
    }
}

/// The API server on `pods`' members (their client URLs as its `--etcd-servers`).
async fn api_on(set: &Set, pods: &[u32]) -> KubeApiServer {
    assert!(set.pki.is_none(), "plain etcd client URLs only");
    let servers = pods.iter().map(|o| set.client_url(*o)).collect();
    KubeApiServer::start(&EtcdAccess { servers, tls: None })
        .await
        .unwrap()
}

/// The agent's access to `api` as `token` (its file), trusting the server's CA.
fn access(api: &KubeApiServer, token_file: &Path) -> KubeAccess {
    KubeAccess {
        url: api.url.clone(),
        token_file: token_file.to_path_buf(),
        ca_file: api.ca_file(),
        namespace: NS.into(),
        statefulset: SERVICE.into(),
    }
}

/// The options that give the agent `api`, with the token in `token_file`.
fn kube_args(api: &KubeApiServer, token_file: &Path) -> Vec<String> {
    vec![
        format!("--kube-api-url={}", api.url),
        format!("--kube-token-file={}", token_file.display()),
        format!("--kube-ca-file={}", api.ca_file().display()),
    ]
}

/// `token_file` now holds `token` (renamed over, as the kubelet rotates a projected token).
fn use_token(api: &KubeApiServer, token: Token, token_file: &Path) {
    let staged = token_file.with_extension("new");
    std::fs::copy(api.token_file(token), &staged).unwrap();
    std::fs::rename(&staged, token_file).unwrap();
}

/// The labels of set `instance`'s pods (its `spec.selector.matchLabels`).
fn set_labels(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "etcd".to_string()),
        (
            "app.kubernetes.io/instance".to_string(),
            instance.to_string(),
        ),
    ])
}

fn statefulset(replicas: i32) -> StatefulSet {
    let labels = set_labels(SERVICE);
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": SERVICE, "namespace": NS, "labels": labels},
        "spec": {"replicas": replicas, "serviceName": SERVICE, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "etcd", "image": "etcd-steward:test"}]}}},
    }))
    .unwrap()
}

fn pod_object(name: &str, labels: &BTreeMap<String, String>) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "etcd", "image": "etcd-steward:test"}]},
    }))
    .unwrap()
}

/// Creates Pod `name` with `labels`; its UID.
async fn create_pod(pods: &Api<Pod>, name: &str, labels: &BTreeMap<String, String>) -> String {
    let p = pods
        .create(&PostParams::default(), &pod_object(name, labels))
        .await
        .unwrap_or_else(|e| panic!("creating Pod {name}: {e}"));
    p.metadata.uid.unwrap()
}

fn rv(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    meta.resource_version.as_deref().unwrap().parse().unwrap()
}

/// The Events of the namespace, as the server holds them (none when it does not answer).
async fn events_held(admin: &Api<Event>) -> Vec<Event> {
    admin
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn reason_of(e: &Event) -> &str {
    e.reason.as_deref().unwrap_or_default()
}

fn note_of(e: &Event) -> &str {
    e.note.as_deref().unwrap_or_default()
}

fn regarding_name(e: &Event) -> &str {
    e.regarding
        .as_ref()
        .and_then(|r| r.name.as_deref())
        .unwrap_or_default()
}

// ---- the loopback set --------------------------------------------------------------------------

fn ordinals(set: &Set, members: &[etcd_client::Member]) -> Vec<u32> {
    (0..5)
        .filter(|o| {
            let url = set.peer_url(*o);
            members.iter().any(|m| m.peer_urls().contains(&url))
        })
        .collect()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Whether one log line of `pods` holds every one of `words`.
fn said(set: &Set, pods: &[u32], words: &[&str]) -> bool {
    pods.iter().any(|o| {
        set.logs(*o)
            .lines()
            .any(|l| words.iter().all(|w| l.contains(w)))
    })
}

/// The pods' last log lines and the API server's log, for a failure report.
fn dump(set: &Set, api: &KubeApiServer) -> String {
    format!("{}\n--- API server ---\n{}", set.dump(), api.log())
}

/// The sum over `pods` of the counter `name` (its `_total` line).
async fn counted(set: &Set, pods: &[u32], name: &str) -> u64 {
    let prefix = format!("{name}_total ");
    let mut total = 0;
    for o in pods {
        if let Some((_, body)) = set.http(*o, "/metrics").await {
            total += body
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

// ---- scale-in ----------------------------------------------------------------------------------

async fn through_the_real_api_scaled_from_5_to_3_the_leader_removes_ordinals_4_then_3(etcd: Etcd) {
    let mut set = Set::new(STEWARD, etcd, 5).await.unwrap();
    set.start_all(WAIT).await.unwrap();
    set.put_keys("k", 20).await.unwrap();
    // The API server stores in the members that stay.
    let api = api_on(&set, &[0, 1, 2]).await;
    let admin = api.client(Token::Admin).unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let events: Api<Event> = Api::namespaced(admin, NS);
    let created = sets
        .create(&PostParams::default(), &statefulset(5))
        .await
        .unwrap();
    for o in 0..5 {
        create_pod(&pods, &format!("{SERVICE}-{o}"), &set_labels(SERVICE)).await;
    }
    create_pod(
        &pods,
        "web-0",
        &BTreeMap::from([("app.kubernetes.io/name".into(), "web".into())]),
    )
    .await;

    // Pods 3 and 4 restart (their Pod objects stay); the sidecars now ask the API, as a
    // reader: scale-in only reads.
    set.kill(3).await.unwrap();
    set.kill(4).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    use_token(&api, Token::Reader, &token);
    set.extra_args = ["--scale-in".to_string(), "--scale-in-interval=1s".into()]
        .into_iter()
        .chain(kube_args(&api, &token))
        .collect();
    for o in 0..3 {
        set.kill_sidecar(o).await;
        set.start_sidecar(o).unwrap();
    }
    let dump = || dump(&set, &api);
    // spec.replicas 5, a Pod for every ordinal (listed by the set's labels: not web-0): a
    // restart, not a scale-in.
    wait_for_or(
        WAIT,
        "the leader's sidecar reading the StatefulSet and its pods with the reader's token",
        || async {
            said(
                &set,
                &[0, 1, 2],
                &[
                    "the StatefulSet as the API has it",
                    "\"replicas\":5",
                    "{0, 1, 2, 3, 4}",
                ],
            )
        },
        dump,
    )
    .await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        ordinals(&set, &set.members(0).await.unwrap()),
        [0, 1, 2, 3, 4],
        "{}",
        dump()
    );
    let out = set.steward(1, &["leave", "--if-scaled-in"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("not scaled in"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Nobody's token: every call refused with 403. The leader says so, and while it lasts
    // spec.replicas 3 with pods 3 and 4 gone removes nothing.
    use_token(&api, Token::Nobody, &token);
    wait_for_or(
        WAIT,
        "the leader saying the API refused it",
        || async {
            said(
                &set,
                &[0, 1, 2],
                &["scale-in: no answer from the Kubernetes API", "403"],
            )
        },
        dump,
    )
    .await;
    let patched = sets
        .patch(
            SERVICE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.replicas, Some(3));
    assert!(
        rv(&patched.metadata) > rv(&created.metadata),
        "a new resource version: {:?} after {:?}",
        patched.metadata.resource_version,
        created.metadata.resource_version
    );
    for o in [3, 4] {
        pods.delete(&format!("{SERVICE}-{o}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    // A debugging copy named like ordinal 4, of another set (not this set's labels): it
    // does not keep ordinal 4, as pods are listed by the set's matchLabels.
    create_pod(&pods, &format!("{SERVICE}-4"), &set_labels("etcd-debug")).await;
    let out = set.steward(4, &["leave", "--if-scaled-in"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("403") && stderr(&out).contains("nothing was done"),
        "{}",
        stderr(&out)
    );
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        ordinals(&set, &set.members(0).await.unwrap()),
        [0, 1, 2, 3, 4],
        "removed while the API refused\n{}",
        dump()
    );

    // The reader's token again: ordinal 4 goes first, then 3.
    use_token(&api, Token::Reader, &token);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = ordinals(&set, &set.members(0).await.unwrap());
        assert!(
            seen.contains(&3) || !seen.contains(&4),
            "ordinal 3 removed before 4: {seen:?}"
        );
        if seen == [0, 1, 2] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "ordinals 3 and 4 removed within {WAIT:?}, still {seen:?}\n{}",
            dump()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(said(
        &set,
        &[0, 1, 2],
        &["scale-in: the Kubernetes API answers again"]
    ));
    wait_for_or(
        WAIT,
        "pods 0, 1 and 2 serve linearizable reads as three voters",
        || set.all_linearizable(&[0, 1, 2], 3),
        dump,
    )
    .await;
    set.put_keys("after", 10).await.unwrap();
    for o in 0..3 {
        assert_eq!(set.count_keys_on(o, "k/").await.unwrap(), 20);
    }
    assert_eq!(
        counted(&set, &[0, 1, 2], "etcd_steward_scale_in_removals").await,
        2
    );
    // The reader may not create Events: each removal's ScaledIn was refused (403) and
    // counted, and is tried again.
    let scaled_in = |held: &[Event]| {
        held.iter()
            .filter(|e| reason_of(e) == "ScaledIn")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(scaled_in(&events_held(&events).await).is_empty());
    assert!(counted(&set, &[0, 1, 2], "etcd_steward_events_failed").await >= 2);

    // The administrator's token: the refused ScaledIn Events are created, on the pod whose
    // sidecar removed the members.
    use_token(&api, Token::Admin, &token);
    wait_for_or(
        WAIT,
        "the two ScaledIn Events created once the token may",
        || async { scaled_in(&events_held(&events).await).len() == 2 },
        dump,
    )
    .await;
    for e in scaled_in(&events_held(&events).await) {
        let pod = regarding_name(&e).to_string();
        assert!(
            ["etcd-0", "etcd-1", "etcd-2"].contains(&pod.as_str()),
            "posted by a running pod: {e:?}"
        );
        assert_eq!(e.reporting_controller.as_deref(), Some(CONTROLLER));
        assert_eq!(e.reporting_instance.as_deref(), Some(pod.as_str()));
        assert!(note_of(&e).contains("scale-in: removed member"), "{e:?}");
    }
    api.stop().await;
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_through_the_real_api_3_5_current() {
    through_the_real_api_scaled_from_5_to_3_the_leader_removes_ordinals_4_then_3(Etcd::V3_5Current)
        .await;
}

// ---- Events ------------------------------------------------------------------------------------

/// An API server on its own etcd, and the Pod the Events regard (`etcd-1`, its UID).
struct EventsPlane {
    api: KubeApiServer,
    _etcd: PlainEtcd,
    regarding: Regarding,
    held: Api<Event>,
}

impl EventsPlane {
    async fn start() -> EventsPlane {
        let etcd = PlainEtcd::start();
        let api = KubeApiServer::start(&EtcdAccess {
            servers: vec![etcd.url.clone()],
            tls: None,
        })
        .await
        .unwrap();
        let admin = api.client(Token::Admin).unwrap();
        let uid = create_pod(
            &Api::namespaced(admin.clone(), NS),
            "etcd-1",
            &set_labels(SERVICE),
        )
        .await;
        EventsPlane {
            api,
            _etcd: etcd,
            regarding: Regarding {
                namespace: NS.into(),
                pod: "etcd-1".into(),
                uid: Some(uid),
            },
            held: Api::namespaced(admin, NS),
        }
    }

    fn api_events(&self, token: Token) -> ApiEvents {
        ApiEvents::new(&access(&self.api, &self.api.token_file(token))).unwrap()
    }

    /// The agent's poster, as `token`.
    fn events(&self, token: Token, failed: &Counter) -> Events {
        Events::start(
            self.api_events(token),
            self.regarding.clone(),
            failed.clone(),
        )
    }

    async fn held(&self) -> Vec<Event> {
        events_held(&self.held).await
    }

    /// Waits until the server holds an Event `reason`; it.
    async fn held_with(&self, reason: &str) -> Event {
        wait_for_or(
            Duration::from_secs(20),
            &format!("a {reason} Event"),
            || async { self.held().await.iter().any(|e| reason_of(e) == reason) },
            || self.api.log(),
        )
        .await;
        self.held()
            .await
            .into_iter()
            .find(|e| reason_of(e) == reason)
            .unwrap()
    }
}

#[tokio::test]
async fn an_act_is_an_event_the_real_api_server_accepted_regarding_the_real_pod() {
    let plane = EventsPlane::start().await;
    let failed = Counter::default();
    let events = plane.events(Token::Admin, &failed);
    events.post(
        Reason::MemberReplaced,
        "member 8e9e05c52164694d of etcd-1 replaced: its volume was empty",
    );
    events.post(Reason::Promoted, "etcd-1's learner promoted to voter");
    let replaced = plane.held_with("MemberReplaced").await;
    let promoted = plane.held_with("Promoted").await;
    assert_eq!(replaced.action.as_deref(), Some("MemberReplaced"));
    assert_eq!(replaced.type_.as_deref(), Some("Warning"));
    assert_eq!(
        note_of(&replaced),
        "member 8e9e05c52164694d of etcd-1 replaced: its volume was empty"
    );
    assert_eq!(replaced.reporting_controller.as_deref(), Some(CONTROLLER));
    assert_eq!(replaced.reporting_instance.as_deref(), Some("etcd-1"));
    let regarding = replaced.regarding.clone().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Pod"));
    assert_eq!(regarding.name.as_deref(), Some("etcd-1"));
    assert_eq!(regarding.namespace.as_deref(), Some(NS));
    assert_eq!(regarding.uid, plane.regarding.uid, "the real Pod's UID");
    assert!(replaced.event_time.is_some());
    assert!(replaced.metadata.uid.is_some(), "the server's own UID");
    assert!(replaced
        .metadata
        .name
        .as_deref()
        .unwrap()
        .starts_with("etcd-1."));
    assert_eq!(promoted.type_.as_deref(), Some("Normal"));
    assert!(replaced.series.is_none() && promoted.series.is_none());
    assert_eq!(plane.held().await.len(), 2);
    assert_eq!(failed.get(), 0);
}

#[tokio::test]
async fn a_repeated_act_is_one_event_whose_series_the_real_api_server_took_as_a_merge_patch() {
    let plane = EventsPlane::start().await;
    let failed = Counter::default();
    let events = plane.events(Token::Admin, &failed);
    let wait = "waiting over 5 minutes: forming a new cluster: waiting for etcd-2 to prepare";
    events.post(Reason::WaitingTooLong, wait);
    let first = plane.held_with("WaitingTooLong").await;
    assert!(first.series.is_none());
    for _ in 0..4 {
        events.post(Reason::WaitingTooLong, wait);
    }
    // The count not sent yet goes when the poster stops (else at the next heartbeat).
    drop(events);
    wait_for_or(
        Duration::from_secs(20),
        "the series to count 5",
        || async {
            plane
                .held()
                .await
                .first()
                .and_then(|e| e.series.as_ref())
                .is_some_and(|s| s.count == 5)
        },
        || plane.api.log(),
    )
    .await;
    let held = plane.held().await;
    assert_eq!(held.len(), 1, "one Event: {held:#?}");
    let after = &held[0];
    assert_eq!(after.metadata.name, first.metadata.name);
    assert!(
        rv(&after.metadata) > rv(&first.metadata),
        "the patch is a new resource version: {:?} after {:?}",
        after.metadata.resource_version,
        first.metadata.resource_version
    );
    let series = after.series.as_ref().unwrap();
    assert!(series.last_observed_time.0 >= first.event_time.as_ref().unwrap().0);
    assert_eq!(
        after.event_time, first.event_time,
        "only the series changed"
    );
    assert_eq!(failed.get(), 0);
}

#[tokio::test]
async fn a_note_over_1_kib_is_cut_by_the_agent_and_accepted_where_the_whole_is_refused() {
    let plane = EventsPlane::start().await;
    let long = "é".repeat(1500);
    // The server refuses the whole note (kube-apiserver's 1 KiB limit)…
    let mut whole = events::event(
        &plane.regarding,
        "etcd-1.whole-note",
        &Act {
            reason: Reason::DataSetAside,
            note: String::new(),
        },
        SystemTime::now(),
    );
    whole.note = Some(long.clone());
    let refused = plane.api_events(Token::Admin).create(whole).await;
    assert!(
        matches!(&refused, Err(KubeError::Status { code: 422, message, .. }) if message.contains("note")),
        "{refused:?}"
    );
    // …and takes what the agent posts: cut within 1 KiB, on a character's boundary.
    let failed = Counter::default();
    let events = plane.events(Token::Admin, &failed);
    events.post(Reason::DataSetAside, long.clone());
    let e = plane.held_with("DataSetAside").await;
    let note = note_of(&e);
    assert!(note.len() <= 1024, "{} bytes", note.len());
    assert!(note.len() > 1000, "{} bytes", note.len());
    assert!(note.ends_with("...") && long.starts_with(note.trim_end_matches("...")));
    assert_eq!(failed.get(), 0);
}

#[tokio::test]
async fn with_no_rights_every_post_is_the_real_403_counted_and_none_waits() {
    let plane = EventsPlane::start().await;
    let act = Act {
        reason: Reason::DataSetAside,
        note: "data set aside".into(),
    };
    // The server's refusal, as the agent's client receives it: nobody may do anything, a
    // reader may not create.
    for token in [Token::Nobody, Token::Reader] {
        let e = events::event(&plane.regarding, "etcd-1.refused", &act, SystemTime::now());
        let refused = plane.api_events(token).create(e).await;
        assert!(
            matches!(refused, Err(KubeError::Status { code: 403, .. })),
            "{token:?}: {refused:?}"
        );
    }
    let failed = Counter::default();
    let events = plane.events(Token::Nobody, &failed);
    let started = Instant::now();
    for i in 0..1000 {
        events.post(Reason::DataSetAside, format!("data set aside {i}"));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_millis(200), "posting took {took:?}");
    wait_for(Duration::from_secs(30), "1000 refusals counted", || async {
        failed.get() >= 1000
    })
    .await;
    assert!(plane.held().await.is_empty());
}

#[tokio::test]
async fn an_event_already_under_its_name_is_the_real_already_exists_harmless_and_its_series_ours() {
    let plane = EventsPlane::start().await;
    let at = SystemTime::now() - Duration::from_secs(60);
    let act = Act {
        reason: Reason::Bootstrapped,
        note: "formed a new cluster of 3".into(),
    };
    let name = "etcd-1.19a0c0ffee-0123456789abcdef";
    // A sidecar before this one posted the act under its name.
    let before = plane
        .held
        .create(
            &PostParams::default(),
            &events::event(&plane.regarding, name, &act, at),
        )
        .await
        .unwrap();
    let again = plane
        .api_events(Token::Admin)
        .create(events::event(&plane.regarding, name, &act, at))
        .await;
    assert!(
        matches!(&again, Err(KubeError::Status { code: 409, message, .. }) if message.contains("already exists")),
        "{again:?}"
    );

    let failed = Counter::default();
    let events = plane.events(Token::Admin, &failed);
    events.post_named(act.reason, act.note.clone(), name.into(), at);
    // Posted after it: once it is held, the first was answered.
    events.post(Reason::Promoted, "etcd-1's learner promoted to voter");
    plane.held_with("Promoted").await;
    assert_eq!(failed.get(), 0, "AlreadyExists is no failure");
    let held = plane.held().await;
    assert_eq!(held.len(), 2, "no second copy: {held:#?}");
    let same = held
        .iter()
        .find(|e| e.metadata.name.as_deref() == Some(name))
        .unwrap();
    assert_eq!(
        same.metadata.resource_version,
        before.metadata.resource_version
    );

    // The act again: the Event under that name is this poster's, its series patched.
    events.post_named(act.reason, act.note.clone(), name.into(), at);
    drop(events);
    wait_for_or(
        Duration::from_secs(20),
        "the existing Event's series to count 2",
        || async {
            plane.held().await.iter().any(|e| {
                e.metadata.name.as_deref() == Some(name)
                    && e.series.as_ref().is_some_and(|s| s.count == 2)
            })
        },
        || plane.api.log(),
    )
    .await;
    assert_eq!(failed.get(), 0);
}

// ---- init's Events -----------------------------------------------------------------------------

/// Pod 2's volume lost: its init replaces the stale member and joins as a learner, and its
/// sidecar posts both on pod 2's real Pod object; a restarted sidecar posts its journal
/// again under the same names, which the server answers 409 AlreadyExists: no second copy,
/// no failure counted.
async fn a_lost_volume_is_a_member_replaced_event_on_the_real_pod_object(etcd: Etcd) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.start_all(WAIT).await.unwrap();
    set.put_keys("k", 20).await.unwrap();
    // The API server stores in the two members that keep their volumes.
    let api = api_on(&set, &[0, 1]).await;
    let admin = api.client(Token::Admin).unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let events: Api<Event> = Api::namespaced(admin, NS);
    for o in 0..2 {
        create_pod(&pods, &format!("{SERVICE}-{o}"), &set_labels(SERVICE)).await;
    }
    let uid = create_pod(&pods, &format!("{SERVICE}-2"), &set_labels(SERVICE)).await;

    let stale = format!("{:x}", set.member_id(2).await.unwrap());
    set.kill(2).await.unwrap();
    set.wipe(2).unwrap();
    set.extra_args = kube_args(&api, &api.token_file(Token::Admin));
    set.extra_args.push(format!("--pod-uid={uid}"));
    set.start(2).unwrap();
    set.wait_ready(&[0, 1, 2], 3, WAIT).await.unwrap();
    let on_2 = |held: Vec<Event>, reason: &str| {
        held.into_iter()
            .filter(|e| reason_of(e) == reason && regarding_name(e) == "etcd-2")
            .collect::<Vec<_>>()
    };
    wait_for_or(
        WAIT,
        "MemberReplaced and JoinedAsLearner on etcd-2",
        || async {
            let held = events_held(&events).await;
            !on_2(held.clone(), "MemberReplaced").is_empty()
                && !on_2(held, "JoinedAsLearner").is_empty()
        },
        || dump(&set, &api),
    )
    .await;
    let replaced = on_2(events_held(&events).await, "MemberReplaced");
    assert_eq!(replaced.len(), 1, "{replaced:#?}");
    let replaced = &replaced[0];
    assert_eq!(replaced.type_.as_deref(), Some("Warning"));
    assert!(
        note_of(replaced).contains(&stale) && note_of(replaced).contains("joins as a new learner"),
        "{replaced:?}"
    );
    assert_eq!(replaced.reporting_instance.as_deref(), Some("etcd-2"));
    assert_eq!(
        replaced.regarding.as_ref().unwrap().uid.as_deref(),
        Some(uid.as_str()),
        "the real Pod's UID"
    );

    let names = |held: Vec<Event>| {
        held.into_iter()
            .map(|e| (e.metadata.name, e.metadata.resource_version))
            .collect::<Vec<_>>()
    };
    let before = names(events_held(&events).await);
    set.kill_sidecar(2).await;
    set.start_sidecar(2).unwrap();
    wait_for(WAIT, "the restarted sidecar serves", || async {
        set.http(2, "/healthz").await.is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        names(events_held(&events).await),
        before,
        "a restarted sidecar changes no Event"
    );
    assert_eq!(
        counted(&set, &[2], "etcd_steward_events_failed").await,
        0,
        "the server's AlreadyExists counted as a failure\n{}",
        dump(&set, &api)
    );
    api.stop().await;
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_events_on_the_real_pod_3_5_current() {
    a_lost_volume_is_a_member_replaced_event_on_the_real_pod_object(Etcd::V3_5Current).await;
}
