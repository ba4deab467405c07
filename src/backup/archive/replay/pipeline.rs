//! Which transaction to send next while several are in flight, and what each answer
//! proves (pure: the replay sends and receives, this decides).
//!
//! Each revision's transaction carries up to two guards ([`super::plan::guards`]):
//! - *after*: a key its predecessor leaves at the predecessor's revision, so it cannot
//!   apply before its predecessor did;
//! - *once*: a key it leaves changed (its `mod_revision` below its own revision, or for a
//!   deleted key present and below it), so it cannot apply a second time.
//!
//! With both, every copy of a transaction applies at most once and only right after its
//! predecessor: exactly at its revision, proven by etcd's compares, not assumed from the
//! order of sending or from there being one copy in flight. A revision without an *after*
//! proof for its successor, or without its own *once* proof, waits until what it needs is
//! confirmed by answers (its predecessor applied; nothing else in flight).
//!
//! A transaction that reached etcd before its predecessor failed and changed nothing; so
//! did every one after it in flight (each needs the one before). They are sent again from
//! the first that failed, once every answer in flight is in: a full window sent at once
//! reaches etcd in one burst, which etcd handles far more cheaply than the same
//! transactions sent one by one as answers free the window (measured: BENCHMARKS.md,
//! *Archive replay speed*: sending again at once with a window that halved and grew back
//! ran at less than half the speed).

/// What one revision's transaction can prove by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proofs {
    /// It carries a guard that its predecessor was applied.
    pub after: bool,
    /// It carries a guard that it was not applied yet.
    pub once: bool,
}

/// One transaction to send: the position of its revision, and whether every revision
/// before it was confirmed applied when it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Send {
    pub pos: usize,
    pub confirmed: bool,
}

/// etcd's answer to one transaction: applied or not, and the revision its header gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Applied { served: i64 },
    Failed { served: i64 },
}

/// The scratch etcd did not do what the proofs allow: the replay ends there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub archived: i64,
    pub served: i64,
}

/// The revisions of one run (`first`, `first + 1`, …), what is in flight and applied.
#[derive(Debug)]
pub struct Pipeline {
    first: i64,
    proofs: Vec<Proofs>,
    applied: Vec<bool>,
    /// Copies of each revision's transaction in flight.
    copies: Vec<u32>,
    /// Every position below it is applied.
    frontier: usize,
    /// The next position to send.
    next: usize,
    in_flight: usize,
    window: usize,
    /// Sending waits for every answer in flight (after an overtaking).
    draining: bool,
    /// Transactions sent again (copies beyond the first of each revision).
    pub resent: u64,
    /// Times a transaction overtook its predecessor and the ones after it were sent again.
    pub overtaken: u64,
    sent_once: Vec<bool>,
}

impl Pipeline {
    /// Revisions `first ..= first + proofs.len() - 1`; the revision before `first` is
    /// applied.
    /// At most `window` transactions are in flight at once.
    pub fn new(first: i64, proofs: Vec<Proofs>, window: usize) -> Pipeline {
        let n = proofs.len();
        Pipeline {
            first,
            proofs,
            applied: vec![false; n],
            copies: vec![0; n],
            frontier: 0,
            next: 0,
            in_flight: 0,
            window: window.max(1),
            draining: false,
            resent: 0,
            overtaken: 0,
            sent_once: vec![false; n],
        }
    }

    /// The revision at `pos`.
    pub fn revision(&self, pos: usize) -> i64 {
        self.first + i64::try_from(pos).unwrap_or(i64::MAX - self.first)
    }

    /// How many revisions from the first are applied (every one below is).
    pub fn applied(&self) -> usize {
        self.frontier
    }

