//! `/peer/report`: what this pod's volume holds (a WAL, its member and cluster ID, the
//! formation marker), read afresh on every request; other pods take it as bootstrap evidence.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::facts::WalState;
use crate::report::PeerReport;
use crate::sidecar::health::waiting_shown;
use crate::sidecar::recovery::{Expiring, Inbox};
use crate::volume;

/// The longest waiting reason the report carries (the whole one is on `/ready`).
const WAITING_REASON_CHARS: usize = 2000;

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
            let last = crate::volume::journal::read(&s.data_dir).pop();
            // What init waits for, while etcd does not answer here and init has not acted
            // since it noted it.
            let waiting = waiting_shown(
                volume::marker::waiting(&s.data_dir),
                s.health.borrow().etcd_running,
                last.as_ref().map(|e| e.ts),
            )
            .map(|mut w| {
                // Bounded: the report is bootstrap evidence with a size cap (16 KiB).
                if w.reason.chars().count() > WAITING_REASON_CHARS {
                    w.reason = w.reason.chars().take(WAITING_REASON_CHARS).collect();
                    w.reason.push('…');
                }
                w
            });
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
                last_decision: last.map(|e| {
                    crate::facts::LastDecision {
                        ts: e.ts,
                        action: e.action,
                        // Bounded: the report is bootstrap evidence with a size cap.
                        reason: e.reason.chars().take(600).collect(),
                    }
                }),
                vouch: s.vouch.borrow().clone(),
                waiting,
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
