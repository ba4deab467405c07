//! The one executor: performs the planners' steps against etcd and says what came of each.
//! It decides nothing; it logs each outcome once, here. A job whose I/O outlives a step has
//! its own file here: [`backup`] (rounds in the background), [`scale_in`] (the Kubernetes
//! API's watcher, the voters' probe), [`defrag`] (under the lock key).

pub mod backup;
pub mod defrag;
pub mod scale_in;

use super::conn::Connections;
use super::plan::{Outcome, Step};
use crate::dns::Dns;
use crate::etcd::{Connector, Etcd, EtcdError};
use backup::BackupRounds;
use defrag::defragment;

/// Performs `step`. A backup round is only started here (`backups`); it ends in its own
/// task and reports through a later observation.
pub async fn execute<D: Dns, C: Connector>(
    conn: &mut Connections<D, C>,
    backups: Option<&BackupRounds>,
    step: Step,
) -> Outcome {
    let result = match &step {
        Step::BackupRound => match backups {
            Some(rounds) => {
                rounds.start();
                Ok(())
            }
            None => Err(EtcdError::Other {
                endpoint: String::new(),
                detail: "no backup store configured (--backup-url)".into(),
            }),
        },
        Step::Promote { id, via, .. } => match conn.remote(via).await {
            Some(voter) => voter.promote(*id).await,
            None => Err(EtcdError::Unreachable {
                endpoint: via.clone(),
                detail: "no connection (name not resolved, or connect failed)".into(),
            }),
        },
        Step::RemoveLearner { id } => match conn.local().await {
            Ok(local) => local.remove(*id).await,
            Err(e) => Err(e),
        },
        Step::RemoveMember { id, .. } => match conn.local().await {
            Ok(local) => local.remove(*id).await,
            Err(e) => Err(e),
        },
        Step::UpdatePeerUrls { id, url, via: None } => match conn.local().await {
            Ok(local) => local.update_peer_urls(*id, std::slice::from_ref(url)).await,
            Err(e) => Err(e),
        },
        Step::UpdatePeerUrls {
            id,
            url,
            via: Some(peer),
        } => match conn.remote(peer).await {
            Some(m) => m.update_peer_urls(*id, std::slice::from_ref(url)).await,
            None => Err(EtcdError::TimedOut {
                endpoint: peer.clone(),
                detail: "no connection".into(),
            }),
        },
        Step::Defrag { lock, .. } => match conn.local().await {
            Ok(local) => match defragment(local, *lock).await {
                Ok(true) => Ok(()),
                Ok(false) => return logged(Outcome::NotYet(step)),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
        Step::DisarmNospace => match conn.local().await {
            Ok(local) => local.disarm_nospace().await.map(|n| {
                if n > 0 {
                    tracing::warn!(alarms = n, "NOSPACE disarmed: every member's database file is under the quota with margin after defragmentation; writes resume");
                }
            }),
            Err(e) => Err(e),
        },
    };
    logged(match result {
        Ok(()) => Outcome::Done(step),
        Err(EtcdError::AlreadyVoter { .. }) => Outcome::Moot(step),
        Err(EtcdError::MemberNotFound { .. }) if matches!(step, Step::RemoveMember { .. }) => {
            Outcome::Moot(step)
        }
        Err(EtcdError::LearnerNotReady { .. }) => Outcome::NotYet(step),
        Err(e) => Outcome::Failed(step, e.to_string()),
    })
}

fn logged(outcome: Outcome) -> Outcome {
    log(&outcome);
    outcome
}

fn log(outcome: &Outcome) {
    match outcome {
        Outcome::Done(Step::Promote { id, via, why }) => {
            tracing::info!(member_id = %format!("{id:x}"), via, when = %why, "learner promoted to voter");
        }
        Outcome::Moot(Step::Promote { .. }) => tracing::info!("already a voter"),
        Outcome::NotYet(Step::Promote { .. }) => {
            tracing::debug!("etcd says the learner is not in sync yet; retrying");
        }
        Outcome::Failed(Step::Promote { .. }, error) => {
            tracing::warn!(%error, "promotion failed; retrying");
        }
        Outcome::Done(Step::RemoveLearner { id }) => {
            tracing::warn!(member_id = %format!("{id:x}"), "removed a learner that did not start or stopped progressing, so it cannot block the next join");
        }
        Outcome::Failed(Step::RemoveLearner { id }, error) => {
            tracing::warn!(member_id = %format!("{id:x}"), %error, "could not remove stalled learner; retrying");
        }
        Outcome::Done(Step::UpdatePeerUrls { id, url, via }) => {
            tracing::warn!(member_id = %format!("{id:x}"), peer_url = %url, via = via.as_deref().unwrap_or("this member"), "the cluster listed this member at another peer URL: entry updated (MemberUpdate), same member ID and data");
        }
        Outcome::Failed(Step::UpdatePeerUrls { id, url, via }, error) => {
            tracing::warn!(member_id = %format!("{id:x}"), peer_url = %url, via = via.as_deref().unwrap_or("this member"), %error, "could not update this member's peer URL; retrying");
        }
        Outcome::Done(Step::RemoveMember { id, ordinal }) => {
            tracing::warn!(member_id = %format!("{id:x}"), ordinal, "scale-in: removed the member of a scaled-away ordinal whose pod is gone");
        }
        Outcome::Failed(Step::RemoveMember { id, ordinal }, error) => {
            tracing::warn!(member_id = %format!("{id:x}"), ordinal, %error, "scale-in: removal failed; retrying");
        }
        Outcome::Done(Step::BackupRound) => tracing::debug!("backup round started"),
        Outcome::Failed(Step::BackupRound, error) => {
            tracing::warn!(%error, "backup round not started");
        }
        Outcome::Done(Step::Defrag { why, lock }) => {
            tracing::warn!(why = %why, locked = lock, "member defragmented");
        }
        Outcome::NotYet(Step::Defrag { .. }) => {
            tracing::info!("another member is defragmenting (lock held); waiting");
        }
        Outcome::Failed(Step::Defrag { why, .. }, error) => {
            tracing::warn!(why = %why, %error, "defragmentation failed; retrying after a pause");
        }
        Outcome::Done(Step::DisarmNospace) => {}
        Outcome::Failed(Step::DisarmNospace, error) => {
            tracing::warn!(%error, "could not disarm NOSPACE; retrying");
        }
        Outcome::Moot(
            Step::RemoveLearner { .. }
            | Step::BackupRound
            | Step::UpdatePeerUrls { .. }
            | Step::Defrag { .. }
            | Step::DisarmNospace
            | Step::RemoveMember { .. },
        )
        | Outcome::NotYet(
            Step::RemoveLearner { .. }
            | Step::BackupRound
            | Step::UpdatePeerUrls { .. }
            | Step::DisarmNospace
            | Step::RemoveMember { .. },
        ) => {}
    }
}
