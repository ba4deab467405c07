//! A tiny fake Kubernetes API for scale-in: it answers what the real one does for the two
//! calls etcd-steward makes, an apps/v1 StatefulSet and a v1 PodList, and a v1 Status 404
//! for a StatefulSet (or namespace) it does not hold. It holds one StatefulSet: its
//! spec.replicas and the ordinals that have a pod ([`FakeKube::set`]). Silenced
//! ([`FakeKube::set_silent`]), every call gets a 503 Status, as from an API server that is
//! down behind its load balancer: no answer. Served until dropped.
//!
//! PROVISIONAL (branch dockerscale): the shape the Docker fault suite needs; the version
//! moved out of tests/scale_in.rs replaces it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;

use crate::{Error, Result};

#[derive(Default)]
struct Held {
    replicas: u32,
    pods: Vec<u32>,
    silent: bool,
}

#[derive(Clone)]
struct Shared {
    namespace: String,
    set: String,
    held: Arc<Mutex<Held>>,
}

impl Shared {
    fn read<T>(&self, f: impl FnOnce(&Held) -> T) -> T {
        f(&self.held.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The fake API server (see the module's documentation).
pub struct FakeKube {
    addr: SocketAddr,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl FakeKube {
    /// Serves on `bind` (port 0: any free one) the StatefulSet `set` of `namespace`, with
    /// spec.replicas 0 and no pod until [`FakeKube::set`].
    pub async fn start(bind: SocketAddr, namespace: &str, set: &str) -> Result<FakeKube> {
        let shared = Shared {
            namespace: namespace.to_string(),
            set: set.to_string(),
            held: Arc::new(Mutex::new(Held::default())),
        };
        let app = Router::new()
            .route(
                "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}",
                get(statefulset),
            )
            .route("/api/v1/namespaces/{ns}/pods", get(pods))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(Error::io(format!("the fake Kubernetes API binding {bind}")))?;
        let addr = listener
            .local_addr()
            .map_err(Error::io("the fake Kubernetes API's address"))?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeKube { addr, shared, task })
    }

    /// Where it serves.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The StatefulSet's spec.replicas, and the ordinals that have a pod.
    pub fn set(&self, replicas: u32, pods: &[u32]) {
        let mut h = self.shared.held.lock().unwrap_or_else(|e| e.into_inner());
        h.replicas = replicas;
        h.pods = pods.to_vec();
    }

    /// Silent, every call is answered 503: nobody learns anything.
    pub fn set_silent(&self, silent: bool) {
        self.shared
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .silent = silent;
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
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

fn unavailable() -> Response {
    json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "the server is currently unable to handle the request",
            "reason": "ServiceUnavailable", "code": 503}),
    )
}

async fn statefulset(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    if s.read(|h| h.silent) {
        return unavailable();
    }
    if name != s.set || ns != s.namespace {
        return json_response(
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("statefulsets.apps \"{name}\" not found"), "reason": "NotFound",
                "details": {"name": name, "group": "apps", "kind": "statefulsets"}, "code": 404}),
        );
    }
    let (replicas, running) = s.read(|h| (h.replicas, h.pods.len()));
    let set = &s.set;
    json_response(
        StatusCode::OK,
        json!({"kind": "StatefulSet", "apiVersion": "apps/v1",
            "metadata": {"name": set, "namespace": ns, "uid": "6a3c", "resourceVersion": "4242", "generation": 3},
            "spec": {"replicas": replicas, "serviceName": set, "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": set}},
                "template": {"metadata": {"labels": {"app": set}}, "spec": {"containers": [{"name": "etcd", "image": "etcd"}]}},
                "updateStrategy": {"type": "RollingUpdate"}},
            "status": {"replicas": running, "readyReplicas": running, "observedGeneration": 3}}),
    )
}

async fn pods(State(s): State<Shared>, Path(ns): Path<String>) -> Response {
    if s.read(|h| h.silent) {
        return unavailable();
    }
    let ordinals = if ns == s.namespace {
        s.read(|h| h.pods.clone())
    } else {
        Vec::new()
    };
    let set = &s.set;
    let mut items: Vec<serde_json::Value> = ordinals
        .iter()
        .map(|o| {
            json!({"metadata": {"name": format!("{set}-{o}"), "namespace": ns,
                "labels": {"app": set, "apps.kubernetes.io/pod-index": o.to_string()},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": set, "uid": "6a3c", "controller": true}]},
                "spec": {"containers": [{"name": "etcd", "image": "etcd"}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1"}})
        })
        .collect();
    // Another workload's pod in the namespace is not one of ours.
    items.push(json!({"metadata": {"name": "web-7", "namespace": ns}, "spec": {}, "status": {"phase": "Running"}}));
    json_response(
        StatusCode::OK,
        json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "4243"}, "items": items}),
    )
}
