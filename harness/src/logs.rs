//! Reading what etcd-steward printed: its logs (one JSON object per line) and the decision
//! of `init --dry-run`.

use crate::{Error, Result};

/// The `action` of every init round in `logs` ("decision" and "waiting" lines), in order.
pub fn decisions(logs: &str) -> Vec<String> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "decision" || v["message"] == "waiting")
        .filter_map(|v| v["action"].as_str().map(String::from))
        .collect()
}

/// Whether a log line is one of etcd-steward's own (etcd's lines have no `message`).
pub fn is_steward_line(line: &str) -> bool {
    line.contains("\"message\":\"")
}

/// The last `n` of `lines`, in order.
pub fn last<'a>(lines: &'a [&'a str], n: usize) -> &'a [&'a str] {
    &lines[lines.len().saturating_sub(n)..]
}

/// The decision `etcd-steward init --dry-run` printed on stdout; an error carrying its
/// stderr when it did not exit 0, or printed no JSON.
pub fn dry_run_decision(out: &std::process::Output) -> Result<serde_json::Value> {
    if out.status.code() != Some(0) {
        return Err(Error::Failed(format!(
            "the dry run exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| Error::Failed(format!("the dry run's decision is not JSON: {e}")))
}
