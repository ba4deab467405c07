//! A fake Kubernetes API server for scale-in: it answers, as a real API server does, a GET
//! of an apps/v1 StatefulSet (a v1 `Status` 404 for a set it does not hold) and a v1
//! PodList of the namespace, honouring an equality-based `labelSelector`
//! (`k=v,k2=v2`). Beside the set's pods it holds a stray pod that does not carry the set's
//! labels ([`FakeKube::set_stray`]), so that a client that lists every pod of the
//! namespace is caught. It also takes `events.k8s.io/v1` Events (a POST validated as the
//! API server validates one, a JSON merge patch of its series) and keeps them
//! ([`FakeKube::events`]). Plain HTTP, no authentication.
//!
//! A real API server runs in the tests too ([`crate::kube_apiserver`], the project's test
//! API server on Kubernetes' own libraries; tests/kube_calls.rs proves the agent's calls
//! against it). The fake stays for what that server cannot be made to do: answer 500 or
//! any status to Events on demand ([`FakeKube::refuse_events`]), go silent (connections
//! dropped unanswered, kept ones hung: [`FakeKube::set_silent`]), count the requests by
//! path ([`FakeKube::requests`]) and show the bearer token sent ([`FakeKube::bearer`]); and
//! for scenarios where an API must be up before any etcd is (the real server stores in
//! etcd), or must be served to Docker pods (tests/fault.rs) without a build of its own.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;

use crate::{Error, Result};

/// The labels of the set's pods (`spec.selector.matchLabels`).
fn match_labels(set: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "etcd".to_string()),
        ("app.kubernetes.io/instance".to_string(), set.to_string()),
    ])
}

#[derive(Default)]
struct Held {
    replicas: u32,
    pods: Vec<u32>,
    stray: Option<String>,
    silent: bool,
    /// Requests answered, by path.
    requests: HashMap<String, usize>,
    /// The bearer token of the last request (`None`: it had none).
    bearer: Option<String>,
    /// The `events.k8s.io/v1` Events created, as stored (series updates merged in), in
    /// the order they were created.
    events: Vec<serde_json::Value>,
    /// Answer every Event call with this status (`None`: accept them).
    refuse_events: Option<u16>,
}

struct Shared {
    namespace: String,
    set: String,
    held: Mutex<Held>,
}

impl Shared {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The fake API, served until dropped.
pub struct FakeKube {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeKube {
    /// Serves on `bind` (e.g. 127.0.0.1:0 or 0.0.0.0:0); namespace and the set's name.
    /// It holds `spec.replicas: 0` and no pod until [`FakeKube::set`], and a stray pod
    /// `web-7` of another workload.
    pub async fn start(bind: SocketAddr, namespace: &str, set: &str) -> Result<FakeKube> {
        let shared = Arc::new(Shared {
            namespace: namespace.to_string(),
            set: set.to_string(),
            held: Mutex::new(Held {
                stray: Some("web-7".into()),
                ..Held::default()
            }),
        });
        let app = Router::new()
            .route(
                "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}",
                get(statefulset),
            )
            .route("/api/v1/namespaces/{ns}/pods", get(pods))
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events",
                axum::routing::post(create_event),
            )
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events/{name}",
                axum::routing::patch(patch_event),
            )
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(Error::io(format!("fake Kubernetes API: bind {bind}")))?;
        let addr = listener
            .local_addr()
            .map_err(Error::io("fake Kubernetes API: local address"))?;
        let listener = SilentListener {
            inner: listener,
            shared: shared.clone(),
        };
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeKube { shared, addr, task })
    }

    /// Where it serves.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// spec.replicas and the ordinals that have a pod.
    pub fn set(&self, replicas: u32, pods: &[u32]) {
        let mut h = self.shared.held();
        h.replicas = replicas;
        h.pods = pods.to_vec();
    }

    /// Stop answering (connections refused or hung) / answer again.
    pub fn set_silent(&self, silent: bool) {
        self.shared.held().silent = silent;
    }

    /// The stray pod of the namespace: this name, labels that are not the set's (a
    /// debugging copy, another workload); `None`: no stray pod. May carry a name of the
    /// set's form (`<set>-<n>`): only a list narrowed to the set's labels tells it apart.
    pub fn set_stray(&self, name: Option<&str>) {
        self.shared.held().stray = name.map(str::to_string);
    }

    /// The Events created so far (series updates merged in), oldest first.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.shared.held().events.clone()
    }

    /// Answer every Event call with `code` (e.g. 403, as an API without the RBAC does);
    /// `None`: accept them again.
    pub fn refuse_events(&self, code: Option<u16>) {
        self.shared.held().refuse_events = code;
    }

    /// The bearer token of the last request, `None` when it had none.
    pub fn bearer(&self) -> Option<String> {
        self.shared.held().bearer.clone()
    }

    /// How many requests for `path` (e.g. `/api/v1/namespaces/default/pods`) were
    /// answered; every path with `None`.
    pub fn requests(&self, path: Option<&str>) -> usize {
        let h = self.shared.held();
        match path {
            Some(p) => h.requests.get(p).copied().unwrap_or(0),
            None => h.requests.values().sum(),
        }
    }
}

