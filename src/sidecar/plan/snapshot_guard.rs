//! A snapshot before a risky act: with `--backup-url`, a planner about to do something that
//! cannot be undone by waiting (scale-in's removal of a member) first asks the backup job
//! for a snapshot taken after it decided ([`Step::SnapshotNow`]), and acts only while that
//! snapshot is fresh ([`FRESH`]). A snapshot that cannot be taken (the store or etcd does
//! not answer, or no answer within [`TAKE_LIMIT`]) holds the act, said with its reason, and
//! is asked for again after [`RETRY_AFTER`]: persistence over availability, the act waits.
//! Pure: the answers come back through the observation ([`RoundEnd::Requested`]), the time
//! in it.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::observation::RoundEnd;

/// How old the snapshot may be when the act is done: older, a new one is asked for.
pub const FRESH: Duration = Duration::from_secs(60);
/// How long a snapshot may take (the executor gives up on it then, and says so).
pub const TAKE_LIMIT: Duration = Duration::from_secs(300);
/// How long after a failed snapshot the next is asked for.
pub const RETRY_AFTER: Duration = Duration::from_secs(15);

/// What the guarded act does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Act: snapshot `revision`, taken at `taken_unix`, is fresh.
    Go { revision: i64, taken_unix: u64 },
    /// Ask for snapshot `request` now.
    Ask { request: u64 },
    /// Wait, and why.
    Wait(Waiting),
}

/// Why the guarded act waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// The snapshot was asked for `since` ago and has not come back yet.
    Taking { since: Duration },
    /// The last snapshot could not be taken; the next is asked for in `retry_in`.
    Failed { error: String, retry_in: Duration },
}

impl Waiting {
    /// The same wait, whatever its clock: what the log says once.
    pub fn same_as(&self, other: &Waiting) -> bool {
        match (self, other) {
            (Waiting::Taking { .. }, Waiting::Taking { .. }) => true,
            (Waiting::Failed { error: a, .. }, Waiting::Failed { error: b, .. }) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::Taking { since } => write!(
                f,
                "waiting for the snapshot asked {}s ago (at most {}s)",
                since.as_secs(),
                TAKE_LIMIT.as_secs()
            ),
            Waiting::Failed { error, retry_in } => write!(
                f,
                "no snapshot could be taken ({error}); with --backup-url set nothing is done without one; asked again in {}s",
                retry_in.as_secs()
            ),
        }
    }
}

/// The state of one guarded act `K` (the removal it guards): which request stands, when it
/// was asked, what came back.
#[derive(Debug, Clone)]
pub struct SnapshotGuard<K> {
    act: Option<K>,
    request: u64,
    asked: Option<Instant>,
    taken: Option<(u64, i64)>,
    failed: Option<(Instant, String)>,
}

impl<K> Default for SnapshotGuard<K> {
    fn default() -> Self {
        SnapshotGuard {
            act: None,
            request: 0,
            asked: None,
            taken: None,
            failed: None,
        }
    }
}

impl<K: PartialEq + Clone> SnapshotGuard<K> {
    /// Takes in the answers to this guard's current request among `ends` (seen at `now`);
    /// others (a former request's, the periodic rounds') are not its.
    pub fn absorb(&mut self, ends: &[RoundEnd], now: Instant) {
        for end in ends {
            if let RoundEnd::Requested { request, taken } = end {
                if *request != self.request || self.asked.is_none() {
                    continue;
                }
                self.asked = None;
                match taken {
                    Ok(t) => {
                        self.taken = Some(*t);
                        self.failed = None;
                    }
                    Err(e) => self.failed = Some((now, e.clone())),
                }
            }
        }
    }

    /// What to do for `act` at `now` (`unix`: the same moment in unix seconds, which the
    /// snapshot's time is compared with). A new act starts afresh: a snapshot asked for
    /// another act does not count.
    pub fn verdict(&mut self, act: &K, now: Instant, unix: u64) -> Verdict {
        if self.act.as_ref() != Some(act) {
            *self = SnapshotGuard {
                act: Some(act.clone()),
                request: self.request,
                ..SnapshotGuard::default()
            };
        }
        if let Some((taken_unix, revision)) = self.taken {
            if unix.saturating_sub(taken_unix) <= FRESH.as_secs() {
                return Verdict::Go {
                    revision,
                    taken_unix,
                };
            }
            self.taken = None;
        }
        if let Some(at) = self.asked {
            let since = now.saturating_duration_since(at);
            // The executor gives up at TAKE_LIMIT and says so; a little more for the answer
            // to come back through the observation.
            if since < TAKE_LIMIT + RETRY_AFTER {
                return Verdict::Wait(Waiting::Taking { since });
            }
            self.asked = None;
            self.failed = Some((now, format!("no answer within {}s", TAKE_LIMIT.as_secs())));
        }
        if let Some((at, error)) = &self.failed {
            let since = now.saturating_duration_since(*at);
            if since < RETRY_AFTER {
                return Verdict::Wait(Waiting::Failed {
                    error: error.clone(),
                    retry_in: RETRY_AFTER - since,
                });
            }
        }
        self.request += 1;
        self.asked = Some(now);
        Verdict::Ask {
            request: self.request,
        }
    }

