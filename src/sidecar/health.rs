//! Pure health assessment, and the HTTP router that serves it. Probes read the latest
//! assessment, so they answer at once even while etcd is slow or without quorum.
//! Liveness never depends on quorum or on a peer.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Serialize;
use tokio::sync::watch;

use crate::cluster::MemberStatus;
use crate::datadir;
use crate::report::PeerReport;

/// What etcd's peer API said when the client API did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerApi {
    /// It answered: etcd runs (a member restarted without quorum serves no client
    /// requests until its peers return, but its peer API answers).
    Answered,
    /// Nothing listens: etcd is not running (init is still deciding, or etcd is starting).
    NotListening,
    /// It accepted the connection but did not answer in time: etcd is hung.
    NoAnswer(String),
}

/// One round of observations of the local member.
#[derive(Debug, Clone)]
pub struct LocalObservation {
    pub serializable: Result<(), String>,
    /// Asked only when the serializable read failed.
    pub peer_api: Option<PeerApi>,
    pub status: Result<MemberStatus, String>,
    /// Asked only of a voter that sees a leader.
    pub linearizable: Option<Result<(), String>>,
    /// The leader's raft index, when this member is not the leader.
    pub leader_index: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub ok: bool,
    pub reason: String,
}

fn check(ok: bool, reason: impl Into<String>) -> Check {
    Check {
        ok,
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Unknown,
    Learner,
    Voter,
}

/// The verdicts the probes and metrics serve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    pub live: Check,
    pub ready: Check,
    pub role: Role,
    pub leader_present: bool,
    /// How far this member's raft index is behind the leader's.
    pub raft_index_lag: Option<u64>,
}

impl Health {
    /// Before the first observation: alive (nothing is known to be wrong), not ready.
    pub fn starting() -> Self {
        Health {
            live: check(true, "sidecar starting; no observation yet"),
            ready: check(false, "sidecar starting; no observation yet"),
            role: Role::Unknown,
            leader_present: false,
            raft_index_lag: None,
        }
    }
}

/// Turns one observation into the liveness and readiness verdicts.
pub fn assess(o: &LocalObservation) -> Health {
    let live = match (&o.serializable, &o.peer_api) {
        (Ok(()), _) => check(true, "local etcd answers serializable reads"),
        (Err(_), Some(PeerApi::Answered)) => check(true, "local etcd is up but not serving clients yet (waiting for its peers); its peer API answers"),
        (Err(_), Some(PeerApi::NotListening)) => check(true, "local etcd is not running yet (init is deciding, or etcd is starting)"),
        (Err(e), Some(PeerApi::NoAnswer(p))) => check(false, format!("local etcd does not answer: client API: {e}; peer API: {p}")),
        (Err(e), None) => check(false, format!("local etcd does not answer: {e}")),
    };
    let (role, leader_present, lag) = match &o.status {
        Ok(s) => (
            if s.is_learner {
                Role::Learner
            } else {
                Role::Voter
            },
            s.leader != 0,
            if s.leader == s.member_id && s.leader != 0 {
                Some(0)
            } else {
                o.leader_index.map(|li| li.saturating_sub(s.raft_index))
            },
        ),
        Err(_) => (Role::Unknown, false, None),
    };
    let ready = match (&o.status, &o.linearizable) {
        (Err(e), _) => check(false, format!("local etcd status unavailable: {e}")),
        (Ok(s), _) if s.is_learner => check(
            false,
            format!(
                "member {:x} is a learner, not yet promoted (raft index {}, {} behind the leader)",
                s.member_id,
                s.raft_index,
                lag.map(|l| l.to_string()).unwrap_or_else(|| "?".into())
            ),
        ),
        (Ok(s), _) if s.leader == 0 => check(
            false,
            format!("member {:x} sees no leader (no quorum)", s.member_id),
        ),
        (Ok(s), _) if !s.errors.is_empty() => {
            check(false, format!("alarm active: {}", s.errors.join(", ")))
        }
        (Ok(_), Some(Err(e))) => check(
            false,
            format!("linearizable read through this member failed: {e}"),
        ),
        (Ok(_), None) => check(false, "linearizable read not attempted"),
        (Ok(s), Some(Ok(()))) => check(
            true,
            format!(
                "voter {:x} with leader {:x}; linearizable read succeeded",
                s.member_id, s.leader
            ),
        ),
    };
    Health {
        live,
        ready,
        role,
        leader_present,
        raft_index_lag: lag,
    }
}

