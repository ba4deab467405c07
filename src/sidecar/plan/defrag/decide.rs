//! The pure decision: which member defragments now (followers by member ID, the leader
//! last, only while every member answers), under NOSPACE whether defragmenting can help and
//! when to disarm, and why nothing is done when something is needed.

use std::fmt;

use super::{Bytes, DefragPolicy, LOCK_KEY, NOSPACE_MARGIN_PERCENT, NOSPACE_MIN_FREE};
pub use crate::sidecar::plan::observation::DefragWhy;

/// Why nothing is done although something is needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// A member did not answer its status (or the cluster has no leader, or a learner).
    Unhealthy { member: u64 },
    /// Another member goes first (a follower before this one, or any before the leader).
    Turn { first: u64 },
    /// This member was defragmented less than [`COOL_DOWN`] ago ([`NOSPACE_COOL_DOWN`]).
    CoolingDown,
    /// Another sidecar holds the lock key.
    LockHeld,
    /// NOSPACE, and the data in use does not fit under the quota with margin: defragmenting
    /// cannot help; the operator must act.
    TooLarge {
        member: u64,
        in_use: u64,
        quota: u64,
    },
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::Unhealthy { member } => write!(
                f,
                "member {member:x} is not healthy (no status, no leader, or a learner): no defragmentation until every member is"
            ),
            Wait::Turn { first } => write!(f, "member {first:x} defragments first"),
            Wait::CoolingDown => f.write_str("this member was defragmented a moment ago"),
            Wait::LockHeld => write!(f, "another member holds {LOCK_KEY}"),
            Wait::TooLarge { member, in_use, quota } => write!(
                f,
                "NOSPACE: member {member:x} holds {} in use, over {NOSPACE_MARGIN_PERCENT}% of the quota ({}); defragmenting cannot free enough, so the alarm stays. Raise etcd's --quota-backend-bytes (and the sidecar's), or delete keys and compact: the sidecars then defragment and disarm",
                Bytes(*in_use),
                Bytes(*quota)
            ),
        }
    }
}

/// What the planner concludes from one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is needed.
    Idle,
    /// Defragment this member; `lock`: take the lock key first (not under NOSPACE).
    Defrag { why: DefragWhy, lock: bool },
    /// Every member fits under the quota with margin: disarm NOSPACE.
    Disarm,
    /// Something is needed, but not now.
    Wait(Wait),
}

/// One voter, as this tick saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub id: u64,
    /// `(db_size, db_size_in_use)`, or `None` when it did not answer (or is a learner).
    pub sizes: Option<(u64, u64)>,
}

/// Everything the decision reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub me: u64,
    /// 0 when there is none.
    pub leader: u64,
    /// Every member of the cluster, this one included.
    pub members: Vec<MemberView>,
    pub nospace: bool,
    /// `--defrag-schedule` is due for this member.
    pub scheduled: bool,
    /// This member was defragmented (or tried) less than [`COOL_DOWN`] ago.
    pub cooling_down: bool,
    /// The lock was refused on the last try, not long ago.
    pub lock_held: bool,
}

