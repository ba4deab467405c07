//! `/peer/report`: what this pod's volume holds (a WAL, its member and cluster ID, the
//! formation marker), read afresh on every request; other pods take it as bootstrap evidence.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::facts::WalState;
use crate::report::PeerReport;
use crate::volume;

pub async fn peer_report(State(s): State<AppState>) -> Response {
    match volume::inspect(&s.data_dir) {
        Ok(state) => {
            let wal_error = match &state.wal {
                WalState::Present(Err(e)) => Some(e.clone()),
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
