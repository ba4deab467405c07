//! Events the API did not take, tried again (pure: every time is given). An Event is
//! created under a name that is always the same for the same act, so a second try is
//! harmless (the API's AlreadyExists means the first was taken). This matters most when it
//! is hardest: after every volume of the cluster's own etcd was lost, the Kubernetes API
//! answers only once etcd serves again, and the `RestoredFromBackup` Events are posted
//! before it does. A failed create is tried again after [`FIRST_DELAY`], then twice as long
//! each time up to [`MAX_DELAY`], and given up [`GIVE_UP`] after its first failure (the
//! journal's entries older than that are not posted either) or when [`KEPT`] newer ones
//! wait.

use std::time::{Duration, Instant};

pub const FIRST_DELAY: Duration = Duration::from_secs(1);
pub const MAX_DELAY: Duration = Duration::from_secs(30);
pub const GIVE_UP: Duration = Duration::from_secs(60 * 60);
pub const KEPT: usize = 256;

/// One item waiting to be tried again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry<T> {
    pub item: T,
    first: Instant,
    delay: Duration,
    next: Instant,
}

/// The items waiting, in the order they failed.
#[derive(Debug, Clone)]
pub struct Retries<T> {
    waiting: Vec<Retry<T>>,
}

impl<T> Default for Retries<T> {
    fn default() -> Self {
        Retries {
            waiting: Vec::new(),
        }
    }
}

impl<T> Retries<T> {
    /// `item`'s first attempt failed at `now`. Returns the oldest one given up to make room,
    /// when [`KEPT`] already wait.
    pub fn failed(&mut self, item: T, now: Instant) -> Option<T> {
        let dropped = (self.waiting.len() >= KEPT).then(|| self.waiting.remove(0).item);
        self.waiting.push(Retry {
            item,
            first: now,
            delay: FIRST_DELAY,
            next: now + FIRST_DELAY,
        });
        dropped
    }

    /// `r` failed again at `now`: it waits twice as long, or is given up (returned) once
    /// [`GIVE_UP`] has passed since its first failure.
    pub fn failed_again(&mut self, mut r: Retry<T>, now: Instant) -> Option<T> {
        if now.saturating_duration_since(r.first) >= GIVE_UP {
            return Some(r.item);
        }
        r.delay = (r.delay * 2).min(MAX_DELAY);
        r.next = now + r.delay;
        self.waiting.push(r);
        None
    }

    /// Takes out every item due at `now`, oldest first.
    pub fn due(&mut self, now: Instant) -> Vec<Retry<T>> {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|r| r.next <= now);
        self.waiting = later;
        due
    }

    /// When the next item is due.
    pub fn next(&self) -> Option<Instant> {
        self.waiting.iter().map(|r| r.next).min()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_item_is_tried_after_one_second_then_twice_as_long_up_to_thirty() {
        let t0 = Instant::now();
        let mut r = Retries::default();
        assert_eq!(r.failed("a", t0), None);
        assert!(r.due(t0).is_empty(), "not at once");
        assert_eq!(r.next(), Some(t0 + FIRST_DELAY));
        let mut at = t0;
        let mut delays = Vec::new();
        for _ in 0..8 {
            let next = r.next().unwrap();
            delays.push(next.duration_since(at).as_secs());
            at = next;
            let mut due = r.due(at);
            assert_eq!(due.len(), 1);
            assert_eq!(r.failed_again(due.remove(0), at), None);
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn an_item_failing_for_an_hour_is_given_up() {
        let t0 = Instant::now();
        let mut r = Retries::default();
        r.failed("a", t0);
        let later = t0 + GIVE_UP;
        let due = r.due(later).remove(0);
        assert_eq!(r.failed_again(due, later), Some("a"));
        assert!(r.is_empty() && r.next().is_none());
    }

    #[test]
    fn beyond_the_kept_number_the_oldest_is_given_up() {
        let t0 = Instant::now();
        let mut r = Retries::default();
        for i in 0..KEPT {
            assert_eq!(r.failed(i, t0), None);
        }
        assert_eq!(r.failed(KEPT, t0), Some(0));
        assert_eq!(r.len(), KEPT);
        let due: Vec<usize> = r
            .due(t0 + FIRST_DELAY)
            .into_iter()
            .map(|x| x.item)
            .collect();
        assert_eq!(due.first(), Some(&1), "oldest first");
    }
}
