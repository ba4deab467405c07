//! Renews this pod's own certificates (`--tls-issuer-dir`) before they expire: when the
//! observation says they are due (missing, a third of their validity left, their CA or
//! their names changed), one step issues them again. etcd reads the new files at its next
//! handshake and the agent when they change: nothing restarts. A failed issuance is tried
//! again after a pause, not at every tick.

use std::time::Duration;

use tokio::time::Instant;

use super::{Observation, Outcome, Planner, Step};

/// Between a failed issuance and the next attempt.
const RETRY: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct Certificates {
    failed_at: Option<Instant>,
}

impl Planner for Certificates {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        let Some(why) = &seen.certificates_due else {
            return vec![];
        };
        if self
            .failed_at
            .is_some_and(|t| seen.now.duration_since(t) < RETRY)
        {
            return vec![];
        }
        vec![Step::IssueCertificates { why: why.clone() }]
    }

    fn learned(&mut self, outcome: &Outcome, at: Instant) {
        match outcome {
            Outcome::Failed(Step::IssueCertificates { .. }, _) => self.failed_at = Some(at),
            Outcome::Done(Step::IssueCertificates { .. }) => self.failed_at = None,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::MemberStatus;

    fn due(now: Instant, why: Option<&str>) -> Observation {
        let mut seen = Observation::serving(now, MemberStatus::default());
        seen.certificates_due = why.map(String::from);
        seen
    }

    #[test]
    fn certificates_that_are_due_are_issued_and_fine_ones_are_left() {
        let now = Instant::now();
        let mut p = Certificates::default();
        assert_eq!(p.plan(&due(now, None)), vec![]);
        assert_eq!(
            p.plan(&due(now, Some("expires in 10 s"))),
            vec![Step::IssueCertificates {
                why: "expires in 10 s".into()
            }]
        );
    }

    #[test]
    fn a_failed_issuance_waits_a_minute_before_the_next_attempt() {
        let now = Instant::now();
        let mut p = Certificates::default();
        let step = Step::IssueCertificates { why: "x".into() };
        p.learned(&Outcome::Failed(step.clone(), "disk full".into()), now);
        assert_eq!(
            p.plan(&due(now + Duration::from_secs(59), Some("x"))),
            vec![]
        );
        assert_eq!(
            p.plan(&due(now + Duration::from_secs(60), Some("x"))),
            vec![step]
        );
    }
}
