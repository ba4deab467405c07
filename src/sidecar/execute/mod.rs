//! The one executor: performs the planners' steps against etcd and says what came of each.
//! It decides nothing; it logs each outcome once, here. A job whose I/O outlives a step has
//! its own file here ([`Jobs`]): [`backup`] and [`archive`] (rounds in the background), [`scale_in`] (the
//! Kubernetes API's watcher, the voters' probe), [`defrag`] (under the lock key); each
//! also adds to the observation what its planner reads ([`Jobs::gather`]).

mod acts;
pub mod archive;
pub mod backup;
pub mod corruption;
pub mod defrag;
pub mod rebuild;
pub mod scale_in;

use tokio::sync::watch;

use super::conn::Connections;
use super::health::{Check, Health};
use super::plan::{Observation, Outcome, Step};
use super::recovery::AutoRecoverDuty;
use crate::dns::Dns;
use crate::etcd::{Connector, Etcd, EtcdError};
use crate::kube_api::events::Events;
use archive::ArchiveRounds;
use backup::BackupRounds;
use corruption::HashChecks;
use defrag::defragment;
use scale_in::ScaleInDuty;

/// The jobs whose I/O lives beside the loop: what each started runs in its own task and
/// comes back through a later observation.
#[derive(Default)]
pub struct Jobs {
    /// Backup rounds running in the background, with `--backup-url`.
    pub backups: Option<BackupRounds>,
    /// Archive rounds running in the background, with `--backup-url` and archiving on.
    pub archive: Option<ArchiveRounds>,
    /// With `--scale-in`: the API's watcher and the voters' probe.
    pub scale_in: Option<ScaleInDuty>,
    /// With `--auto-recover-after`: the looks for a proof of loss, and the inbox.
    pub auto_recover: Option<AutoRecoverDuty>,
    /// Kubernetes Events for the acts that change membership or data (off without the API
    /// or with `--events=false`).
    pub events: Events,
    /// With `--corruption-check-interval`: the checks this sidecar runs as leader, and the
    /// leader's verdict as read from its report.
    pub corruption: Option<HashChecks>,
    /// With `--corruption-check-interval`: hands a diverged member's sidecar its rebuild
    /// request.
    pub rebuild: Option<rebuild::Teller>,
    /// With `--tls-issuer-dir`: this pod's certificates, issued again when due.
    pub certificates: Option<crate::tls::issue::Issuing>,
}

impl Jobs {
    /// Adds to this tick's observation what each job has for its planner: the backup rounds
    /// that ended, the Kubernetes API's view and (when a removal waits only on them) the
    /// voters' answers, the looks for a proof of loss.
    pub async fn gather<D: Dns, C: Connector>(
        &mut self,
        conn: &mut Connections<D, C>,
        seen: &mut Observation,
    ) {
        seen.backup_rounds = self
            .backups
            .as_mut()
            .map(BackupRounds::ended)
            .unwrap_or_default();
        seen.archive_rounds = self
            .archive
            .as_mut()
            .map(ArchiveRounds::ended)
            .unwrap_or_default();
        if let Some(duty) = &self.scale_in {
            duty.gather(conn, seen).await;
        }
        if let Some(checks) = &mut self.corruption {
            checks.gather(conn, seen).await;
        }
        if let Some(duty) = &mut self.auto_recover {
            seen.recovery_looks = duty.looks();
        }
        seen.certificates_due = self.certificates.as_ref().and_then(|i| i.due(seen.unix));
    }

    /// What came of a step, for the jobs' own metrics.
    pub fn record(&self, outcome: &Outcome) {
        if let Some(rounds) = &self.backups {
            rounds.record(outcome);
        }
        if let Some(rounds) = &self.archive {
            rounds.record(outcome);
        }
    }
}

