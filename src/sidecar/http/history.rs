//! `/peer/history`: this pod's part of `status --history` (peer-facing port only, as the
//! peer report): the decisions `init` recorded on the volume (`decisions.jsonl`) and the acts
//! this sidecar posted since it started, oldest first, bounded
//! ([`crate::facts::history::PodHistory::bounded`]).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::facts::history::{By, HistoryEntry, PodHistory};

pub async fn peer_history(State(s): State<AppState>) -> Response {
    // A journal that cannot be read is said, naming the file: never an empty history.
    let journal = match crate::volume::journal::read(&s.data_dir) {
        Ok(journal) => journal,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    };
    let mut entries: Vec<HistoryEntry> = journal
        .into_iter()
        .map(|e| HistoryEntry {
            at_ms: e.ts.saturating_mul(1000),
            by: By::Init,
            act: e.action.to_string(),
            reason: e.reason,
        })
        .collect();
    entries.extend(s.acts.recent().into_iter().map(|a| {
        HistoryEntry {
            at_ms: a
                .at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            by: By::Sidecar,
            act: a.reason.to_string(),
            reason: a.note,
        }
    }));
    let body = serde_json::to_string(&PodHistory::bounded(&s.name, entries)).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
