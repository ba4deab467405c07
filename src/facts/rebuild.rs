//! The rebuild of a member whose data diverged (issue 27), as plain data and pure checks:
//! the leader's sidecar hands the diverged member's sidecar a [`RebuildRequest`] carrying
//! the check that proves it ([`HashCheck`]); that sidecar holds it only when the proof
//! stands on its own ([`proves`]: the verdict follows from the answers it carries, a strict
//! majority of the voters the member list names now agreed, and this member is among the
//! diverged) and its own member still answers another hash than the majority's
//! ([`confirmed`]). `init` sets the data aside only on a request its own sidecar holds whose
//! proof stands against the member list it observed.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::hashes::{judge, Answered, Divergence, HashAnswer, HashCheck, HashRound, Verdict};
use super::hex_id;

/// The leader's word that `member`'s data diverged from the majority's, with the proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildRequest {
    /// `rebuild-<member>`: one per member, so the same request handed again (each check
    /// that finds it still diverged) changes nothing where it is held.
    pub id: String,
    #[serde(with = "hex_id")]
    pub member: u64,
    /// The check that found it diverged.
    pub check: HashCheck,
    /// Unix seconds after which the request is ignored.
    pub expires_unix: u64,
}

impl RebuildRequest {
    /// The request for `member`, proven by `check`, held until `expires_unix`.
    pub fn new(member: u64, check: HashCheck, expires_unix: u64) -> Self {
        RebuildRequest {
            id: format!("rebuild-{member:x}"),
            member,
            check,
            expires_unix,
        }
    }
}

/// Pure: the divergence `request` proves about its member, given the voters the member
/// list names now, or why it proves nothing:
/// - the verdict it carries must be the one its answers give (a verdict is never taken on
///   its word);
/// - it must name the request's member as diverged;
/// - the voters it counted must be the voters now (a membership change since the check
///   makes its majority another one's).
pub fn proves<'a>(
    request: &'a RebuildRequest,
    voters_now: &[u64],
) -> Result<&'a Divergence, String> {
    let Verdict::Diverged(d) = &request.check.verdict else {
        return Err(format!(
            "the check it carries found no divergence ({})",
            request.check.verdict
        ));
    };
    let again = judge(&HashRound {
        revision: d.revision,
        voters: d.voters.clone(),
        answers: request.check.answers.clone(),
    });
    if again != request.check.verdict {
        return Err(format!(
            "the verdict it carries is not the one its answers give ({again})"
        ));
    }
    if !d.members().any(|m| m == request.member) {
        return Err(format!(
            "the check it carries does not find member {:x} diverged",
            request.member
        ));
    }
    let counted: BTreeSet<u64> = d.voters.iter().copied().collect();
    let now: BTreeSet<u64> = voters_now.iter().copied().collect();
    if counted != now {
        return Err(format!(
            "the check counted voters {} but the member list names {} now",
            ids(&counted),
            ids(&now)
        ));
    }
    Ok(d)
}

/// Pure: this member's own look before its data goes aside: its own `HashKV` at the proof's
/// revision (`own`: the hash and compacted revision, or why it did not answer) must still
/// differ from the majority's. No answer is no confirmation.
pub fn confirmed(d: &Divergence, own: Result<(u32, i64), String>) -> Result<(), String> {
    match own {
        Err(e) => Err(format!(
            "this member's own HashKV at revision {} did not answer ({e}): nothing is set aside on silence",
            d.revision
        )),
        Ok((_, compacted)) if compacted != d.compact_revision => Err(format!(
            "this member's HashKV at revision {} starts from compacted revision {compacted}, the proof's from {}: not comparable; the next check decides",
            d.revision, d.compact_revision
        )),
        Ok((hash, _)) if hash == d.majority_hash => Err(format!(
            "this member's own HashKV at revision {} is the majority's ({hash:08x}) now",
            d.revision
        )),
        Ok(_) => Ok(()),
    }
}

/// A member's `HashKV` answer (the hash and the compacted revision), or why there is none.
pub type HashKv = Result<(u32, i64), String>;

/// Pure: the majority's answers asked again by this member's own sidecar (`answers`: each
/// agreeing member's `HashKV` at the proof's revision, or why it did not answer). Every
/// member the proof counts as agreeing must answer the majority's hash again: the answers a
/// request carries are never taken on its word, so a request made up by a holder of the
/// control token cannot set a healthy member's data aside.
pub fn reasked(d: &Divergence, answers: &[(u64, HashKv)]) -> Result<(), String> {
    for member in &d.agreeing {
        match answers.iter().find(|(m, _)| m == member).map(|(_, a)| a) {
            None => {
                return Err(format!(
                    "member {member:x}, which the proof counts as the majority's, was not asked again"
                ))
            }
            Some(Err(e)) => {
                return Err(format!(
                    "member {member:x}, which the proof counts as the majority's, did not answer again ({e}): nothing is set aside on silence"
                ))
            }
            Some(Ok((hash, compacted)))
                if *hash != d.majority_hash || *compacted != d.compact_revision =>
            {
                return Err(format!(
                    "member {member:x} answers HashKV {hash:08x} (compacted at {compacted}) at revision {}, not the majority's {:08x} the proof claims",
                    d.revision, d.majority_hash
                ))
            }
            Some(Ok(_)) => {}
        }
    }
    Ok(())
}

