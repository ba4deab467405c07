//! The rebuild of a diverged member, the leader's part (issue 27): on the leader's own
//! corruption check that ended this tick,
//! - a **diverged** verdict hands the diverged member's sidecar a rebuild request carrying
//!   that check as its proof ([`Step::TellRebuild`]); one member at a time (the lowest ID
//!   the proof names, and none while a learner, a rebuild or replacement under way, is in
//!   the member list) and only when the voters the check counted are the voters now. The
//!   request is the same for every check that finds the member still diverged
//!   (`rebuild-<member>`), so telling it again changes nothing where it is held; that
//!   sidecar checks the proof and its own hash before it stops anything
//!   (`sidecar::rebuild`);
//! - an **agreed** verdict in which every voter answered, while etcd's `CORRUPT` alarm
//!   stands, disarms it ([`Step::DisarmCorrupt`]): the members the alarm named were rebuilt
//!   (gone from the list) or now answer the majority's hash.
//!
//! A verdict that proves nothing (a silent voter, no majority, three hashes) does nothing.

use std::time::Duration;

use crate::facts::hashes::Verdict;
use crate::facts::rebuild::{proves, RebuildRequest};

use super::observation::corrupt;
use super::{Observation, Planner, Step};

/// Plans rebuild requests and the `CORRUPT` alarm's disarming while this member leads.
#[derive(Debug)]
pub struct Rebuild {
    /// How long a request is held where it is handed (`control::REQUEST_TTL`).
    held_for: Duration,
}

impl Rebuild {
    pub fn new(held_for: Duration) -> Self {
        Rebuild { held_for }
    }
}