/// Accepts connections, and drops them at once while the API is silent.
struct SilentListener {
    inner: tokio::net::TcpListener,
    shared: Arc<Shared>,
}

impl axum::serve::Listener for SilentListener {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) if !self.shared.held().silent => return (stream, addr),
                Ok(_) => {}
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

fn json_response(code: StatusCode, body: serde_json::Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn not_found(what: &str, name: &str, group: &str) -> Response {
    json_response(
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{what} \"{name}\" not found"), "reason": "NotFound",
            "details": {"name": name, "group": group, "kind": what.split('.').next().unwrap_or(what)}, "code": 404}),
    )
}

/// Counts the request; while silent, never answers (a connection kept from before hangs).
async fn answer(shared: &Shared, path: String, headers: &HeaderMap) {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let silent = {
        let mut h = shared.held();
        *h.requests.entry(path).or_default() += 1;
        h.bearer = bearer;
        h.silent
    };
    if silent {
        std::future::pending::<()>().await;
    }
}

async fn statefulset(
    State(shared): State<Arc<Shared>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    answer(
        &shared,
        format!("/apis/apps/v1/namespaces/{ns}/statefulsets/{name}"),
        &headers,
    )
    .await;
    if ns != shared.namespace || name != shared.set {
        return not_found("statefulsets.apps", &name, "apps");
    }
    let (replicas, ready) = {
        let h = shared.held();
        (h.replicas, h.pods.len())
    };
    let labels = match_labels(&shared.set);
    json_response(
        StatusCode::OK,
        json!({"kind": "StatefulSet", "apiVersion": "apps/v1",
            "metadata": {"name": name, "namespace": ns, "uid": "6a3c0d4e-1f2a-4b5c-8d9e-0f1a2b3c4d5e",
                "resourceVersion": "4242", "generation": 3, "creationTimestamp": "2026-11-24T09:00:00Z",
                "labels": labels},
            "spec": {"replicas": replicas, "serviceName": shared.set, "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "etcd", "image": "etcd-steward:test",
                        "ports": [{"name": "client", "containerPort": 2379, "protocol": "TCP"}],
                        "resources": {}, "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
                        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
                        "dnsPolicy": "ClusterFirst", "securityContext": {}, "schedulerName": "default-scheduler"}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
                "revisionHistoryLimit": 10,
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"}},
            "status": {"observedGeneration": 3, "replicas": ready, "readyReplicas": ready,
                "currentReplicas": ready, "updatedReplicas": ready, "availableReplicas": ready,
                "currentRevision": format!("{name}-7d9f8c6b5"), "updateRevision": format!("{name}-7d9f8c6b5"),
                "collisionCount": 0}}),
    )
}

