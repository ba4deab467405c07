//! Pure health assessment: one observation of the local member in, the liveness and
//! readiness verdicts out. Liveness never depends on quorum or on a peer.

use serde::Serialize;

/// The local member as one tick saw it (plain data, shared with the planners).
pub use super::plan::observation::{nospace, LocalObservation, PeerApi};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub ok: bool,
    pub reason: String,
}

fn check(ok: bool, reason: impl Into<String>) -> Check {
    Check {
        ok,
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Unknown,
    Learner,
    Voter,
}

/// The verdicts the probes and metrics serve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    pub live: Check,
    pub ready: Check,
    pub role: Role,
    pub leader_present: bool,
    /// How far this member's raft index is behind the leader's.
    pub raft_index_lag: Option<u64>,
    /// The local etcd answers on its client or peer API (false while init is still
    /// deciding, or etcd is down).
    pub etcd_running: bool,
}

impl Health {
    /// Before the first observation: alive (nothing is known to be wrong), not ready.
    pub fn starting() -> Self {
        Health {
            live: check(true, "sidecar starting; no observation yet"),
            ready: check(false, "sidecar starting; no observation yet"),
            role: Role::Unknown,
            leader_present: false,
            raft_index_lag: None,
            etcd_running: false,
        }
    }
}

/// Turns one observation into the liveness and readiness verdicts.
pub fn assess(o: &LocalObservation) -> Health {
    let live = match (&o.serializable, &o.peer_api) {
        (Ok(()), _) => check(true, "local etcd answers serializable reads"),
        (Err(_), Some(PeerApi::Answered)) => check(true, "local etcd is up but not serving clients yet (waiting for its peers); its peer API answers"),
        (Err(_), Some(PeerApi::NotListening)) => check(true, "local etcd is not running yet (init is deciding, or etcd is starting)"),
        (Err(e), Some(PeerApi::NoAnswer(p))) => check(false, format!("local etcd does not answer: client API: {e}; peer API: {p}")),
        (Err(e), None) => check(false, format!("local etcd does not answer: {e}")),
    };
    let (role, leader_present, lag) = match &o.status {
        Ok(s) => (
            if s.is_learner {
                Role::Learner
            } else {
                Role::Voter
            },
            s.leader != 0,
            if s.leader == s.member_id && s.leader != 0 {
                Some(0)
            } else {
                o.leader_index.map(|li| li.saturating_sub(s.raft_index))
            },
        ),
        Err(_) => (Role::Unknown, false, None),
    };
    let ready = match (&o.status, &o.linearizable) {
        (Err(e), _) => check(false, format!("local etcd status unavailable: {e}")),
        (Ok(s), _) if s.is_learner => check(
            false,
            format!(
                "member {:x} is a learner, not yet promoted (raft index {}, {} behind the leader)",
                s.member_id,
                s.raft_index,
                lag.map(|l| l.to_string()).unwrap_or_else(|| "?".into())
            ),
        ),
        (Ok(s), _) if s.leader == 0 => check(
            false,
            format!("member {:x} sees no leader (no quorum)", s.member_id),
        ),
        (Ok(s), _) if nospace(s) => check(
            false,
            format!(
                "NOSPACE: the database reached etcd's --quota-backend-bytes and etcd refuses writes until the alarm is disarmed; the sidecars defragment and disarm it when that frees enough, else the log says what to do (alarm active: {})",
                s.errors.join(", ")
            ),
        ),
        (Ok(s), _) if !s.errors.is_empty() => {
            check(false, format!("alarm active: {}", s.errors.join(", ")))
        }
        (Ok(_), Some(Err(e))) => check(
            false,
            format!("linearizable read through this member failed: {e}"),
        ),
        (Ok(_), None) => check(false, "linearizable read not attempted"),
        (Ok(s), Some(Ok(()))) => check(
            true,
            format!(
                "voter {:x} with leader {:x}; linearizable read succeeded",
                s.member_id, s.leader
            ),
        ),
    };
    Health {
        live,
        ready,
        role,
        leader_present,
        raft_index_lag: lag,
        etcd_running: o.serializable.is_ok()
            || o.status.is_ok()
            || o.peer_api == Some(PeerApi::Answered),
    }
}

