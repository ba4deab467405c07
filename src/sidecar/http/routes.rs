//! The routes: `/healthz`, `/ready`, `/metrics` for kubelet and scrapers (GET and HEAD only,
//! nothing secret) on the probe port; `/peer/report` and the control requests for other
//! pods and the operator's commands on the peer-facing port.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::control::{
    accept_rebuild, accept_recovery, accept_restore, authenticate, MAX_CONTROL_BYTES,
};
use super::history::peer_history;
use super::metrics::{self, Format};
use super::report::peer_report;
use super::AppState;
use crate::sidecar::health::Check;

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
    verdict(&s.health.borrow().live)
}

async fn ready(State(s): State<AppState>) -> Response {
    verdict(&s.health.borrow().ready)
}

async fn metrics(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let format = Format::negotiate(accept);
    match metrics::encode(&s.registry, format) {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
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

/// The peer-facing surface, served on `--peer-report-port` only: the report other pods take
/// as bootstrap evidence, this pod's part of `status --history` (`/peer/history`), and the control requests the operator's commands send
/// (`recover --yes`, `restore --yes`; see [`super::control`]). Over mutual TLS with peer
/// TLS, plain HTTP without (control requests then need the token).
pub fn peer_router(state: AppState) -> Router {
    // Authenticated from the head before the body is read; the body bounded as it arrives.
    let control = Router::new()
        .route("/peer/recovery", post(accept_recovery))
        .route("/peer/restore", post(accept_restore))
        .route("/peer/rebuild", post(accept_rebuild))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_CONTROL_BYTES));
    Router::new()
        .route("/peer/report", get(peer_report))
        .route("/peer/history", get(peer_history))
        .merge(control)
        .with_state(state)
}
