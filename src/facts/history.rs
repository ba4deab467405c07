//! A pod's part of `status --history`, as its sidecar serves it on `/peer/history`: the tail
//! of the decisions `init` recorded on the volume and the sidecar's own acts, oldest first,
//! bounded by count and size (pure; the served and the read side share it).

use serde::{Deserialize, Serialize};

/// The most entries a pod serves (the newest).
pub const MAX_ENTRIES: usize = 200;

/// The most bytes of entries a pod serves; the reader accepts a little more (the envelope).
pub const MAX_BYTES: usize = 64 * 1024;

/// The largest answer the reader accepts.
pub const MAX_ANSWER_BYTES: usize = MAX_BYTES + 4 * 1024;

/// The longest reason an entry carries.
pub const REASON_CHARS: usize = 600;

/// Who acted: `init` (a decision it acted on, from the journal) or the sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum By {
    Init,
    Sidecar,
}

impl std::fmt::Display for By {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            By::Init => "init",
            By::Sidecar => "sidecar",
        })
    }
}

/// One act: when (Unix milliseconds; `init`'s journal has whole seconds), who, what (the
/// journal's action, `replace`, or the Event's reason, `Promoted`) and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub at_ms: u64,
    pub by: By,
    pub act: String,
    pub reason: String,
}

/// One pod's part.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodHistory {
    pub name: String,
    /// Oldest first.
    pub entries: Vec<HistoryEntry>,
    /// How many older entries were left off to keep within the bounds.
    #[serde(default)]
    pub left_off: usize,
}

impl PodHistory {
    /// Pod `name`'s part from `entries` (any order): ordered by time (a tie keeps the given
    /// order), each reason cut to [`REASON_CHARS`], the newest kept within [`MAX_ENTRIES`]
    /// and [`MAX_BYTES`].
    pub fn bounded(name: &str, mut entries: Vec<HistoryEntry>) -> PodHistory {
        entries.sort_by_key(|e| e.at_ms);
        let total = entries.len();
        let mut kept = Vec::new();
        let mut bytes = 0;
        for mut e in entries.into_iter().rev().take(MAX_ENTRIES) {
            if e.reason.chars().count() > REASON_CHARS {
                e.reason = e.reason.chars().take(REASON_CHARS).collect();
                e.reason.push('…');
            }
            let size = serde_json::to_string(&e).map_or(0, |t| t.len()) + 1;
            if bytes + size > MAX_BYTES {
                break;
            }
            bytes += size;
            kept.push(e);
        }
        kept.reverse();
        PodHistory {
            name: name.to_string(),
            left_off: total - kept.len(),
            entries: kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at_ms: u64, reason: &str) -> HistoryEntry {
        HistoryEntry {
            at_ms,
            by: By::Init,
            act: "restart".into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_long_history_keeps_its_newest_entries_within_count_and_size() {
        let many: Vec<HistoryEntry> = (0..500).rev().map(|i| entry(i, "r")).collect();
        let h = PodHistory::bounded("etcd-0", many);
        assert_eq!(h.entries.len(), MAX_ENTRIES);
        assert_eq!(h.left_off, 500 - MAX_ENTRIES);
        assert_eq!(h.entries[0].at_ms, 300, "the newest, oldest first");
        assert_eq!(h.entries.last().map(|e| e.at_ms), Some(499));

        let long: Vec<HistoryEntry> = (0..150).map(|i| entry(i, &"é".repeat(5000))).collect();
        let h = PodHistory::bounded("etcd-0", long);
        let text = serde_json::to_string(&h).unwrap_or_default();
        assert!(text.len() <= MAX_ANSWER_BYTES, "{}", text.len());
        assert!(h.left_off > 0 && h.entries.last().map(|e| e.at_ms) == Some(149));
        assert!(h
            .entries
            .iter()
            .all(|e| e.reason.chars().count() == REASON_CHARS + 1));
    }
}
