//! `etcd-steward status --history [--since 1h]`: one timeline, newest last, merged from
//! every pod's `/peer/history` (the decisions `init` recorded on its volume and its
//! sidecar's acts). [`gather`] asks every pod (I/O); [`merge`] and [`render`] are pure. A pod
//! that does not answer is named, with why.

use std::time::Duration;

use serde::Serialize;

use crate::config::Config;
use crate::dns::Dns;
use crate::etcd::Connector;
use crate::facts::history::{By, PodHistory};
use crate::units::moment;

const CALL: Duration = Duration::from_secs(2);

/// One act of the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineEntry {
    /// Unix milliseconds.
    pub at_ms: u64,
    /// The same moment in RFC 3339 (UTC).
    pub time: String,
    pub pod: String,
    pub by: By,
    pub act: String,
    pub reason: String,
}

/// A pod whose part is missing, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unanswered {
    pub pod: String,
    pub why: String,
}

/// The timeline across the pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Timeline {
    /// When it was asked (Unix seconds).
    pub at: u64,
    /// Acts before this moment (Unix seconds) are left out (`--since`).
    pub since: Option<u64>,
    /// Oldest first.
    pub entries: Vec<TimelineEntry>,
    pub unanswered: Vec<Unanswered>,
    /// Pods that left older entries off to stay within their bound, and how many.
    pub left_off: Vec<(String, usize)>,
}

/// Merges every pod's part (in the pods' order): by time, a tie kept in the pods' order and
/// each pod's own order; acts before `since` (Unix seconds) left out.
pub fn merge(
    parts: Vec<(String, Result<PodHistory, String>)>,
    since: Option<u64>,
    at: u64,
) -> Timeline {
    let mut entries = Vec::new();
    let mut unanswered = Vec::new();
    let mut left_off = Vec::new();
    for (pod, part) in parts {
        match part {
            Ok(h) => {
                if h.left_off > 0 {
                    left_off.push((pod.clone(), h.left_off));
                }
                entries.extend(
                    h.entries
                        .into_iter()
                        .filter(|e| since.is_none_or(|s| e.at_ms >= s.saturating_mul(1000)))
                        .map(|e| TimelineEntry {
                            time: humantime::format_rfc3339_seconds(
                                std::time::UNIX_EPOCH + Duration::from_millis(e.at_ms),
                            )
                            .to_string(),
                            at_ms: e.at_ms,
                            pod: pod.clone(),
                            by: e.by,
                            act: e.act,
                            reason: e.reason,
                        }),
                );
            }
            Err(why) => unanswered.push(Unanswered { pod, why }),
        }
    }
    entries.sort_by_key(|e| e.at_ms);
    Timeline {
        at,
        since,
        entries,
        unanswered,
        left_off,
    }
}

/// Asks every pod of the set (the initial ones, and higher ordinals whose names exist) for
/// its part; `since`: how far back.
pub async fn gather<D, C>(
    cfg: Config,
    dns: D,
    connector: C,
    since: Option<Duration>,
) -> anyhow::Result<Timeline>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    let at = crate::clock::unix_now();
    let obs = cfg.observer(dns, connector);
    let f = obs.observe(String::new()).await?;
    let id = &cfg.identity;
    let mut pods = vec![(f.ordinal, f.name.clone(), f.own_dns.first())];
    for p in &f.peers {
        if p.ordinal >= f.replicas && p.report.is_none() {
            continue;
        }
        pods.push((p.ordinal, p.name.clone(), p.dns.first()));
    }
    pods.sort_by_key(|p| p.0);
    let asks = pods.iter().map(|(o, name, ip)| {
        let reports = &obs.reports;
        let host = id.host(*o);
        async move {
            let part = match ip {
                Some(ip) => reports
                    .history(name, &host, *ip, CALL)
                    .await
                    .map_err(|e| format!("did not answer: {e}")),
                None => Err("its name does not resolve".to_string()),
            };
            (name.clone(), part)
        }
    });
    let parts = futures_util::future::join_all(asks).await;
    let since = since.map(|d| at.saturating_sub(d.as_secs()));
    Ok(merge(parts, since, at))
}

/// The timeline as text: one line per act (time, pod, who, act, reason), then the pods that
/// did not answer.
pub fn render(t: &Timeline) -> String {
    let mut out = String::new();
    let mut rows = vec![vec![
        "TIME".to_string(),
        "POD".into(),
        "BY".into(),
        "ACT".into(),
        "REASON".into(),
    ]];
    for e in &t.entries {
        rows.push(vec![
            moment(e.at_ms / 1000, t.at),
            e.pod.clone(),
            e.by.to_string(),
            e.act.clone(),
            e.reason.clone(),
        ]);
    }
    if t.entries.is_empty() {
        match t.since {
            Some(s) => out.push_str(&format!("no act recorded since {}\n", moment(s, t.at))),
            None => out.push_str("no act recorded\n"),
        }
    } else {
        out.push_str(&super::status::table(&rows));
    }
    for (pod, n) in &t.left_off {
        out.push_str(&format!(
            "{pod}: {n} older entries left off (each pod serves its newest)\n"
        ));
    }
    for u in &t.unanswered {
        out.push_str(&format!("{}: not in this timeline: {}\n", u.pod, u.why));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::history::HistoryEntry;

    fn entry(at: u64, by: By, act: &str) -> HistoryEntry {
        HistoryEntry {
            at_ms: at * 1000,
            by,
            act: act.into(),
            reason: format!("why {act}"),
        }
    }

    fn part(name: &str, entries: Vec<HistoryEntry>) -> (String, Result<PodHistory, String>) {
        (
            name.into(),
            Ok(PodHistory {
                name: name.into(),
                entries,
                left_off: 0,
            }),
        )
    }

    const NOW: u64 = 1_795_629_450;

    #[test]
    fn the_pods_parts_merge_into_one_timeline_newest_last_and_a_silent_pod_is_named() {
        let parts = vec![
            part(
                "etcd-0",
                vec![
                    entry(NOW - 3000, By::Init, "bootstrap"),
                    entry(NOW - 60, By::Init, "restart"),
                ],
            ),
            ("etcd-1".into(), Err("did not answer: refused".into())),
            part(
                "etcd-2",
                vec![
                    entry(NOW - 300, By::Init, "replace"),
                    entry(NOW - 240, By::Sidecar, "Promoted"),
                ],
            ),
        ];
        let t = merge(parts.clone(), None, NOW);
        let order: Vec<(&str, &str)> = t
            .entries
            .iter()
            .map(|e| (e.pod.as_str(), e.act.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                ("etcd-0", "bootstrap"),
                ("etcd-2", "replace"),
                ("etcd-2", "Promoted"),
                ("etcd-0", "restart")
            ]
        );
        let text = render(&t);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("TIME"), "{text}");
        assert!(
            lines[2].starts_with("2026-11-25T17:52:30Z (5m ago)   etcd-2  init     replace")
                && lines[2].ends_with("why replace"),
            "{text}"
        );
        assert!(
            text.contains("etcd-1: not in this timeline: did not answer: refused\n"),
            "{text}"
        );

        let recent = merge(parts, Some(NOW - 600), NOW);
        assert_eq!(recent.entries.len(), 3, "the bootstrap is before --since");
        assert_eq!(recent.unanswered.len(), 1);
        let empty = merge(vec![part("etcd-0", vec![])], Some(NOW - 600), NOW);
        assert!(render(&empty).starts_with("no act recorded since 2026-11-25T17:47:30Z (10m ago)"));
    }
}
