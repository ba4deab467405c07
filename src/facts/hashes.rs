//! The corruption check's judge (issue 27): the voters' `HashKV` answers at one revision in,
//! a verdict out. Pure: the sidecar that asks (the leader's) fills a [`HashRound`] in; the
//! verdict travels in its peer report, so the diverged member's own sidecar, `status` and
//! a later rebuild read the same proof. Never on silence: a member is diverged only when a
//! strict majority of **all** voters answered one hash at that revision and it answered
//! another; a member that did not answer is never judged.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::hex_id;

/// One voter's answer to `HashKV` at the round's revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashAnswer {
    #[serde(with = "hex_id")]
    pub member: u64,
    /// The hash, and the compacted revision it starts from, or why there is none (the
    /// member did not answer, the revision was compacted or not reached there).
    #[serde(flatten)]
    pub got: Answered,
}

/// What one voter answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answered {
    Hash { hash: u32, compact_revision: i64 },
    NoAnswer { error: String },
}

/// What a check asked and heard: every voter the member list names, the revision asked
/// (the lowest current revision among the voters that gave their status: every one of
/// them has applied it), and each answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashRound {
    pub revision: i64,
    pub voters: Vec<u64>,
    pub answers: Vec<HashAnswer>,
}

/// The members that answered one hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashGroup {
    pub hash: u32,
    #[serde(with = "hex_ids")]
    pub members: Vec<u64>,
}

/// The proof that members diverged: what a rebuild acts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    pub revision: i64,
    pub compact_revision: i64,
    /// The hash a strict majority of all voters answered.
    pub majority_hash: u32,
    #[serde(with = "hex_ids")]
    pub voters: Vec<u64>,
    /// The members that answered the majority's hash.
    #[serde(with = "hex_ids")]
    pub agreeing: Vec<u64>,
    /// The members that answered another hash, each with it.
    pub diverged: Vec<HashGroup>,
    /// Voters that gave no hash (never judged).
    #[serde(with = "hex_ids")]
    pub silent: Vec<u64>,
}

impl Divergence {
    /// Every member this proof names as diverged.
    pub fn members(&self) -> impl Iterator<Item = u64> + '_ {
        self.diverged.iter().flat_map(|g| g.members.iter().copied())
    }
}

/// Why a check proved nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NoProof {
    /// The member list named no voter.
    NoVoters,
    /// The answers start from different compacted revisions: their hashes do not compare
    /// (a compaction was being applied); the next check asks again.
    CompactionDiffers { compact_revisions: Vec<i64> },
    /// No hash was answered by a strict majority of all voters: too few answered, or they
    /// answered different hashes.
    NoMajority {
        voters: usize,
        needed: usize,
        hashes: Vec<HashGroup>,
        #[serde(with = "hex_ids")]
        silent: Vec<u64>,
    },
}

impl fmt::Display for NoProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoProof::NoVoters => f.write_str("the member list names no voter"),
            NoProof::CompactionDiffers { compact_revisions } => write!(
                f,
                "the answers start from different compacted revisions ({compact_revisions:?}): their hashes do not compare; the next check asks again"
            ),
            NoProof::NoMajority {
                voters,
                needed,
                hashes,
                silent,
            } => {
                let answered: usize = hashes.iter().map(|g| g.members.len()).sum();
                if answered < *needed {
                    write!(
                        f,
                        "only {answered} of the {voters} voters answered (a strict majority, {needed}, must agree)"
                    )?;
                } else {
                    write!(
                        f,
                        "no hash has a strict majority of the {voters} voters ({needed} needed)"
                    )?;
                }
                for g in hashes {
                    write!(f, "; {:08x} from {}", g.hash, ids(&g.members))?;
                }
                if !silent.is_empty() {
                    write!(f, "; no answer from {}", ids(silent))?;
                }
                f.write_str(": nothing is judged diverged")
            }
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Verdict {
    /// A strict majority of all voters answered `hash` and no member answered another.
    Agreed {
        revision: i64,
        hash: u32,
        #[serde(with = "hex_ids")]
        agreeing: Vec<u64>,
        #[serde(with = "hex_ids")]
        silent: Vec<u64>,
    },
    /// Members answered another hash than a strict majority of all voters.
    Diverged(Divergence),
    /// Nothing proven, and why.
    Undecided { revision: i64, why: NoProof },
}

