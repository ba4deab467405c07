//! Reading what etcd-steward logged (one JSON object per line).

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