/// Performs `step`. A backup round is only started here (`jobs.backups`); it ends in its
/// own task and reports through a later observation. While etcd defragments it serves
/// nothing: `/ready` says so (`health`) before the step starts.
pub async fn execute<D: Dns, C: Connector>(
    conn: &mut Connections<D, C>,
    jobs: &Jobs,
    health: &watch::Sender<Health>,
    step: Step,
) -> Outcome {
    let result = match &step {
        Step::BackupRound => match &jobs.backups {
            Some(rounds) => {
                rounds.start();
                Ok(())
            }
            None => Err(EtcdError::Other {
                endpoint: String::new(),
                detail: "no backup store configured (--backup-url)".into(),
            }),
        },
        Step::ArchiveRound { from_store } => match &jobs.archive {
            Some(rounds) => {
                rounds.start(*from_store);
                Ok(())
            }
            None => Err(EtcdError::Other {
                endpoint: String::new(),
                detail: "archiving is off (no --backup-url, or --archive-interval=0)".into(),
            }),
        },
        Step::SnapshotNow { request, .. } => match &jobs.backups {
            Some(rounds) => {
                rounds.snapshot_now(*request);
                Ok(())
            }
            None => Err(EtcdError::Other {
                endpoint: String::new(),
                detail: "no backup store configured (--backup-url)".into(),
            }),
        },
        Step::CheckHashes { .. } => corruption::start(jobs.corruption.as_ref(), &step).map_err(
            |detail| EtcdError::Other {
                endpoint: String::new(),
                detail,
            },
        ),
        Step::OfferRecovery { id, survivor } => match &jobs.auto_recover {
            Some(duty) => {
                duty.offer(id, survivor);
                Ok(())
            }
            None => Err(EtcdError::Other {
                endpoint: String::new(),
                detail: "no automatic recovery configured (--auto-recover-after)".into(),
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
        Step::Defrag { why, lock } => {
            // etcd serves nothing while it defragments: not ready meanwhile.
            let reason = format!("defragmenting: {why}");
            health.send_modify(|h| h.ready = Check { ok: false, reason });
            match conn.local().await {
                Ok(local) => match defragment(local, *lock).await {
                    Ok(true) => Ok(()),
                    Ok(false) => return logged(Outcome::NotYet(step)),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            }
        }
        Step::TellRebuild { target, request } => match (&jobs.rebuild, &jobs.rebuild.as_ref().and_then(|t| t.pod_of(&target.peer_urls))) {
            (Some(teller), Some((pod, host))) => match conn.resolve(host).await {
                Some(ip) => {
                    teller.tell(pod.clone(), host.clone(), ip, request);
                    Ok(())
                }
                None => Err(EtcdError::Other {
                    endpoint: host.clone(),
                    detail: format!("{host} does not resolve: the rebuild request is not sent"),
                }),
            },
            (None, _) => Err(EtcdError::Other {
                endpoint: String::new(),
                detail: "rebuilds are off (--corruption-check-interval=0)".into(),
            }),
            (Some(_), None) => Err(EtcdError::Other {
                endpoint: String::new(),
                detail: format!(
                    "member {:x}'s peer URLs {:?} name no pod of this set",
                    target.id, target.peer_urls
                ),
            }),
        },
        Step::DisarmCorrupt => match conn.local().await {
            Ok(local) => local.disarm(crate::etcd::Alarm::Corrupt).await.map(|n| {
                if n > 0 {
                    tracing::warn!(alarms = n, "CORRUPT disarmed: every voter answered the majority's HashKV (the members the alarm named were rebuilt, or agree)");
                }
            }),
            Err(e) => Err(e),
        },
        Step::IssueCertificates { .. } => match &jobs.certificates {
            Some(issuing) => issuing
                .ensure(crate::clock::unix_now())
                .map(|_| ())
                .map_err(|e| EtcdError::Other {
                    endpoint: issuing.out_dir.display().to_string(),
                    detail: e.to_string(),
                }),
            None => Err(EtcdError::Other {
                endpoint: String::new(),
                detail: "no certificates are issued here (--tls-issuer-dir)".into(),
            }),
        },
        Step::DisarmNospace => match conn.local().await {
            Ok(local) => local.disarm(crate::etcd::Alarm::Nospace).await.map(|n| {
                if n > 0 {
                    tracing::warn!(alarms = n, "NOSPACE disarmed: every member's database file is under the quota with margin after defragmentation; writes resume");
                    jobs.events.post(
                        crate::kube_api::events::Reason::NospaceDisarmed,
                        format!("NOSPACE disarmed ({n} alarm(s)): every member's database file is under the quota with margin after defragmentation; writes resume"),
                    );
                }
            }),
            Err(e) => Err(e),
        },
    };
    let outcome = logged(match result {
        Ok(()) => Outcome::Done(step),
        Err(EtcdError::AlreadyVoter { .. }) => Outcome::Moot(step),
        Err(EtcdError::MemberNotFound { .. }) if matches!(step, Step::RemoveMember { .. }) => {
            Outcome::Moot(step)
        }
        Err(EtcdError::LearnerNotReady { .. }) => Outcome::NotYet(step),
        Err(e) => Outcome::Failed(step, e.to_string()),
    });
    posted(outcome, &jobs.events)
}

fn logged(outcome: Outcome) -> Outcome {
    log(&outcome);
    outcome
}

/// Posts the Event an outcome is (when it is one: an act that changed membership or data).
fn posted(outcome: Outcome, events: &Events) -> Outcome {
    if let Some((reason, note)) = acts::event_of(&outcome) {
        events.post(reason, note);
    }
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
        Outcome::Done(Step::SnapshotNow { ordinal, .. }) => {
            tracing::info!(
                ordinal,
                "scale-in: taking a snapshot before the member of this ordinal is removed"
            );
        }
        Outcome::Failed(Step::SnapshotNow { ordinal, .. }, error) => {
            tracing::warn!(ordinal, %error, "scale-in: the snapshot before the removal could not be started; the member is not removed");
        }
        Outcome::Failed(Step::BackupRound, error) => {
            tracing::warn!(%error, "backup round not started");
        }
        Outcome::Done(Step::ArchiveRound { .. }) => tracing::debug!("archive round started"),
        Outcome::Failed(Step::ArchiveRound { .. }, error) => {
            tracing::warn!(%error, "archive round not started");
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
        Outcome::Done(Step::DisarmNospace | Step::DisarmCorrupt) => {}
        Outcome::Done(Step::TellRebuild { target, request }) => {
            tracing::warn!(member = %format!("{:x}", target.id), request = %request.id, verdict = %request.check.verdict, "a member's data diverged from the majority's: its sidecar is told to rebuild it");
        }
        Outcome::Failed(Step::TellRebuild { target, .. }, error) => {
            tracing::warn!(member = %format!("{:x}", target.id), %error, "the rebuild request was not sent; the next check tells it again");
        }
        Outcome::Failed(Step::DisarmCorrupt, error) => {
            tracing::warn!(%error, "could not disarm CORRUPT; the next check tries again");
        }
        Outcome::Done(Step::OfferRecovery { .. }) => {}
        Outcome::Done(Step::CheckHashes { voters, .. }) => {
            tracing::debug!(voters = voters.len(), "corruption check started");
        }
        Outcome::Failed(Step::CheckHashes { .. }, error) => {
            tracing::warn!(%error, "corruption check not started");
        }
        Outcome::Failed(Step::OfferRecovery { id, .. }, error) => {
            tracing::warn!(recovery = %id, %error, "auto-recover: the request was not handed over");
        }
        Outcome::Done(Step::IssueCertificates { why }) => {
            tracing::info!(why = %why, "this pod's certificates issued again; etcd and the agent use them from their next handshake, nothing restarts");
        }
        Outcome::Failed(Step::IssueCertificates { why }, error) => {
            tracing::warn!(why = %why, %error, "this pod's certificates could not be issued again; trying again in a minute (the old ones stay in use)");
        }
        Outcome::Failed(Step::DisarmNospace, error) => {
            tracing::warn!(%error, "could not disarm NOSPACE; retrying");
        }
        Outcome::Moot(
            Step::RemoveLearner { .. }
            | Step::BackupRound
            | Step::ArchiveRound { .. }
            | Step::SnapshotNow { .. }
            | Step::UpdatePeerUrls { .. }
            | Step::Defrag { .. }
            | Step::DisarmNospace
            | Step::DisarmCorrupt
            | Step::TellRebuild { .. }
            | Step::RemoveMember { .. }
            | Step::CheckHashes { .. }
            | Step::OfferRecovery { .. }
            | Step::IssueCertificates { .. },
        )
        | Outcome::NotYet(
            Step::RemoveLearner { .. }
            | Step::BackupRound
            | Step::ArchiveRound { .. }
            | Step::SnapshotNow { .. }
            | Step::UpdatePeerUrls { .. }
            | Step::DisarmNospace
            | Step::DisarmCorrupt
            | Step::TellRebuild { .. }
            | Step::RemoveMember { .. }
            | Step::CheckHashes { .. }
            | Step::OfferRecovery { .. }
            | Step::IssueCertificates { .. },
        ) => {}
    }
}
