//! `/peer/report`: what this pod's volume holds (a WAL, its member and cluster ID, the
//! formation marker), read afresh on every request; other pods take it as bootstrap evidence.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::facts::WalState;
use crate::report::PeerReport;
use crate::sidecar::recovery::{Expiring, Inbox};
use crate::volume;

pub async fn peer_report(State(s): State<AppState>) -> Response {
    match volume::inspect(&s.data_dir) {
        Ok(state) => {
            let wal_error = match &state.wal {
                WalState::Present(Err(e)) => Some(e.clone()),
                _ => None,
            };
            let log = if state.has_data() {
                s.log_tail().await
            } else {
                None
            };
            let report = PeerReport {
                name: s.name.to_string(),
                has_data: state.has_data(),
                wal: state.wal_identity(),
                wal_error,
                formation: state.formation,
                log,
                recovery: state.recovery,
                recovery_request: s.recovery.current(),
                restore_request: s.restore.current(),
                restored_for: state.restored_for,
                last_decision: crate::volume::journal::read(&s.data_dir).pop().map(|e| {
                    crate::facts::LastDecision {
                        ts: e.ts,
                        action: e.action,
                        // Bounded: the report is bootstrap evidence with a size cap.
                        reason: e.reason.chars().take(600).collect(),
                    }
                }),
                vouch: s.vouch.borrow().clone(),
            };
            let body = serde_json::to_string(&report).unwrap_or_default();
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// `POST /peer/recovery`: an operator's `recover --yes` hands this pod the request. It is
/// held (see `sidecar::recovery`), shown in the report, and checked by every pod against
/// its own observations before anything is done.
pub async fn accept_recovery(State(s): State<AppState>, body: Bytes) -> Response {
    accept(&s.recovery, &body)
}

/// `POST /peer/restore`: an operator's `restore --snapshot NAME --yes` hands this pod the
/// request; held and shown in the report like a recovery request.
pub async fn accept_restore(State(s): State<AppState>, body: Bytes) -> Response {
    accept(&s.restore, &body)
}

fn accept<T>(inbox: &Inbox<T>, body: &[u8]) -> Response
where
    T: Expiring + serde::de::DeserializeOwned,
{
    if body.len() > crate::report::MAX_REPORT_BYTES {
        return (StatusCode::PAYLOAD_TOO_LARGE, "request too large\n").into_response();
    }
    match serde_json::from_slice::<T>(body) {
        Ok(request) => {
            inbox.offer(request);
            (StatusCode::ACCEPTED, "held\n").into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            format!("not a valid request: {e}\n"),
        )
            .into_response(),
    }
}
