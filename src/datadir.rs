//! Transitional: the names `crate::volume` had before it was split, for code written
//! against them while the split lands. New code uses `crate::volume` directly.

use std::collections::BTreeMap;
use std::path::Path;

pub use crate::facts::{DataDirState, WalState};
pub use crate::volume::{inspect, prepare, set_aside, VolumeError as DataDirError};

use crate::volume::{journal, marker};

pub fn write_formation(
    dir: &Path,
    formation: &crate::facts::Formation,
) -> Result<(), DataDirError> {
    marker::write(dir, formation)
}

/// Appends a journal entry given as JSON (`{"action": …}`).
pub fn record_decision(dir: &Path, line: &serde_json::Value) -> Result<(), DataDirError> {
    let entry: journal::Entry = serde_json::from_value(serde_json::json!({
        "ts": line.get("ts").cloned().unwrap_or(serde_json::json!(0)),
        "action": line.get("action").cloned().unwrap_or_default(),
        "reason": line.get("reason").cloned().unwrap_or(serde_json::json!("")),
    }))
    .map_err(|e| DataDirError::Unwritable {
        path: dir.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    journal::append(dir, &entry)
}

pub fn last_decision(dir: &Path) -> Option<String> {
    journal::last_action(dir).map(|a| a.name().to_string())
}

pub fn decision_counts(dir: &Path) -> BTreeMap<String, u64> {
    journal::counts(dir)
        .into_iter()
        .map(|(a, n)| (a.name().to_string(), n))
        .collect()
}