/// Why member `me` is not ready when the newest check that judged it (`judged`) found its
/// data diverged from the majority's: it is taken out of readiness at once, and stays out
/// until a newer check finds it agreeing (or it is rebuilt under a new ID).
pub fn diverged(judged: Option<&crate::facts::hashes::HashCheck>, me: u64) -> Option<String> {
    use crate::facts::hashes::{Standing, Verdict};
    let check = judged?;
    let Standing::Diverged { hash, majority } = check.verdict.standing(me) else {
        return None;
    };
    let (revision, agreeing) = match &check.verdict {
        Verdict::Diverged(d) => (
            d.revision,
            d.agreeing
                .iter()
                .map(|m| format!("{m:x}"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        _ => (0, String::new()),
    };
    Some(format!(
        "data diverged: member {me:x}'s HashKV at revision {revision} is {hash:08x}, the majority's ({agreeing}) is {majority:08x} (check by {:x} at {}); it stays out of readiness until it is rebuilt from its peers",
        check.checker, check.at
    ))
}

/// What `init` waits for, as `/ready` and the peer report show it: only while the local
/// etcd does not answer, and only a note newer than init's last act (`last_act`, its
/// journal's last entry) — one left behind by an init that went on to start etcd is stale.
pub fn waiting_shown(
    note: Option<crate::facts::Waiting>,
    etcd_running: bool,
    last_act: Option<u64>,
) -> Option<crate::facts::Waiting> {
    note.filter(|w| !etcd_running && w.current(last_act))
}

#[cfg(test)]
mod diverged_tests {
    use super::diverged;
    use crate::facts::hashes::{judge, Answered, HashAnswer, HashCheck, HashRound};

    fn check(hashes: &[(u64, u32)]) -> HashCheck {
        let answers: Vec<HashAnswer> = hashes
            .iter()
            .map(|(member, hash)| HashAnswer {
                member: *member,
                got: Answered::Hash {
                    hash: *hash,
                    compact_revision: 1,
                },
            })
            .collect();
        let round = HashRound {
            revision: 9,
            voters: vec![0xa, 0xb, 0xc],
            answers: answers.clone(),
        };
        HashCheck {
            at: 100,
            checker: 0xa,
            verdict: judge(&round),
            answers,
        }
    }

    #[test]
    fn only_the_member_a_check_proved_diverged_is_not_ready_and_the_proof_is_said() {
        let c = check(&[(0xa, 7), (0xb, 9), (0xc, 7)]);
        let reason = diverged(Some(&c), 0xb).unwrap_or_default();
        assert!(
            reason.contains("data diverged: member b's HashKV at revision 9 is 00000009, the majority's (a, c) is 00000007"),
            "{reason}"
        );
        assert_eq!(diverged(Some(&c), 0xa), None);
        assert_eq!(diverged(None, 0xb), None);
        // Three different hashes prove nothing: nobody is taken out.
        let split = check(&[(0xa, 1), (0xb, 2), (0xc, 3)]);
        for m in [0xa, 0xb, 0xc] {
            assert_eq!(diverged(Some(&split), m), None);
        }
    }
}

#[cfg(test)]
mod waiting_tests {
    use super::waiting_shown;
    use crate::facts::Waiting;

    #[test]
    fn a_waiting_note_shows_only_while_etcd_is_down_and_init_has_not_acted_since() {
        let note = Waiting {
            since: 100,
            kind: "NoUsableBackup".into(),
            reason: "no key".into(),
        };
        assert_eq!(
            waiting_shown(Some(note.clone()), false, Some(50)),
            Some(note.clone())
        );
        assert_eq!(
            waiting_shown(Some(note.clone()), false, None),
            Some(note.clone())
        );
        assert_eq!(
            waiting_shown(Some(note.clone()), true, Some(50)),
            None,
            "etcd answers"
        );
        assert_eq!(
            waiting_shown(Some(note.clone()), false, Some(100)),
            None,
            "stale"
        );
        assert_eq!(waiting_shown(Some(note), false, Some(200)), None, "stale");
        assert_eq!(waiting_shown(None, false, None), None);
    }
}