/// What a verdict says about one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// It answered the majority's hash.
    Agrees,
    /// It answered `hash`, not the majority's `majority`.
    Diverged { hash: u32, majority: u32 },
    /// The verdict says nothing about it (silent, or nothing proven).
    Unknown,
}

impl Verdict {
    /// The metric label of the outcome: `agreed`, `diverged`, `split` (answers disagree
    /// with no majority: a person must look) or `undecided` (too few answers, a compaction
    /// under way).
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Agreed { .. } => "agreed",
            Verdict::Diverged(_) => "diverged",
            Verdict::Undecided {
                why: NoProof::NoMajority { hashes, .. },
                ..
            } if hashes.len() > 1 => "split",
            Verdict::Undecided { .. } => "undecided",
        }
    }

    /// What this verdict says about `member`.
    pub fn standing(&self, member: u64) -> Standing {
        match self {
            Verdict::Agreed { agreeing, .. } if agreeing.contains(&member) => Standing::Agrees,
            Verdict::Diverged(d) if d.agreeing.contains(&member) => Standing::Agrees,
            Verdict::Diverged(d) => d
                .diverged
                .iter()
                .find(|g| g.members.contains(&member))
                .map_or(Standing::Unknown, |g| Standing::Diverged {
                    hash: g.hash,
                    majority: d.majority_hash,
                }),
            _ => Standing::Unknown,
        }
    }

    /// The members that answered, each with its standing (for the per-member metric).
    pub fn judged(&self) -> Vec<(u64, bool)> {
        match self {
            Verdict::Agreed { agreeing, .. } => agreeing.iter().map(|m| (*m, false)).collect(),
            Verdict::Diverged(d) => d
                .agreeing
                .iter()
                .map(|m| (*m, false))
                .chain(d.members().map(|m| (m, true)))
                .collect(),
            Verdict::Undecided { .. } => Vec::new(),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Agreed {
                revision,
                hash,
                agreeing,
                silent,
            } => {
                write!(
                    f,
                    "agreed: HashKV {hash:08x} at revision {revision} from {}",
                    ids(agreeing)
                )?;
                if !silent.is_empty() {
                    write!(f, "; no answer from {}", ids(silent))?;
                }
                Ok(())
            }
            Verdict::Diverged(d) => {
                write!(f, "diverged at revision {}:", d.revision)?;
                for g in &d.diverged {
                    write!(f, " {} answered {:08x};", ids(&g.members), g.hash)?;
                }
                write!(
                    f,
                    " the majority of the {} voters ({}) answered {:08x}",
                    d.voters.len(),
                    ids(&d.agreeing),
                    d.majority_hash
                )
            }
            Verdict::Undecided { revision, why } => {
                write!(f, "undecided at revision {revision}: {why}")
            }
        }
    }
}