/// Whether `labels` satisfy an equality-based selector (`k=v`, `k==v`, `k!=v`, `k`, `!k`,
/// comma-separated).
fn selects(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                labels.get(k.trim()).map(String::as_str) != Some(v.trim())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                labels.get(k.trim()).map(String::as_str) == Some(v.trim())
            } else if let Some(k) = term.strip_prefix('!') {
                !labels.contains_key(k.trim())
            } else {
                labels.contains_key(term)
            }
        })
}

fn pod(
    ns: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    owner: Option<&str>,
) -> serde_json::Value {
    let owners: Vec<serde_json::Value> = owner
        .map(|set| json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": set,
            "uid": "6a3c0d4e-1f2a-4b5c-8d9e-0f1a2b3c4d5e", "controller": true, "blockOwnerDeletion": true}))
        .into_iter()
        .collect();
    json!({"metadata": {"name": name, "namespace": ns, "uid": format!("pod-{name}"),
            "resourceVersion": "4240", "creationTimestamp": "2026-11-24T09:00:00Z",
            "labels": labels, "ownerReferences": owners},
        "spec": {"containers": [{"name": "etcd", "image": "etcd-steward:test"}],
            "restartPolicy": "Always", "nodeName": "node-1"},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "hostIP": "10.1.0.1"}})
}

async fn pods(
    State(shared): State<Arc<Shared>>,
    Path(ns): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    answer(&shared, format!("/api/v1/namespaces/{ns}/pods"), &headers).await;
    let (ordinals, stray) = {
        let h = shared.held();
        (h.pods.clone(), h.stray.clone())
    };
    let set = &shared.set;
    let mut all: Vec<(String, BTreeMap<String, String>, Option<&str>)> = Vec::new();
    if ns == shared.namespace {
        for o in ordinals {
            let mut labels = match_labels(set);
            labels.insert("apps.kubernetes.io/pod-index".into(), o.to_string());
            labels.insert(
                "statefulset.kubernetes.io/pod-name".into(),
                format!("{set}-{o}"),
            );
            all.push((format!("{set}-{o}"), labels, Some(set.as_str())));
        }
        if let Some(name) = stray {
            let labels = BTreeMap::from([
                ("app.kubernetes.io/name".to_string(), "web".to_string()),
                ("debug".to_string(), "true".to_string()),
            ]);
            all.push((name, labels, None));
        }
    }
    let selector = query.get("labelSelector").map(String::as_str).unwrap_or("");
    let items: Vec<serde_json::Value> = all
        .iter()
        .filter(|(_, labels, _)| selects(selector, labels))
        .map(|(name, labels, owner)| pod(&ns, name, labels, *owner))
        .collect();
    json_response(
        StatusCode::OK,
        json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "4243"}, "items": items}),
    )
}

fn status_response(code: StatusCode, reason: &str, message: String) -> Response {
    json_response(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

/// What the API server's validation of a new `events.k8s.io/v1` Event refuses (the
/// fields it requires once `eventTime` is set, the type, the note's length).
fn invalid_event(e: &serde_json::Value, ns: &str) -> Option<String> {
    let text = |k: &str| e.get(k).and_then(serde_json::Value::as_str).unwrap_or("");
    if e.get("apiVersion").and_then(serde_json::Value::as_str) != Some("events.k8s.io/v1")
        || text("kind") != "Event"
    {
        return Some("apiVersion and kind must be events.k8s.io/v1 Event".into());
    }
    let meta = &e["metadata"];
    if meta["name"].as_str().is_none_or(str::is_empty) {
        return Some("metadata.name: Required value".into());
    }
    if meta["namespace"].as_str().is_some_and(|n| n != ns) {
        return Some("metadata.namespace: does not match the namespace of the request".into());
    }
    for k in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        if text(k).is_empty() {
            return Some(format!("{k}: Required value"));
        }
    }
    if text("action").len() > 128 || text("reason").len() > 128 {
        return Some("action, reason: must be no more than 128 characters".into());
    }
    if !matches!(text("type"), "Normal" | "Warning") {
        return Some(format!("type: Unsupported value: {:?}", text("type")));
    }
    if text("note").len() > 1024 {
        return Some("note: Too long: must have at most 1024 bytes".into());
    }
    if e["regarding"]["kind"].as_str().is_none_or(str::is_empty) {
        return Some("regarding.kind: Required value".into());
    }
    None
}

/// The answer to every Event call while [`FakeKube::refuse_events`] holds a status.
fn refusal(shared: &Shared) -> Option<Response> {
    let code = shared.held().refuse_events?;
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::FORBIDDEN);
    Some(status_response(
        code,
        "Forbidden",
        "events.events.k8s.io is forbidden".into(),
    ))
}

