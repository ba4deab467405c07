//! `--auto-recover-after`: when the proof of loss holds without a break for that long, hand
//! this sidecar the request `recover --yes` would have handed it (this pod the survivor).
//! The looks themselves (every pod's report, the cluster, this volume, and the pure
//! `recover::plan::automatic` on them) are the executor's (`sidecar::recovery`); they come
//! in the observation ([`Observation::recovery_looks`]), each with its time. The rest is the
//! same path as an operator's request.

use std::time::Duration;

use tokio::time::Instant;

use super::observation::LossLook;
use super::{Observation, Planner, Step};

/// Offers a recovery once the loss stays proven for `after`.
#[derive(Debug)]
pub struct AutoRecover {
    /// This pod's name: the survivor named in the request.
    me: String,
    after: Duration,
    /// The first look of the current unbroken run of proofs.
    since: Option<Instant>,
    /// The recovery last said to be proven, so that it is said once.
    said: String,
}

impl AutoRecover {
    pub fn new(me: String, after: Duration) -> Self {
        AutoRecover {
            me,
            after,
            since: None,
            said: String::new(),
        }
    }
}

impl Planner for AutoRecover {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        let mut steps = Vec::new();
        for look in &seen.recovery_looks {
            match look {
                LossLook::Unknown => self.since = None,
                LossLook::Proven { at, id, why } => {
                    let first = *self.since.get_or_insert(*at);
                    let after = self.after;
                    if at.saturating_duration_since(first) >= after {
                        tracing::warn!(recovery = %id, why = %why, after = ?after, "auto-recover: a majority of the initial pods has answered with empty volumes for --auto-recover-after and this volume is the freshest: recovering from it");
                        steps.push(Step::OfferRecovery {
                            id: id.clone(),
                            survivor: self.me.clone(),
                        });
                        self.since = None;
                    } else if self.said != *id {
                        tracing::warn!(recovery = %id, why = %why, after = ?after, "auto-recover: the loss is proven; recovering if it stays so for --auto-recover-after");
                        self.said = id.clone();
                    }
                }
                LossLook::NotProven { why } => {
                    if self.since.is_some() {
                        tracing::info!(why = %why, "auto-recover: the proof of loss no longer holds; waiting again");
                    }
                    self.since = None;
                }
            }
        }
        steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::MemberStatus;

    fn seen(looks: Vec<LossLook>) -> Observation {
        Observation {
            recovery_looks: looks,
            ..Observation::serving(Instant::now(), MemberStatus::default())
        }
    }

    fn proven(at: Instant) -> LossLook {
        LossLook::Proven {
            at,
            id: "r1".into(),
            why: "a majority answered empty".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovery_is_offered_only_once_the_proof_held_without_a_break_for_the_wait() {
        let after = Duration::from_secs(6);
        let mut p = AutoRecover::new("etcd-1".into(), after);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(p.plan(&seen(vec![proven(at(0)), proven(at(2))])).is_empty());
        // A break (a look that failed, or no proof) starts the wait again.
        assert!(p
            .plan(&seen(vec![LossLook::Unknown, proven(at(6))]))
            .is_empty());
        assert!(p
            .plan(&seen(vec![
                proven(at(8)),
                LossLook::NotProven {
                    why: "a pod holds data".into()
                },
                proven(at(12))
            ]))
            .is_empty());
        assert!(p.plan(&seen(vec![proven(at(16))])).is_empty());
        assert_eq!(
            p.plan(&seen(vec![proven(at(18))])),
            vec![Step::OfferRecovery {
                id: "r1".into(),
                survivor: "etcd-1".into()
            }]
        );
        // Offered: the next proof starts a new wait.
        assert!(p.plan(&seen(vec![proven(at(20))])).is_empty());
        assert!(p.plan(&seen(vec![])).is_empty());
    }
}