/// The pure decision.
pub fn decide(policy: &DefragPolicy, i: &Input) -> Decision {
    let margin = policy.quota / 100 * NOSPACE_MARGIN_PERCENT;
    let need = |m: &MemberView| -> Option<DefragWhy> {
        let (db_size, in_use) = m.sizes?;
        if i.nospace {
            let free = db_size.saturating_sub(in_use);
            return (free > 0 && (free >= NOSPACE_MIN_FREE || db_size >= margin))
                .then_some(DefragWhy::Nospace { db_size, in_use });
        }
        if policy.threshold.is_some_and(|t| t.reached(db_size, in_use)) {
            return Some(DefragWhy::Fragmented { db_size, in_use });
        }
        (m.id == i.me && i.scheduled).then_some(DefragWhy::Scheduled)
    };
    if i.nospace {
        if let Some((member, in_use)) = i
            .members
            .iter()
            .filter_map(|m| m.sizes.map(|(_, u)| (m.id, u)))
            .find(|(_, u)| *u >= margin)
        {
            return Decision::Wait(Wait::TooLarge {
                member,
                in_use,
                quota: policy.quota,
            });
        }
    }
    // Followers by member ID, then the leader.
    let mut order: Vec<&MemberView> = i.members.iter().collect();
    order.sort_by_key(|m| (m.id == i.leader, m.id));
    let first = order.iter().find_map(|m| need(m).map(|why| (m.id, why)));
    let Some((first, why)) = first else {
        if i.nospace {
            return match i.members.iter().find(|m| m.sizes.is_none()) {
                Some(m) => Decision::Wait(Wait::Unhealthy { member: m.id }),
                None if i
                    .members
                    .iter()
                    .all(|m| m.sizes.is_some_and(|(db, _)| db < margin)) =>
                {
                    Decision::Disarm
                }
                None => Decision::Idle,
            };
        }
        return Decision::Idle;
    };
    if first != i.me {
        // Nothing to do here unless this member needs it too.
        let mine = i.members.iter().find(|m| m.id == i.me);
        if mine.and_then(need).is_none() {
            return Decision::Idle;
        }
    }
    if i.leader == 0 {
        return Decision::Wait(Wait::Unhealthy { member: i.me });
    }
    if let Some(m) = i.members.iter().find(|m| m.sizes.is_none()) {
        return Decision::Wait(Wait::Unhealthy { member: m.id });
    }
    if first != i.me {
        return Decision::Wait(Wait::Turn { first });
    }
    if i.cooling_down {
        return Decision::Wait(Wait::CoolingDown);
    }
    if i.lock_held && !i.nospace {
        return Decision::Wait(Wait::LockHeld);
    }
    Decision::Defrag {
        why,
        lock: !i.nospace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sidecar::plan::defrag::fixtures::{policy, LEADER, MIB};

    /// Three members, 1 and 2 followers, 3 the leader; each (db_size, in_use) in MiB.
    fn input(me: u64, sizes: [Option<(u64, u64)>; 3]) -> Input {
        Input {
            me,
            leader: LEADER,
            members: (1..=3)
                .zip(sizes)
                .map(|(id, s)| MemberView {
                    id,
                    sizes: s.map(|(d, u)| (d * MIB, u * MIB)),
                })
                .collect(),
            nospace: false,
            scheduled: false,
            cooling_down: false,
            lock_held: false,
        }
    }

    const LEAN: Option<(u64, u64)> = Some((300, 250));
    const FRAGMENTED: Option<(u64, u64)> = Some((1000, 300));

    #[test]
    fn fragmented_follower_defrags() {
        let d = decide(&policy(), &input(1, [FRAGMENTED, LEAN, LEAN]));
        assert!(matches!(
            d,
            Decision::Defrag {
                why: DefragWhy::Fragmented { .. },
                lock: true
            }
        ));
    }

    #[test]
    fn lean_member_does_nothing() {
        assert_eq!(
            decide(&policy(), &input(1, [LEAN, LEAN, LEAN])),
            Decision::Idle
        );
    }

    #[test]
    fn followers_go_by_id_and_the_leader_waits_for_them() {
        let all = [FRAGMENTED, FRAGMENTED, FRAGMENTED];
        assert!(matches!(
            decide(&policy(), &input(1, all)),
            Decision::Defrag { .. }
        ));
        assert_eq!(
            decide(&policy(), &input(2, all)),
            Decision::Wait(Wait::Turn { first: 1 })
        );
        assert_eq!(
            decide(&policy(), &input(LEADER, all)),
            Decision::Wait(Wait::Turn { first: 1 })
        );
        // Once the followers are lean, the leader goes.
        assert!(matches!(
            decide(&policy(), &input(LEADER, [LEAN, LEAN, FRAGMENTED])),
            Decision::Defrag { .. }
        ));
    }

    #[test]
    fn unhealthy_member_means_nobody_defrags() {
        assert_eq!(
            decide(&policy(), &input(1, [FRAGMENTED, None, LEAN])),
            Decision::Wait(Wait::Unhealthy { member: 2 })
        );
        let mut no_leader = input(1, [FRAGMENTED, LEAN, LEAN]);
        no_leader.leader = 0;
        assert!(matches!(
            decide(&policy(), &no_leader),
            Decision::Wait(Wait::Unhealthy { .. })
        ));
    }

    #[test]
    fn lock_held_by_another_waits() {
        let mut i = input(1, [FRAGMENTED, LEAN, LEAN]);
        i.lock_held = true;
        assert_eq!(decide(&policy(), &i), Decision::Wait(Wait::LockHeld));
    }

    #[test]
    fn cooling_down_after_a_defrag_waits() {
        let mut i = input(1, [FRAGMENTED, LEAN, LEAN]);
        i.cooling_down = true;
        assert_eq!(decide(&policy(), &i), Decision::Wait(Wait::CoolingDown));
    }

    #[test]
    fn threshold_zero_never_defrags_for_fragmentation() {
        let off = DefragPolicy {
            threshold: None,
            ..policy()
        };
        assert_eq!(
            decide(&off, &input(1, [FRAGMENTED, FRAGMENTED, FRAGMENTED])),
            Decision::Idle
        );
        // The threshold needs both the share and the bytes.
        assert!(!policy()
            .threshold
            .is_some_and(|t| t.reached(150 * MIB, 60 * MIB)));
        assert!(!policy()
            .threshold
            .is_some_and(|t| t.reached(10_000 * MIB, 9_000 * MIB)));
    }

    #[test]
    fn schedule_defrags_a_lean_member_in_turn() {
        let mut i = input(2, [LEAN, LEAN, LEAN]);
        i.scheduled = true;
        assert!(matches!(
            decide(&policy(), &i),
            Decision::Defrag {
                why: DefragWhy::Scheduled,
                ..
            }
        ));
    }

    fn nospace_policy() -> DefragPolicy {
        DefragPolicy {
            quota: 16 * MIB,
            ..policy()
        }
    }

    #[test]
    fn nospace_with_enough_to_free_defrags_then_disarms() {
        // 16 MiB files with 2 MiB in use: each defragments, followers first, without the lock.
        let full = Some((16, 2));
        let mut i = input(1, [full, full, full]);
        i.nospace = true;
        assert!(matches!(
            decide(&nospace_policy(), &i),
            Decision::Defrag {
                why: DefragWhy::Nospace { .. },
                lock: false
            }
        ));
        let mut leader = input(LEADER, [full, full, full]);
        leader.nospace = true;
        assert_eq!(
            decide(&nospace_policy(), &leader),
            Decision::Wait(Wait::Turn { first: 1 })
        );
        // All lean again: disarm.
        let lean = Some((2, 2));
        let mut done = input(LEADER, [lean, lean, lean]);
        done.nospace = true;
        assert_eq!(decide(&nospace_policy(), &done), Decision::Disarm);
    }

    #[test]
    fn nospace_with_data_too_large_does_not_disarm_and_says_why() {
        let full = Some((16, 15));
        let mut i = input(LEADER, [full, full, full]);
        i.nospace = true;
        let d = decide(&nospace_policy(), &i);
        assert!(matches!(
            d,
            Decision::Wait(Wait::TooLarge { member: 1, .. })
        ));
        let text = match d {
            Decision::Wait(w) => w.to_string(),
            _ => String::new(),
        };
        assert!(text.contains("--quota-backend-bytes"), "{text}");
        assert!(text.contains("delete keys"), "{text}");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn sizes() -> impl Strategy<Value = Option<(u64, u64)>> {
            prop_oneof![
                1 => Just(None),
                8 => (1u64..3000, 0u64..100).prop_map(|(db, pct)| Some((db, db * pct / 100))),
            ]
        }

        proptest! {
            /// Every sidecar sees the same statuses: at most one of them defragments, and the
            /// leader only when no follower needs it.
            #[test]
            fn at_most_one_member_defragments_and_the_leader_last(
                s in proptest::array::uniform3(sizes()),
                nospace in any::<bool>(),
                quota_mib in 8u64..4096,
            ) {
                let policy = DefragPolicy { quota: quota_mib * MIB, ..policy() };
                let decisions: Vec<Decision> = (1..=3)
                    .map(|me| {
                        let mut i = input(me, s);
                        i.nospace = nospace;
                        decide(&policy, &i)
                    })
                    .collect();
                let defrags: Vec<u64> = (1..=3)
                    .zip(&decisions)
                    .filter(|(_, d)| matches!(d, Decision::Defrag { .. }))
                    .map(|(me, _)| me)
                    .collect();
                prop_assert!(defrags.len() <= 1, "{decisions:?}");
                if defrags == [LEADER] {
                    prop_assert!(
                        decisions[..2].iter().all(|d| *d == Decision::Idle),
                        "the leader goes only when no follower needs it: {:?}",
                        decisions
                    );
                }
                if s.iter().any(Option::is_none) {
                    prop_assert!(defrags.is_empty(), "an unhealthy member stops everyone");
                    prop_assert!(!decisions.contains(&Decision::Disarm));
                }
            }

            /// With `--defrag-schedule` due on any members at once (each sidecar knows only
            /// its own slot), the lock is what keeps them one at a time: a scheduled
            /// defragmentation always takes it, at most one member goes without it, and the
            /// leader never goes while a follower is fragmented beyond the threshold.
            #[test]
            fn scheduled_defragmentations_take_the_lock_and_the_leader_still_goes_last(
                s in proptest::array::uniform3(sizes()),
                scheduled in proptest::array::uniform3(any::<bool>()),
                nospace in any::<bool>(),
                quota_mib in 8u64..4096,
            ) {
                let policy = DefragPolicy { quota: quota_mib * MIB, ..policy() };
                let decisions: Vec<Decision> = (1..=3u64)
                    .map(|me| {
                        let mut i = input(me, s);
                        i.nospace = nospace;
                        i.scheduled = scheduled[(me - 1) as usize];
                        decide(&policy, &i)
                    })
                    .collect();
                let unlocked = decisions
                    .iter()
                    .filter(|d| matches!(d, Decision::Defrag { lock: false, .. }))
                    .count();
                prop_assert!(unlocked <= 1, "{decisions:?}");
                for d in &decisions {
                    if let Decision::Defrag { why: DefragWhy::Scheduled, lock } = d {
                        prop_assert!(*lock, "{decisions:?}");
                    }
                }
                let follower_fragmented = s[..2].iter().any(|m| {
                    m.is_some_and(|(db, used)| {
                        policy.threshold.is_some_and(|t| t.reached(db * MIB, used * MIB))
                    })
                });
                if follower_fragmented && !nospace {
                    prop_assert!(
                        !matches!(decisions[2], Decision::Defrag { .. }),
                        "the leader jumped a fragmented follower: {decisions:?}"
                    );
                }
            }
        }
    }
}