/// What the sidecar serves; updated by its loop.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub health: Health,
    pub promotions: u64,
    pub learners_removed: u64,
}

#[derive(Clone)]
pub struct AppState {
    pub snapshot: watch::Receiver<Snapshot>,
    pub name: Arc<str>,
    pub data_dir: Arc<PathBuf>,
}

fn verdict(c: &Check) -> Response {
    let code = if c.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{}\n", c.reason),
    )
        .into_response()
}

async fn healthz(State(s): State<AppState>) -> Response {
    verdict(&s.snapshot.borrow().health.live)
}

async fn ready(State(s): State<AppState>) -> Response {
    verdict(&s.snapshot.borrow().health.ready)
}

async fn metrics(State(s): State<AppState>) -> Response {
    let snap = s.snapshot.borrow().clone();
    let decisions = datadir::decision_counts(&s.data_dir);
    let body = render_metrics(&snap, &decisions);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// Prometheus text format.
pub fn render_metrics(snap: &Snapshot, decisions: &BTreeMap<String, u64>) -> String {
    let h = &snap.health;
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, kind: &str, lines: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in lines {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    gauge(
        "etcd_steward_member_role",
        "1 for the local member's current role (learner or voter).",
        "gauge",
        ["learner", "voter"]
            .iter()
            .map(|r| {
                (
                    format!("{{role=\"{r}\"}}"),
                    u64::from(
                        serde_json::to_value(h.role)
                            .ok()
                            .and_then(|v| v.as_str().map(|x| x == *r))
                            .unwrap_or(false),
                    ),
                )
            })
            .collect(),
    );
    gauge(
        "etcd_steward_leader_present",
        "1 if the local member sees a leader.",
        "gauge",
        vec![(String::new(), u64::from(h.leader_present))],
    );
    gauge(
        "etcd_steward_ready",
        "1 if the member passes the readiness checks.",
        "gauge",
        vec![(String::new(), u64::from(h.ready.ok))],
    );
    gauge(
        "etcd_steward_live",
        "1 if the member passes the liveness check.",
        "gauge",
        vec![(String::new(), u64::from(h.live.ok))],
    );
    gauge(
        "etcd_steward_promotions_total",
        "Learner promotions this sidecar made.",
        "counter",
        vec![(String::new(), snap.promotions)],
    );
    gauge(
        "etcd_steward_learners_removed_total",
        "Stalled learners this sidecar removed as leader.",
        "counter",
        vec![(String::new(), snap.learners_removed)],
    );
    gauge(
        "etcd_steward_init_decisions_total",
        "Decisions etcd-steward init acted on for this volume, by action.",
        "counter",
        decisions
            .iter()
            .map(|(a, n)| (format!("{{action=\"{a}\"}}"), *n))
            .collect(),
    );
    if let Some(lag) = h.raft_index_lag {
        gauge(
            "etcd_steward_raft_index_lag",
            "How many raft entries the local member is behind the leader.",
            "gauge",
            vec![(String::new(), lag)],
        );
    }
    out
}

async fn peer_report(State(s): State<AppState>) -> Response {
    match datadir::inspect(&s.data_dir) {
        Ok(state) => {
            let wal_error = match &state.wal {
                datadir::WalState::Present(Err(e)) => Some(e.clone()),
                _ => None,
            };
            let report = PeerReport {
                name: s.name.to_string(),
                has_data: state.has_data(),
                wal: state.wal_identity(),
                wal_error,
                formation: state.formation,
            };
            let body = serde_json::to_string(&report).unwrap_or_default();
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// The kubelet-facing surface (GET and HEAD only): nothing secret.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// The peer-facing surface: the report other pods take as bootstrap evidence. Served on
/// the plain port without peer TLS, and only over mutual TLS with it.
pub fn report_router(state: AppState) -> Router {
    Router::new()
        .route("/peer/report", get(peer_report))
        .with_state(state)
}