async fn create_event(
    State(shared): State<Arc<Shared>>,
    Path(ns): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    answer(
        &shared,
        format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
        &headers,
    )
    .await;
    if let Some(refused) = refusal(&shared) {
        return refused;
    }
    let Ok(mut event) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return status_response(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
    };
    if let Some(why) = invalid_event(&event, &ns) {
        return status_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("Event is invalid: {why}"),
        );
    }
    let mut h = shared.held();
    let name = event["metadata"]["name"].as_str().unwrap_or("").to_string();
    if h.events
        .iter()
        .any(|e| e["metadata"]["name"] == name.as_str())
    {
        return status_response(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("events.events.k8s.io \"{name}\" already exists"),
        );
    }
    event["metadata"]["namespace"] = json!(ns);
    event["metadata"]["resourceVersion"] = json!((h.events.len() + 1).to_string());
    event["metadata"]["uid"] = json!(format!("e0000000-0000-0000-0000-{:012}", h.events.len()));
    h.events.push(event.clone());
    json_response(StatusCode::CREATED, event)
}

/// A JSON merge patch (RFC 7386) of an Event: what a series update sends.
async fn patch_event(
    State(shared): State<Arc<Shared>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    answer(
        &shared,
        format!("/apis/events.k8s.io/v1/namespaces/{ns}/events/{name}"),
        &headers,
    )
    .await;
    if let Some(refused) = refusal(&shared) {
        return refused;
    }
    let merge = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/merge-patch+json"));
    if !merge {
        return status_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "the fake takes application/merge-patch+json only".into(),
        );
    }
    let Ok(patch) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return status_response(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
    };
    let mut h = shared.held();
    let Some(event) = h
        .events
        .iter_mut()
        .find(|e| e["metadata"]["name"] == name.as_str())
    else {
        return not_found("events.events.k8s.io", &name, "events.k8s.io");
    };
    merge_patch(event, &patch);
    if event["series"].is_object()
        && (event["series"]["count"].as_i64().is_none_or(|c| c < 2)
            || event["series"]["lastObservedTime"].as_str().is_none())
    {
        return status_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "Event is invalid: series.count must be at least 2 and series.lastObservedTime is required".into(),
        );
    }
    json_response(StatusCode::OK, event.clone())
}

fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match patch {
        serde_json::Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in fields {
                if v.is_null() {
                    if let Some(o) = target.as_object_mut() {
                        o.remove(k);
                    }
                } else {
                    merge_patch(&mut target[k.as_str()], v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equality_selectors_select_by_every_term() {
        let labels = BTreeMap::from([
            ("app".to_string(), "etcd".to_string()),
            ("tier".to_string(), "db".to_string()),
        ]);
        assert!(selects("", &labels));
        assert!(selects("app=etcd", &labels));
        assert!(selects("app==etcd,tier=db", &labels));
        assert!(!selects("app=etcd,tier=web", &labels));
        assert!(selects("app!=web", &labels));
        assert!(selects("tier,!debug", &labels));
        assert!(!selects("debug", &labels));
    }
}