    /// Every revision applied.
    pub fn finished(&self) -> bool {
        self.frontier == self.proofs.len()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The transaction to send now, if the window and the proofs allow one.
    pub fn send(&mut self) -> Option<Send> {
        while self.next < self.proofs.len() && self.applied[self.next] {
            self.next += 1;
        }
        let pos = self.next;
        let proofs = *self.proofs.get(pos)?;
        if self.in_flight >= self.window || (self.draining && self.in_flight > 0) {
            return None;
        }
        self.draining = false;
        let confirmed = self.frontier >= pos;
        let alone = confirmed && self.in_flight == 0;
        if !(confirmed || proofs.after) || !(proofs.once || alone) {
            return None;
        }
        self.copies[pos] += 1;
        self.in_flight += 1;
        self.next += 1;
        if std::mem::replace(&mut self.sent_once[pos], true) {
            self.resent += 1;
        }
        Some(Send { pos, confirmed })
    }

    /// etcd's `answer` to the copy `sent` of a transaction.
    pub fn answered(&mut self, sent: Send, answer: Answer) -> Result<(), Mismatch> {
        let pos = sent.pos;
        let archived = self.revision(pos);
        self.copies[pos] -= 1;
        self.in_flight -= 1;
        match answer {
            Answer::Applied { served } => {
                if served != archived || self.applied[pos] {
                    return Err(Mismatch { archived, served });
                }
                self.applied[pos] = true;
                while self.frontier < self.applied.len() && self.applied[self.frontier] {
                    self.frontier += 1;
                }
                Ok(())
            }
            // Applied by another copy, or another copy in flight will say.
            Answer::Failed { .. } if self.applied[pos] || self.copies[pos] > 0 => Ok(()),
            // Its predecessor was applied and nothing else can have applied it: the
            // scratch etcd is not the archive's.
            Answer::Failed { served } if sent.confirmed => Err(Mismatch { archived, served }),
            Answer::Failed { .. } => {
                // It reached etcd before its predecessor: nothing changed; send it and
                // the ones after it again, in one burst once every answer is in.
                if self.next > pos {
                    self.next = pos;
                    self.overtaken += 1;
                    self.draining = true;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const BOTH: Proofs = Proofs {
        after: true,
        once: true,
    };
    const FIXED: usize = 4;

    fn sends(p: &mut Pipeline) -> Vec<Send> {
        std::iter::from_fn(|| p.send()).collect()
    }

    fn pos(s: &[Send]) -> Vec<usize> {
        s.iter().map(|s| s.pos).collect()
    }

    fn applied(p: &Pipeline, pos: usize) -> Answer {
        Answer::Applied {
            served: p.revision(pos),
        }
    }

    #[test]
    fn in_order_answers_apply_every_revision_with_the_window_full() {
        let mut p = Pipeline::new(11, vec![BOTH; 6], FIXED);
        let first = sends(&mut p);
        assert_eq!(pos(&first), vec![0, 1, 2, 3]);
        assert!(first[0].confirmed && !first[1].confirmed);
        for s in first {
            p.answered(s, applied(&p, s.pos)).unwrap();
        }
        assert_eq!(p.applied(), 4);
        let rest = sends(&mut p);
        assert_eq!(pos(&rest), vec![4, 5]);
        for s in rest {
            p.answered(s, applied(&p, s.pos)).unwrap();
        }
        assert!(p.finished());
        assert_eq!((p.resent, p.overtaken), (0, 0));
    }

    #[test]
    fn after_an_overtaking_nothing_is_sent_until_every_answer_is_in_then_a_full_window_goes() {
        let mut p = Pipeline::new(11, vec![BOTH; 6], FIXED);
        let s = sends(&mut p);
        // 1 reached etcd before 0: it failed, and so will 2 and 3 behind it.
        p.answered(s[1], Answer::Failed { served: 10 }).unwrap();
        p.answered(s[0], applied(&p, 0)).unwrap();
        assert_eq!(sends(&mut p), vec![]);
        p.answered(s[2], Answer::Failed { served: 11 }).unwrap();
        assert_eq!(sends(&mut p), vec![]);
        p.answered(s[3], Answer::Failed { served: 11 }).unwrap();
        assert_eq!(p.overtaken, 1);
        let again = sends(&mut p);
        assert_eq!(pos(&again), vec![1, 2, 3, 4]);
        assert!(again[0].confirmed && !again[1].confirmed);
        for s in again {
            p.answered(s, applied(&p, s.pos)).unwrap();
        }
        let rest = sends(&mut p);
        assert_eq!(pos(&rest), vec![5]);
        p.answered(rest[0], applied(&p, 5)).unwrap();
        assert!(p.finished());
        assert_eq!((p.resent, p.in_flight()), (3, 0));
    }

    #[test]
    fn a_failed_copy_is_harmless_when_another_copy_applied_the_revision() {
        let mut p = Pipeline::new(11, vec![BOTH; 2], 1);
        let s = sends(&mut p);
        p.answered(s[0], applied(&p, 0)).unwrap();
        // A revision is applied (say by a copy whose answer came first): a failed copy of
        // it proves nothing more and changes nothing.
        let s = sends(&mut p);
        p.answered(s[0], applied(&p, 1)).unwrap();
        p.copies[1] += 1;
        p.in_flight += 1;
        p.answered(s[0], Answer::Failed { served: 12 }).unwrap();
        assert!(p.finished());
    }

    #[test]
    fn a_failure_after_the_predecessor_was_confirmed_or_a_success_at_another_revision_is_a_mismatch(
    ) {
        let mut p = Pipeline::new(11, vec![BOTH; 2], FIXED);
        let s = sends(&mut p);
        assert!(s[0].confirmed);
        assert_eq!(
            p.answered(s[0], Answer::Failed { served: 10 }),
            Err(Mismatch {
                archived: 11,
                served: 10
            })
        );
        let mut p = Pipeline::new(11, vec![BOTH; 2], FIXED);
        let s = sends(&mut p);
        assert_eq!(
            p.answered(s[0], Answer::Applied { served: 12 }),
            Err(Mismatch {
                archived: 11,
                served: 12
            })
        );
    }

    #[test]
    fn a_revision_without_its_own_proof_goes_alone_and_one_after_an_unprovable_predecessor_waits() {
        let unprovable_twice = Proofs {
            after: true,
            once: false,
        };
        let after_unprovable = Proofs {
            after: false,
            once: true,
        };
        let mut p = Pipeline::new(
            11,
            vec![BOTH, unprovable_twice, after_unprovable, BOTH],
            FIXED,
        );
        let s = sends(&mut p);
        assert_eq!(pos(&s), vec![0]);
        p.answered(s[0], applied(&p, 0)).unwrap();
        let s = sends(&mut p);
        assert_eq!(pos(&s), vec![1]);
        assert!(s[0].confirmed);
        p.answered(s[0], applied(&p, 1)).unwrap();
        let s = sends(&mut p);
        assert_eq!(pos(&s), vec![2, 3]);
    }
}