    /// Request `request` could not even be started (`error`), at `at`.
    pub fn not_started(&mut self, request: u64, at: Instant, error: &str) {
        if request == self.request {
            self.asked = None;
            self.failed = Some((at, error.to_string()));
        }
    }

    /// The act was done: the next one needs a snapshot of its own.
    pub fn acted(&mut self) {
        *self = SnapshotGuard {
            request: self.request,
            ..SnapshotGuard::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIX: u64 = 1_700_000_000;

    fn ended(request: u64, taken: Result<(u64, i64), &str>) -> Vec<RoundEnd> {
        vec![RoundEnd::Requested {
            request,
            taken: taken.map_err(str::to_string),
        }]
    }

    #[test]
    fn an_act_waits_for_a_snapshot_asked_after_it_was_decided_and_goes_while_it_is_fresh() {
        let t0 = Instant::now();
        let mut g = SnapshotGuard::default();
        // A periodic round's end is not an answer.
        g.absorb(
            &[RoundEnd::Ran {
                newest_verified: Some((UNIX, 7)),
                take_error: None,
            }],
            t0,
        );
        assert_eq!(g.verdict(&4u32, t0, UNIX), Verdict::Ask { request: 1 });
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(
            g.verdict(&4, t1, UNIX + 2),
            Verdict::Wait(Waiting::Taking {
                since: Duration::from_secs(2)
            })
        );
        g.absorb(&ended(1, Ok((UNIX + 1, 42))), t1);
        assert_eq!(
            g.verdict(&4, t1, UNIX + 2),
            Verdict::Go {
                revision: 42,
                taken_unix: UNIX + 1
            }
        );
        // Held past FRESH (the voters stopped answering meanwhile): a new snapshot first.
        let late = UNIX + 1 + FRESH.as_secs() + 1;
        assert_eq!(g.verdict(&4, t1 + FRESH, late), Verdict::Ask { request: 2 });
        // Done: the next removal asks anew, and a late answer to the old request is not its.
        g.acted();
        g.absorb(&ended(2, Ok((late, 50))), t1 + FRESH);
        assert_eq!(g.verdict(&3, t1 + FRESH, late), Verdict::Ask { request: 3 });
    }

    #[test]
    fn a_snapshot_that_fails_or_never_answers_holds_the_act_and_is_asked_again() {
        let t0 = Instant::now();
        let mut g = SnapshotGuard::default();
        assert_eq!(g.verdict(&4u32, t0, UNIX), Verdict::Ask { request: 1 });
        g.absorb(&ended(1, Err("store unreachable")), t0);
        assert_eq!(
            g.verdict(&4, t0 + Duration::from_secs(5), UNIX + 5),
            Verdict::Wait(Waiting::Failed {
                error: "store unreachable".into(),
                retry_in: RETRY_AFTER - Duration::from_secs(5)
            })
        );
        let t1 = t0 + RETRY_AFTER;
        assert_eq!(g.verdict(&4, t1, UNIX + 15), Verdict::Ask { request: 2 });
        // No answer at all: waits, then counts it as a failure and asks again.
        let quiet = t1 + TAKE_LIMIT;
        assert!(matches!(
            g.verdict(&4, quiet, UNIX + 315),
            Verdict::Wait(Waiting::Taking { .. })
        ));
        let gave_up = t1 + TAKE_LIMIT + RETRY_AFTER;
        assert!(matches!(
            g.verdict(&4, gave_up, UNIX + 330),
            Verdict::Wait(Waiting::Failed { .. })
        ));
        assert_eq!(
            g.verdict(&4, gave_up + RETRY_AFTER, UNIX + 345),
            Verdict::Ask { request: 3 }
        );
        // A step the executor could not start is a failure too.
        g.not_started(3, gave_up + RETRY_AFTER, "no backup store configured");
        assert!(matches!(
            g.verdict(&4, gave_up + RETRY_AFTER, UNIX + 345),
            Verdict::Wait(Waiting::Failed { .. })
        ));
    }
}
