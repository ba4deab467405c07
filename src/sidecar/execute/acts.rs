//! Which of the executor's outcomes is a Kubernetes Event, with which reason and note (the
//! log's sentence). Pure. Only acts that changed membership or data are Events: a step
//! retried, moot or not yet done is not one (its log line is enough).

use crate::kube_api::events::Reason;
use crate::sidecar::plan::{Outcome, Step};

/// The Event `outcome` is, if any.
pub fn event_of(outcome: &Outcome) -> Option<(Reason, String)> {
    let Outcome::Done(step) = outcome else {
        return None;
    };
    Some(match step {
        Step::Promote { id, via, why } => (
            Reason::Promoted,
            format!("learner {id:x} promoted to voter (through {via}, {why})"),
        ),
        Step::RemoveLearner { id } => (
            Reason::LearnerRemoved,
            format!("removed learner {id:x}: it did not start or stopped progressing, so it cannot block the next join"),
        ),
        Step::UpdatePeerUrls { id, url, via } => (
            Reason::PeerURLUpdated,
            format!(
                "the cluster listed member {id:x} at another peer URL: updated to {url} (through {}), same member ID and data",
                via.as_deref().unwrap_or("this member")
            ),
        ),
        Step::RemoveMember { id, ordinal } => (
            Reason::ScaledIn,
            format!("scale-in: removed member {id:x} of the scaled-away ordinal {ordinal}, whose pod is gone"),
        ),
        Step::Defrag { why, .. } => (Reason::Defragmented, format!("member defragmented: {why}")),
        Step::BackupRound
        | Step::ArchiveRound { .. }
        | Step::SnapshotNow { .. }
        | Step::OfferRecovery { .. }
        | Step::DisarmNospace
        | Step::DisarmCorrupt
        | Step::TellRebuild { .. }
        | Step::CheckHashes { .. }
        | Step::IssueCertificates { .. } => return None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_of_a_scaled_away_member_is_a_scaled_in_event_naming_it() {
        let done = Outcome::Done(Step::RemoveMember {
            id: 0x8e9e_05c5_2164_694d,
            ordinal: 3,
        });
        let (reason, note) = event_of(&done).unwrap();
        assert_eq!(reason, Reason::ScaledIn);
        assert!(
            note.contains("8e9e05c52164694d") && note.contains("ordinal 3"),
            "{note}"
        );
    }

    #[test]
    fn a_step_that_failed_or_was_moot_is_no_event() {
        let step = || Step::RemoveLearner { id: 1 };
        assert_eq!(event_of(&Outcome::Failed(step(), "refused".into())), None);
        assert_eq!(event_of(&Outcome::Moot(step())), None);
        assert_eq!(event_of(&Outcome::NotYet(step())), None);
        assert_eq!(
            event_of(&Outcome::Done(step())).map(|e| e.0),
            Some(Reason::LearnerRemoved)
        );
    }
}
