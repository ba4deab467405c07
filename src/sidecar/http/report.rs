//! `/peer/report`: what this pod's volume holds (a WAL, its member and cluster ID, the
//! formation marker), read afresh on every request; other pods take it as bootstrap evidence.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::facts::WalState;
use crate::report::PeerReport;
use crate::sidecar::health::waiting_shown;
use crate::volume;

/// The longest waiting reason the report carries (the whole one is on `/ready`).
const WAITING_REASON_CHARS: usize = 2000;

pub async fn peer_report(State(s): State<AppState>) -> Response {
    match volume::inspect(&s.data_dir) {
        // A record of the volume's own that cannot be read (a marker, the journal) leaves
        // what this volume is evidence of unknown: an error naming the files, never a
        // report that reads as "no marker".
        Ok(state) if !state.unreadable_markers.is_empty() => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "this volume's own records cannot be read, so it reports nothing: {}\n",
                state.unreadable_markers.join("; ")
            ),
        )
            .into_response(),
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
            let last = match crate::volume::journal::read(&s.data_dir) {
                Ok(mut entries) => entries.pop(),
                Err(e) => {
                    return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
                }
            };
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
                hash_check: s.hash_check.borrow().clone(),
                rebuild_request: s.rebuild.current(),
            };
            let body = serde_json::to_string(&report).unwrap_or_default();
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}