fn ids(members: &[u64]) -> String {
    members
        .iter()
        .map(|m| format!("{m:x}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Judges a round. A member is diverged only when a strict majority of all voters answered
/// one hash (from one compacted revision) and it answered another; anything less proves
/// nothing and says why.
pub fn judge(round: &HashRound) -> Verdict {
    let revision = round.revision;
    let mut voters = round.voters.clone();
    voters.sort_unstable();
    voters.dedup();
    if voters.is_empty() {
        return Verdict::Undecided {
            revision,
            why: NoProof::NoVoters,
        };
    }
    let needed = voters.len() / 2 + 1;
    // Only voters' answers count, one per voter.
    let mut hashes: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut compacted: BTreeMap<i64, usize> = BTreeMap::new();
    let mut answered = Vec::new();
    for a in &round.answers {
        if !voters.contains(&a.member) || answered.contains(&a.member) {
            continue;
        }
        if let Answered::Hash {
            hash,
            compact_revision,
        } = a.got
        {
            answered.push(a.member);
            hashes.entry(hash).or_default().push(a.member);
            *compacted.entry(compact_revision).or_default() += 1;
        }
    }
    let silent: Vec<u64> = voters
        .iter()
        .copied()
        .filter(|v| !answered.contains(v))
        .collect();
    if compacted.len() > 1 {
        return Verdict::Undecided {
            revision,
            why: NoProof::CompactionDiffers {
                compact_revisions: compacted.keys().copied().collect(),
            },
        };
    }
    let compact_revision = compacted.keys().next().copied().unwrap_or_default();
    let mut groups: Vec<HashGroup> = hashes
        .into_iter()
        .map(|(hash, mut members)| {
            members.sort_unstable();
            HashGroup { hash, members }
        })
        .collect();
    // The largest group first (ties by hash: the order is stable).
    groups.sort_by_key(|g| std::cmp::Reverse(g.members.len()));
    let Some(top) = groups
        .first()
        .filter(|g| g.members.len() >= needed)
        .cloned()
    else {
        return Verdict::Undecided {
            revision,
            why: NoProof::NoMajority {
                voters: voters.len(),
                needed,
                hashes: groups,
                silent,
            },
        };
    };
    if groups.len() == 1 {
        return Verdict::Agreed {
            revision,
            hash: top.hash,
            agreeing: top.members,
            silent,
        };
    }
    Verdict::Diverged(Divergence {
        revision,
        compact_revision,
        majority_hash: top.hash,
        voters,
        agreeing: top.members,
        diverged: groups.into_iter().skip(1).collect(),
        silent,
    })
}

/// The revision a check asks every voter's hash at: the lowest current revision among the
/// voters that gave one (each of them has applied it); `None` when none did.
pub fn common_revision(revisions: &[i64]) -> Option<i64> {
    revisions.iter().copied().filter(|r| *r > 0).min()
}

/// One check as the sidecar that ran it publishes it (peer report, `status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashCheck {
    /// Unix seconds when it ended.
    pub at: u64,
    /// The member whose sidecar asked (the leader's).
    #[serde(with = "hex_id")]
    pub checker: u64,
    pub answers: Vec<HashAnswer>,
    pub verdict: Verdict,
}

/// Member IDs as lowercase hex, in a list.
mod hex_ids {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(ids: &[u64], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(ids.iter().map(|id| format!("{id:x}")))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|t| u64::from_str_radix(t, 16).map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 0xa;
    const B: u64 = 0xb;
    const C: u64 = 0xc;
    const D: u64 = 0xd;
    const E: u64 = 0xe;

    fn hash(member: u64, hash: u32) -> HashAnswer {
        HashAnswer {
            member,
            got: Answered::Hash {
                hash,
                compact_revision: 1,
            },
        }
    }

    fn silent(member: u64) -> HashAnswer {
        HashAnswer {
            member,
            got: Answered::NoAnswer {
                error: "etcd at x did not answer in time".into(),
            },
        }
    }

    fn round(voters: &[u64], answers: Vec<HashAnswer>) -> HashRound {
        HashRound {
            revision: 42,
            voters: voters.to_vec(),
            answers,
        }
    }

    #[test]
    fn three_voters_that_agree_are_agreed() {
        let v = judge(&round(&[A, B, C], vec![hash(A, 7), hash(B, 7), hash(C, 7)]));
        assert_eq!(
            v,
            Verdict::Agreed {
                revision: 42,
                hash: 7,
                agreeing: vec![A, B, C],
                silent: vec![]
            }
        );
        assert_eq!(v.label(), "agreed");
        assert_eq!(v.standing(B), Standing::Agrees);
    }

    #[test]
    fn one_of_three_answering_another_hash_is_diverged_with_the_proof() {
        let v = judge(&round(&[A, B, C], vec![hash(A, 7), hash(B, 9), hash(C, 7)]));
        let Verdict::Diverged(d) = &v else {
            panic!("{v:?}")
        };
        assert_eq!(d.revision, 42);
        assert_eq!(d.majority_hash, 7);
        assert_eq!(d.agreeing, vec![A, C]);
        assert_eq!(
            d.diverged,
            vec![HashGroup {
                hash: 9,
                members: vec![B]
            }]
        );
        assert_eq!(d.members().collect::<Vec<_>>(), vec![B]);
        assert_eq!(
            v.standing(B),
            Standing::Diverged {
                hash: 9,
                majority: 7
            }
        );
        assert_eq!(v.standing(A), Standing::Agrees);
        assert_eq!(v.label(), "diverged");
        assert_eq!(v.judged(), vec![(A, false), (C, false), (B, true)]);
        assert!(v.to_string().contains("b answered 00000009"), "{v}");
    }

    #[test]
    fn three_different_hashes_judge_nothing_and_say_so() {
        let v = judge(&round(&[A, B, C], vec![hash(A, 1), hash(B, 2), hash(C, 3)]));
        assert!(
            matches!(&v, Verdict::Undecided { why: NoProof::NoMajority { needed: 2, hashes, .. }, .. } if hashes.len() == 3),
            "{v:?}"
        );
        assert_eq!(v.label(), "split");
        assert_eq!(v.standing(A), Standing::Unknown);
        assert!(v.judged().is_empty());
        assert!(
            v.to_string()
                .contains("no hash has a strict majority of the 3 voters (2 needed)"),
            "{v}"
        );
    }

    #[test]
    fn a_silent_member_beside_a_disagreeing_one_judges_nothing() {
        // Of three voters one is silent: the two that answered differ, neither is a majority
        // of all voters.
        let v = judge(&round(&[A, B, C], vec![hash(A, 7), hash(B, 9), silent(C)]));
        let Verdict::Undecided {
            why: NoProof::NoMajority { silent, .. },
            ..
        } = &v
        else {
            panic!("{v:?}")
        };
        assert_eq!(silent, &vec![C]);
        assert_eq!(v.standing(B), Standing::Unknown);
        assert!(v.to_string().contains("no answer from c"), "{v}");
    }

    #[test]
    fn fewer_answers_than_a_majority_judge_nothing_even_when_they_agree() {
        let v = judge(&round(&[A, B, C, D, E], vec![hash(A, 7), hash(B, 7)]));
        assert!(matches!(&v, Verdict::Undecided { .. }), "{v:?}");
        assert_eq!(v.label(), "undecided");
        assert!(
            v.to_string().contains("only 2 of the 5 voters answered"),
            "{v}"
        );
    }

    #[test]
    fn a_silent_member_is_never_judged_and_a_majority_of_all_voters_still_proves() {
        // Five voters: three agree (a majority of all five), one differs, one is silent.
        let v = judge(&round(
            &[A, B, C, D, E],
            vec![hash(A, 7), hash(B, 7), hash(C, 7), hash(D, 9), silent(E)],
        ));
        let Verdict::Diverged(d) = &v else {
            panic!("{v:?}")
        };
        assert_eq!(d.members().collect::<Vec<_>>(), vec![D]);
        assert_eq!(d.silent, vec![E]);
        assert_eq!(v.standing(E), Standing::Unknown);
        // Two agree, two differ, one silent: two is not a majority of five.
        let v = judge(&round(
            &[A, B, C, D, E],
            vec![hash(A, 7), hash(B, 7), hash(C, 9), hash(D, 9), silent(E)],
        ));
        assert_eq!(v.label(), "split");
    }

    #[test]
    fn answers_of_non_voters_and_repeated_answers_do_not_count() {
        // A learner's (D) answer and a second answer from B cannot make a majority.
        let v = judge(&round(
            &[A, B, C],
            vec![hash(A, 7), hash(B, 9), hash(B, 9), hash(D, 9), silent(C)],
        ));
        assert!(matches!(&v, Verdict::Undecided { .. }), "{v:?}");
    }

    #[test]
    fn answers_from_different_compacted_revisions_do_not_compare() {
        let mut later = hash(C, 9);
        later.got = Answered::Hash {
            hash: 9,
            compact_revision: 30,
        };
        let v = judge(&round(&[A, B, C], vec![hash(A, 7), hash(B, 7), later]));
        assert!(
            matches!(
                &v,
                Verdict::Undecided {
                    why: NoProof::CompactionDiffers { .. },
                    ..
                }
            ),
            "{v:?}"
        );
    }

    #[test]
    fn no_voters_judge_nothing() {
        let v = judge(&round(&[], vec![hash(A, 7)]));
        assert_eq!(
            v,
            Verdict::Undecided {
                revision: 42,
                why: NoProof::NoVoters
            }
        );
    }

    #[test]
    fn the_common_revision_is_the_lowest_reported() {
        assert_eq!(common_revision(&[12, 9, 15]), Some(9));
        assert_eq!(common_revision(&[]), None);
        assert_eq!(common_revision(&[0]), None);
    }

    #[test]
    fn a_check_round_trips_as_json_with_hex_ids() {
        let check = HashCheck {
            at: 5,
            checker: A,
            answers: vec![hash(A, 7), hash(B, 9), silent(C)],
            verdict: judge(&round(&[A, B, C], vec![hash(A, 7), hash(B, 9), hash(C, 7)])),
        };
        let text = serde_json::to_string(&check).unwrap_or_default();
        assert!(text.contains(r#""outcome":"diverged""#), "{text}");
        assert!(text.contains(r#""agreeing":["a","c"]"#), "{text}");
        let back: HashCheck = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, check);
    }
}
