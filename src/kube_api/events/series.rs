//! The Events posted recently, by reason and note (pure: every time is given; the windows
//! are measured on the monotonic clock, so a paused or jumping wall clock changes none): an
//! act repeated with the same reason and note within [`SERIES_WINDOW`] of the last one joins
//! its Event's `series`, whose count is sent at most every [`HEARTBEAT`].

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use super::{Act, Reason, HEARTBEAT, SERIES_WINDOW};

/// A call to the API that [`Series`] asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// A new Event named `name`.
    Create {
        name: String,
        act: Act,
        time: SystemTime,
    },
    /// The series of Event `name`: `count` occurrences, the last at `last_observed`.
    Patch {
        name: String,
        count: u32,
        last_observed: SystemTime,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    count: u32,
    /// The last occurrence, on the monotonic clock (the windows) and the wall clock (what
    /// the Event says).
    last: Instant,
    last_wall: SystemTime,
    sent_count: u32,
    sent_at: Instant,
}

/// The Events posted recently, by reason and note (pure: every time is given; the windows
/// are measured on the monotonic clock, so a paused or jumping wall clock changes none).
#[derive(Debug, Clone)]
pub struct Series {
    /// The pod's name: every Event's name starts with it.
    pod: String,
    entries: HashMap<(Reason, String), Entry>,
    /// Tells apart Events created in the same nanosecond.
    created: u64,
}

impl Series {
    pub fn new(pod: &str) -> Series {
        Series {
            pod: pod.to_string(),
            entries: HashMap::new(),
            created: 0,
        }
    }

    /// `act` happened at `now` (`wall` on the wall clock): a new Event, the series' count
    /// when a heartbeat is due, or nothing yet (counted, sent by a later [`Series::due`]).
    pub fn record(&mut self, act: Act, now: Instant, wall: SystemTime) -> Option<Call> {
        self.record_named(act, None, now, wall)
    }

    /// As [`Series::record`]; a new Event is named `name` when one is given.
    pub fn record_named(
        &mut self,
        act: Act,
        name: Option<String>,
        now: Instant,
        wall: SystemTime,
    ) -> Option<Call> {
        let key = (act.reason, act.note.clone());
        match self.entries.get_mut(&key) {
            Some(e) if within(e.last, now, SERIES_WINDOW) => {
                e.count += 1;
                e.last = now;
                e.last_wall = wall;
                if !within(e.sent_at, now, HEARTBEAT) {
                    e.sent_count = e.count;
                    e.sent_at = now;
                    return Some(Call::Patch {
                        name: e.name.clone(),
                        count: e.count,
                        last_observed: wall,
                    });
                }
                None
            }
            _ => {
                self.created += 1;
                let nanos = wall
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                let name =
                    name.unwrap_or_else(|| format!("{}.{:x}{:x}", self.pod, nanos, self.created));
                self.entries.insert(
                    key,
                    Entry {
                        name: name.clone(),
                        count: 1,
                        last: now,
                        last_wall: wall,
                        sent_count: 1,
                        sent_at: now,
                    },
                );
                Some(Call::Create {
                    name,
                    act,
                    time: wall,
                })
            }
        }
    }

    /// The counts not sent yet whose heartbeat is due at `now`; forgets series that ended
    /// (nothing new within [`SERIES_WINDOW`]) once their count is sent.
    pub fn due(&mut self, now: Instant) -> Vec<Call> {
        let mut calls = Vec::new();
        for e in self.entries.values_mut() {
            if e.count > e.sent_count && !within(e.sent_at, now, HEARTBEAT) {
                e.sent_count = e.count;
                e.sent_at = now;
                calls.push(Call::Patch {
                    name: e.name.clone(),
                    count: e.count,
                    last_observed: e.last_wall,
                });
            }
        }
        self.entries
            .retain(|_, e| e.count > e.sent_count || within(e.last, now, SERIES_WINDOW));
        calls.sort_by(|a, b| call_name(a).cmp(call_name(b)));
        calls
    }
}

fn call_name(c: &Call) -> &str {
    match c {
        Call::Create { name, .. } | Call::Patch { name, .. } => name,
    }
}

/// `then` is less than `span` before `now`.
fn within(then: Instant, now: Instant, span: Duration) -> bool {
    now.saturating_duration_since(then) < span
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000 + secs)
    }

    /// A monotonic instant `secs` after the test's start.
    fn mono(secs: u64) -> Instant {
        use std::sync::OnceLock;
        static START: OnceLock<Instant> = OnceLock::new();
        *START.get_or_init(Instant::now) + Duration::from_secs(secs)
    }

    fn waiting() -> Act {
        Act {
            reason: Reason::WaitingTooLong,
            note: "waiting for etcd-2 to prepare".into(),
        }
    }

    #[test]
    fn a_ten_minute_wait_repeated_every_second_is_one_event_with_a_growing_count() {
        let mut s = Series::new("etcd-0");
        let mut creates = 0;
        let mut counts = Vec::new();
        for t in 0..600 {
            let mut calls: Vec<Call> = s.record(waiting(), mono(t), at(t)).into_iter().collect();
            calls.extend(s.due(mono(t)));
            for c in calls {
                match c {
                    Call::Create { .. } => creates += 1,
                    Call::Patch { count, .. } => counts.push(count),
                }
            }
        }
        counts.extend(s.due(mono(700)).into_iter().map(|c| match c {
            Call::Patch { count, .. } => count,
            Call::Create { .. } => 0,
        }));
        assert_eq!(creates, 1);
        assert!(counts.windows(2).all(|w| w[0] < w[1]), "{counts:?}");
        assert_eq!(
            counts.last(),
            Some(&600),
            "the last count sent is every occurrence"
        );
        assert!(
            counts.len() <= 21,
            "one patch per heartbeat at most: {counts:?}"
        );
    }

    #[test]
    fn a_repeat_after_the_window_is_a_new_event() {
        let mut s = Series::new("etcd-0");
        assert!(matches!(
            s.record(waiting(), mono(0), at(0)),
            Some(Call::Create { .. })
        ));
        assert!(s.due(mono(400)).is_empty());
        assert!(matches!(
            s.record(waiting(), mono(400), at(400)),
            Some(Call::Create { .. })
        ));
    }

    #[test]
    fn another_note_or_reason_is_another_event() {
        let mut s = Series::new("etcd-0");
        let first = s.record(waiting(), mono(0), at(0));
        let other_note = s.record(
            Act {
                note: "waiting for etcd-1 to prepare".into(),
                ..waiting()
            },
            mono(1),
            at(1),
        );
        let other_reason = s.record(
            Act {
                reason: Reason::RestoreHeld,
                ..waiting()
            },
            mono(2),
            at(2),
        );
        let names: Vec<String> = [first, other_note, other_reason]
            .into_iter()
            .map(|c| match c {
                Some(Call::Create { name, .. }) => name,
                other => panic!("a new Event each: {other:?}"),
            })
            .collect();
        assert!(names[0] != names[1] && names[1] != names[2] && names[0] != names[2]);
        assert!(names.iter().all(|n| n.starts_with("etcd-0.")));
    }
}