/// Pure: the rebuild request a member's own sidecar makes for it when its etcd does not
/// run (it refused to start on its data), from the hash of its database file computed
/// offline (`own`: the hash and compacted revision at `revision`, the file's own) and every
/// other voter's `HashKV` at that revision, asked from that sidecar (`others`). See
/// [`own_proof`].
pub fn offline_proof(
    member: u64,
    voters: &[u64],
    revision: i64,
    own: (u32, i64),
    others: Vec<HashAnswer>,
    at: u64,
    expires_unix: u64,
) -> Result<RebuildRequest, String> {
    let mut answers = vec![HashAnswer {
        member,
        got: Answered::Hash {
            hash: own.0,
            compact_revision: own.1,
        },
    }];
    answers.extend(others.into_iter().filter(|a| a.member != member));
    own_proof(
        member,
        HashRound {
            revision,
            voters: voters.to_vec(),
            answers,
        },
        at,
        expires_unix,
    )
}

/// Pure: the rebuild request a member's own sidecar makes for it from a round it asked
/// itself (its own answer and every other voter's, at one revision). The same rule as every
/// check: only a strict majority of all the round's voters answering one hash that differs
/// from this member's proves anything; the request then stands as one the leader's sidecar
/// hands over ([`proves`], [`confirmed`] and [`reasked`] hold by construction, and are
/// checked all the same). `Err` is the verdict in words when it proves nothing.
pub fn own_proof(
    member: u64,
    round: HashRound,
    at: u64,
    expires_unix: u64,
) -> Result<RebuildRequest, String> {
    let check = HashCheck {
        at,
        checker: member,
        verdict: judge(&round),
        answers: round.answers,
    };
    if !matches!(check.verdict, Verdict::Diverged(_)) {
        return Err(check.verdict.to_string());
    }
    let request = RebuildRequest::new(member, check, expires_unix);
    let d = proves(&request, &round.voters)?;
    let answer = |m: u64| -> HashKv {
        match request
            .check
            .answers
            .iter()
            .find(|a| a.member == m)
            .map(|a| &a.got)
        {
            Some(Answered::Hash {
                hash,
                compact_revision,
            }) => Ok((*hash, *compact_revision)),
            Some(Answered::NoAnswer { error }) => Err(error.clone()),
            None => Err("not asked".into()),
        }
    };
    confirmed(d, answer(member))?;
    let again: Vec<(u64, HashKv)> = d.agreeing.iter().map(|m| (*m, answer(*m))).collect();
    reasked(d, &again)?;
    Ok(request)
}