impl Planner for Rebuild {
    fn plan(&mut self, seen: &Observation) -> Vec<Step> {
        let Ok(status) = &seen.local.status else {
            return Vec::new();
        };
        let leads = status.leader != 0 && status.leader == status.member_id && !status.is_learner;
        let (true, Some(members)) = (leads, seen.members.as_deref()) else {
            return Vec::new();
        };
        let Some(check) = seen
            .hash_checks
            .iter()
            .filter(|c| c.checker == status.member_id)
            .max_by_key(|c| c.at)
        else {
            return Vec::new();
        };
        match &check.verdict {
            Verdict::Diverged(d) => {
                if members.iter().any(|m| m.is_learner) {
                    tracing::info!("a diverged member waits to be rebuilt: a learner is joining (one member at a time)");
                    return Vec::new();
                }
                let voters: Vec<u64> = members.iter().map(|m| m.id).collect();
                let Some(target) = d.members().min() else {
                    return Vec::new();
                };
                let request =
                    RebuildRequest::new(target, check.clone(), seen.unix + self.held_for.as_secs());
                if let Err(why) = proves(&request, &voters) {
                    tracing::info!(member = %format!("{target:x}"), %why, "a diverged member is not told to rebuild");
                    return Vec::new();
                }
                match members.iter().find(|m| m.id == target) {
                    Some(m) => vec![Step::TellRebuild {
                        target: m.clone(),
                        request: Box::new(request),
                    }],
                    None => Vec::new(),
                }
            }
            Verdict::Agreed { silent, .. } if silent.is_empty() && corrupt(status) => {
                vec![Step::DisarmCorrupt]
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::facts::hashes::{judge, Answered, HashAnswer, HashCheck, HashRound};
    use crate::facts::{MemberInfo, MemberStatus};
    use tokio::time::Instant;

    const ME: u64 = 0xa;
    const TTL: Duration = Duration::from_secs(900);

    fn member(id: u64, is_learner: bool) -> MemberInfo {
        MemberInfo {
            id,
            name: format!("etcd-{id:x}"),
            peer_urls: vec![format!("http://etcd-{id:x}:2380")],
            client_urls: vec![format!("http://etcd-{id:x}:2379")],
            is_learner,
        }
    }

    fn check(hashes: &[(u64, Option<u32>)]) -> HashCheck {
        let answers: Vec<HashAnswer> = hashes
            .iter()
            .map(|(member, h)| HashAnswer {
                member: *member,
                got: match h {
                    Some(hash) => Answered::Hash {
                        hash: *hash,
                        compact_revision: 1,
                    },
                    None => Answered::NoAnswer {
                        error: "deadline".into(),
                    },
                },
            })
            .collect();
        let round = HashRound {
            revision: 20,
            voters: hashes.iter().map(|(m, _)| *m).collect(),
            answers: answers.clone(),
        };
        HashCheck {
            at: 7,
            checker: ME,
            verdict: judge(&round),
            answers,
        }
    }

    fn seen(
        leader: u64,
        members: Vec<MemberInfo>,
        checks: Vec<HashCheck>,
        alarm: bool,
    ) -> Observation {
        let mut o = Observation::serving(
            Instant::now(),
            MemberStatus {
                member_id: ME,
                cluster_id: 1,
                leader,
                errors: match alarm {
                    true => vec!["memberID:11 alarm:CORRUPT ".into()],
                    false => vec![],
                },
                ..Default::default()
            },
        );
        o.members = Some(members);
        o.hash_checks = checks;
        o
    }

    fn three() -> Vec<MemberInfo> {
        vec![member(ME, false), member(0xb, false), member(0xc, false)]
    }

    #[test]
    fn the_leader_tells_the_diverged_member_with_its_own_checks_proof() {
        let c = check(&[(ME, Some(1)), (0xb, Some(1)), (0xc, Some(2))]);
        let steps = Rebuild::new(TTL).plan(&seen(ME, three(), vec![c.clone()], false));
        let [Step::TellRebuild { target, request }] = steps.as_slice() else {
            panic!("{steps:?}");
        };
        assert_eq!(target.id, 0xc);
        assert_eq!(request.member, 0xc);
        assert_eq!(request.check, c);
        assert_eq!(request.id, "rebuild-c");
    }

    #[test]
    fn the_leader_itself_diverged_is_told_as_any_member() {
        let c = check(&[(ME, Some(9)), (0xb, Some(1)), (0xc, Some(1))]);
        let steps = Rebuild::new(TTL).plan(&seen(ME, three(), vec![c], false));
        assert!(matches!(steps.as_slice(), [Step::TellRebuild { target, .. }] if target.id == ME));
    }

    #[test]
    fn nothing_is_told_without_a_majoritys_proof_or_by_a_follower() {
        let split = check(&[(ME, Some(1)), (0xb, Some(2)), (0xc, Some(3))]);
        assert!(Rebuild::new(TTL)
            .plan(&seen(ME, three(), vec![split], false))
            .is_empty());
        let silent = check(&[(ME, Some(1)), (0xb, None), (0xc, Some(2))]);
        assert!(Rebuild::new(TTL)
            .plan(&seen(ME, three(), vec![silent], false))
            .is_empty());
        let diverged = check(&[(ME, Some(1)), (0xb, Some(1)), (0xc, Some(2))]);
        assert!(Rebuild::new(TTL)
            .plan(&seen(0xb, three(), vec![diverged.clone()], false))
            .is_empty());
        // No check ended this tick: nothing.
        assert!(Rebuild::new(TTL)
            .plan(&seen(ME, three(), vec![], false))
            .is_empty());
    }

    #[test]
    fn one_member_at_a_time_and_only_against_the_voters_counted() {
        let c = check(&[(ME, Some(1)), (0xb, Some(1)), (0xc, Some(2))]);
        let mut joining = three();
        joining.push(member(0xd, true));
        assert!(Rebuild::new(TTL)
            .plan(&seen(ME, joining, vec![c.clone()], false))
            .is_empty());
        // A voter added since the check: its majority is another one's.
        let mut grown = three();
        grown.push(member(0xd, false));
        assert!(Rebuild::new(TTL)
            .plan(&seen(ME, grown, vec![c], false))
            .is_empty());
        // Two diverged of five: the lowest first.
        let five = check(&[
            (ME, Some(1)),
            (0xb, Some(1)),
            (0xc, Some(1)),
            (0xe, Some(3)),
            (0xd, Some(2)),
        ]);
        let mut members = three();
        members.extend([member(0xd, false), member(0xe, false)]);
        let steps = Rebuild::new(TTL).plan(&seen(ME, members, vec![five], false));
        assert!(matches!(steps.as_slice(), [Step::TellRebuild { target, .. }] if target.id == 0xd));
    }

    #[test]
    fn a_corrupt_alarm_is_disarmed_only_when_every_voter_agrees() {
        let agreed = check(&[(ME, Some(1)), (0xb, Some(1)), (0xc, Some(1))]);
        assert_eq!(
            Rebuild::new(TTL).plan(&seen(ME, three(), vec![agreed.clone()], true)),
            vec![Step::DisarmCorrupt]
        );
        assert!(Rebuild::new(TTL)
            .plan(&seen(ME, three(), vec![agreed], false))
            .is_empty());
        let silent = check(&[(ME, Some(1)), (0xb, Some(1)), (0xc, None)]);
        assert!(Rebuild::new(TTL)
            .plan(&seen(ME, three(), vec![silent], true))
            .is_empty());
        let diverged = check(&[(ME, Some(1)), (0xb, Some(1)), (0xc, Some(2))]);
        let steps = Rebuild::new(TTL).plan(&seen(ME, three(), vec![diverged], true));
        assert!(!steps.contains(&Step::DisarmCorrupt));
    }
}
