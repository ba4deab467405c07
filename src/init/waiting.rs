//! Pure: what `init` notes on its volume about what it waits for (`waiting.json`, read by
//! `/ready`, the peer report and `status`). The note changes only when the reason does, so
//! a wait of hours costs one write, not one per round; it goes when init goes on to act.

use crate::facts::Waiting;

/// What to do with the note after a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The note says it already (or there is none and init does not wait).
    Keep,
    /// Write this note in place of the one before.
    Write(Waiting),
    /// Init acted: the note goes.
    Clear,
}

/// From the note `held` (as last written, or read at start) and what this round waits for
/// (`kind` and the sentence), if anything, at unix time `now`. A reason of the same kind
/// keeps its `since`: the details of a wait change (another peer answers) while it is still
/// the same wait.
pub fn change(held: Option<&Waiting>, waits: Option<(&str, String)>, now: u64) -> Change {
    match (held, waits) {
        (None, None) => Change::Keep,
        (Some(_), None) => Change::Clear,
        (Some(h), Some((kind, reason))) if h.kind == kind && h.reason == reason => Change::Keep,
        (held, Some((kind, reason))) => Change::Write(Waiting {
            since: held.filter(|h| h.kind == kind).map_or(now, |h| h.since),
            kind: kind.to_string(),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(since: u64, kind: &str, reason: &str) -> Waiting {
        Waiting {
            since,
            kind: kind.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_wait_is_written_once_and_not_again_while_its_reason_stays() {
        let first = change(None, Some(("NoUsableBackup", "no key".into())), 10);
        assert_eq!(first, Change::Write(note(10, "NoUsableBackup", "no key")));
        let held = note(10, "NoUsableBackup", "no key");
        for now in 11..20 {
            assert_eq!(
                change(Some(&held), Some(("NoUsableBackup", "no key".into())), now),
                Change::Keep
            );
        }
    }

    #[test]
    fn a_changed_reason_is_written_keeping_since_only_for_the_same_kind() {
        let held = note(10, "NoProofYet", "pods a, b");
        assert_eq!(
            change(Some(&held), Some(("NoProofYet", "pod b".into())), 30),
            Change::Write(note(10, "NoProofYet", "pod b"))
        );
        assert_eq!(
            change(Some(&held), Some(("ActionNotDone", "tool".into())), 30),
            Change::Write(note(30, "ActionNotDone", "tool"))
        );
    }

    #[test]
    fn acting_clears_the_note_and_nothing_to_clear_writes_nothing() {
        let held = note(10, "NoUsableBackup", "no key");
        assert_eq!(change(Some(&held), None, 30), Change::Clear);
        assert_eq!(change(None, None, 30), Change::Keep);
    }

    #[test]
    fn a_note_older_than_inits_last_act_is_stale() {
        let w = note(100, "NoUsableBackup", "no key");
        assert!(w.current(None), "init never acted on this volume");
        assert!(w.current(Some(99)));
        assert!(
            !w.current(Some(100)),
            "acted in the same second: the act came after"
        );
        assert!(!w.current(Some(200)), "etcd was started after the note");
    }

    #[test]
    fn a_waits_kind_is_its_reason_variant_name() {
        use crate::decision::Why;
        assert_eq!(Why::Left.name(), "Left");
        assert_eq!(
            Why::NoUsableBackup { skipped: vec![] }.name(),
            "NoUsableBackup"
        );
    }
}