fn ids(set: &BTreeSet<u64>) -> String {
    let list: Vec<String> = set.iter().map(|m| format!("{m:x}")).collect();
    format!("[{}]", list.join(", "))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::facts::hashes::{Answered, HashAnswer};

    fn answer(member: u64, hash: u32) -> HashAnswer {
        HashAnswer {
            member,
            got: Answered::Hash {
                hash,
                compact_revision: 5,
            },
        }
    }

    fn check(answers: Vec<HashAnswer>) -> HashCheck {
        let round = HashRound {
            revision: 40,
            voters: vec![1, 2, 3],
            answers: answers.clone(),
        };
        HashCheck {
            at: 100,
            checker: 1,
            verdict: judge(&round),
            answers,
        }
    }

    fn diverged_3() -> RebuildRequest {
        RebuildRequest::new(
            3,
            check(vec![answer(1, 0xaa), answer(2, 0xaa), answer(3, 0xbb)]),
            u64::MAX,
        )
    }

    #[test]
    fn a_majoritys_hash_against_the_members_proves_it_diverged() {
        let r = diverged_3();
        let d = proves(&r, &[3, 2, 1]).unwrap();
        assert_eq!(d.majority_hash, 0xaa);
        assert!(confirmed(d, Ok((0xbb, 5))).is_ok());
    }

    #[test]
    fn a_verdict_its_answers_do_not_give_proves_nothing() {
        let mut r = diverged_3();
        // Member 3's answer says it agrees: the verdict it carries is taken on its word no more.
        r.check.answers[2] = answer(3, 0xaa);
        assert!(proves(&r, &[1, 2, 3]).unwrap_err().contains("not the one"));
    }

    #[test]
    fn a_proof_about_another_member_or_another_membership_proves_nothing() {
        let mut r = diverged_3();
        r.member = 2;
        assert!(proves(&r, &[1, 2, 3])
            .unwrap_err()
            .contains("does not find member 2"));
        let r = diverged_3();
        assert!(proves(&r, &[1, 2, 3, 4]).unwrap_err().contains("voters"));
        assert!(proves(&r, &[1, 2]).unwrap_err().contains("voters"));
    }

    #[test]
    fn a_split_or_an_agreement_proves_nothing() {
        let split = RebuildRequest::new(
            3,
            check(vec![answer(1, 0xaa), answer(2, 0xcc), answer(3, 0xbb)]),
            u64::MAX,
        );
        assert!(proves(&split, &[1, 2, 3])
            .unwrap_err()
            .contains("no divergence"));
        let silent = RebuildRequest::new(
            3,
            check(vec![
                answer(1, 0xaa),
                answer(3, 0xbb),
                HashAnswer {
                    member: 2,
                    got: Answered::NoAnswer {
                        error: "timed out".into(),
                    },
                },
            ]),
            u64::MAX,
        );
        assert!(proves(&silent, &[1, 2, 3]).is_err());
    }

    #[test]
    fn the_majoritys_answers_are_asked_again_and_a_made_up_majority_is_refused() {
        let r = diverged_3();
        let d = proves(&r, &[1, 2, 3]).unwrap();
        assert!(reasked(d, &[(1, Ok((0xaa, 5))), (2, Ok((0xaa, 5)))]).is_ok());
        // A request whose majority hash no member answers: made up.
        assert!(reasked(d, &[(1, Ok((0xbb, 5))), (2, Ok((0xbb, 5)))])
            .unwrap_err()
            .contains("not the majority's"));
        // One of the majority silent, or not asked: nothing.
        assert!(
            reasked(d, &[(1, Ok((0xaa, 5))), (2, Err("timed out".into()))])
                .unwrap_err()
                .contains("silence")
        );
        assert!(reasked(d, &[(1, Ok((0xaa, 5)))])
            .unwrap_err()
            .contains("not asked"));
    }

    #[test]
    fn a_database_file_hashed_offline_is_judged_by_the_majority_of_all_voters() {
        // The majority answers 0xaa at the file's revision: member 3's file diverged.
        let r = offline_proof(
            3,
            &[1, 2, 3],
            40,
            (0xbb, 5),
            vec![answer(1, 0xaa), answer(2, 0xaa)],
            100,
            900,
        )
        .unwrap();
        assert_eq!((r.member, r.check.checker, r.expires_unix), (3, 3, 900));
        let d = proves(&r, &[1, 2, 3]).unwrap();
        assert_eq!((d.revision, d.majority_hash), (40, 0xaa));
        // The file agrees: a member that is merely behind is not rebuilt.
        let agreed = offline_proof(
            3,
            &[1, 2, 3],
            40,
            (0xaa, 5),
            vec![answer(1, 0xaa), answer(2, 0xaa)],
            100,
            900,
        );
        assert!(agreed.unwrap_err().contains("agree"));
        // One other voter silent: two of three answers, no strict majority against it.
        let silent = HashAnswer {
            member: 2,
            got: Answered::NoAnswer {
                error: "revision 40 is compacted".into(),
            },
        };
        let err = offline_proof(
            3,
            &[1, 2, 3],
            40,
            (0xbb, 5),
            vec![answer(1, 0xaa), silent],
            100,
            900,
        )
        .unwrap_err();
        assert!(err.contains("nothing is judged diverged"), "{err}");
        // Of five voters, two agreeing against it are no majority.
        let err = offline_proof(
            5,
            &[1, 2, 3, 4, 5],
            40,
            (0xbb, 5),
            vec![answer(1, 0xaa), answer(2, 0xaa)],
            100,
            900,
        )
        .unwrap_err();
        assert!(err.contains("nothing is judged diverged"), "{err}");
        // An answer claiming to be this member's is not taken from the others.
        let r = offline_proof(
            3,
            &[1, 2, 3],
            40,
            (0xbb, 5),
            vec![answer(1, 0xaa), answer(2, 0xaa), answer(3, 0xaa)],
            100,
            900,
        )
        .unwrap();
        assert_eq!(r.check.answers.iter().filter(|a| a.member == 3).count(), 1);
    }

    #[test]
    fn the_members_own_look_must_still_differ_and_silence_confirms_nothing() {
        let r = diverged_3();
        let d = proves(&r, &[1, 2, 3]).unwrap();
        assert!(confirmed(d, Ok((0xaa, 5)))
            .unwrap_err()
            .contains("majority's"));
        assert!(confirmed(d, Err("deadline exceeded".into()))
            .unwrap_err()
            .contains("silence"));
        assert!(confirmed(d, Ok((0xbb, 9)))
            .unwrap_err()
            .contains("not comparable"));
    }
}
