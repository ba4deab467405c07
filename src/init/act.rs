//! Performs one decided action: write a marker, set data aside, make one membership change,
//! or say how etcd starts. Each act is followed by a fresh observation (or by exec), so the
//! agent can be killed at any point and run again.

use std::path::Path;
use std::time::Duration;

use thiserror::Error;

use crate::config::Config;
use crate::etcd::{Connector, Etcd, EtcdError};
use crate::facts::{ActionKind, Facts};
use crate::volume::{self, journal, marker, VolumeError};

use super::decide::{Action, Bootstrap, Decision};
use super::etcd_args::StartMode;

/// After writing the formation marker: long enough for peers started at the same moment
/// to write theirs, short next to etcd's own start.
const PREPARE_PAUSE: Duration = Duration::from_millis(25);
/// How long a formation member other than ordinal 0 waits for ordinal 0's etcd to serve
/// its peer API before it starts etcd anyway (the others can form a quorum without it).
const SEED_WAIT: Duration = Duration::from_secs(2);
const SEED_POLL: Duration = Duration::from_millis(10);
/// One look at ordinal 0's peer API: a serving etcd answers on loopback or a pod network
/// in a few milliseconds.
const SEED_ANSWER_TIMEOUT: Duration = Duration::from_millis(100);

/// What the loop does after an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Exec etcd, started this way.
    Exec(StartMode),
    /// Observe again.
    LookAgain(Pause),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// At once: the action changed what the next round will see.
    Now,
    For(Duration),
    /// The back-off's next delay: nothing changed, the round waits for the world.
    Backoff,
}

#[derive(Debug, Error)]
pub enum ActError {
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error("{action} through {via}: {source}")]
    Membership {
        action: ActionKind,
        via: String,
        source: EtcdError,
    },
}

fn record(dir: &Path, d: &Decision, ts: u64) -> Result<(), VolumeError> {
    journal::append(
        dir,
        &journal::Entry {
            ts,
            action: d.action.kind(),
            reason: d.reason(),
        },
    )
}

/// Performs `d`, decided on `facts`; `now` is the unix time (for the journal and the
/// set-aside directory's name).
pub async fn act<C: Connector>(
    cfg: &Config,
    connector: &C,
    facts: &Facts,
    d: &Decision,
    now: u64,
) -> Result<Next, ActError> {
    let dir = &cfg.data_dir;
    match &d.action {
        Action::Wait => Ok(Next::LookAgain(Pause::Backoff)),
        Action::Restart => {
            record(dir, d, now)?;
            Ok(Next::Exec(StartMode::Restart))
        }
        Action::Bootstrap(step @ Bootstrap::Prepare { marker: m }) => {
            marker::write(dir, &step.marker())?;
            tracing::info!(nonce = %m.nonce, "formation marker written; waiting for every initial pod to prepare");
            Ok(Next::LookAgain(Pause::For(PREPARE_PAUSE)))
        }
        Action::Bootstrap(
            step @ Bootstrap::Start {
                initial_cluster,
                token,
                ..
            },
        ) => {
            marker::write(dir, &step.marker())?;
            record(dir, d, now)?;
            if facts.ordinal != 0 {
                wait_for_seed(cfg, facts).await;
            }
            Ok(Next::Exec(StartMode::New {
                initial_cluster: initial_cluster.clone(),
                token: token.clone(),
            }))
        }
        Action::Resume { members, .. } => {
            record(dir, d, now)?;
            Ok(Next::Exec(StartMode::Existing {
                members: members.clone(),
            }))
        }
        Action::SetAside { why } => {
            match volume::set_aside(dir, why.slug(), now)? {
                Some(to) => {
                    tracing::warn!(moved_to = %to.display(), why = why.slug(), "data set aside (renamed, not deleted); this pod now joins as a new member")
                }
                None => tracing::info!("nothing to set aside"),
            }
            Ok(Next::LookAgain(Pause::Now))
        }
        Action::Join { via } | Action::Replace { via, .. } => {
            let failed = |source| ActError::Membership {
                action: d.action.kind(),
                via: via.host.clone(),
                source,
            };
            let member = connector
                .connect(&via.host, via.ip, cfg.identity.client_port)
                .await
                .map_err(failed)?;
            if let Action::Replace { stale, .. } = &d.action {
                member.remove(stale.id).await.map_err(failed)?;
                tracing::warn!(removed = %format!("{:x}", stale.id), via = %via.host, "stale member entry removed; joining as a new learner next");
            } else {
                let added = member.add_learner(&facts.peer_url).await.map_err(failed)?;
                tracing::info!(member_id = %format!("{:x}", added.id), via = %via.host, "added as a learner; starting etcd next");
            }
            record(dir, d, now)?;
            Ok(Next::LookAgain(Pause::Now))
        }
    }
}

/// Before a new cluster's member other than ordinal 0 starts etcd: wait (bounded) until
/// ordinal 0's etcd serves its peer API.
///
/// Why: etcd starting a new cluster first asks its peers' `/members` whether the cluster
/// was already bootstrapped, one peer after another in URL order, allowing each a second.
/// A peer whose port is bound but does not serve yet (it is busy with the same question)
/// holds the question for that whole second, so members started at the same instant often
/// stall each other for 1–2 s. Ordinal 0's URL sorts first: once its etcd serves, every
/// other member's question is answered at once, and ordinal 0's own question, asked of
/// peers not yet listening, is refused at once.
async fn wait_for_seed(cfg: &Config, facts: &Facts) {
    let Some(ip) = facts
        .peers
        .iter()
        .find(|p| p.ordinal == 0)
        .and_then(|p| p.dns.first())
    else {
        return;
    };
    let host = cfg.identity.host(0);
    let started = tokio::time::Instant::now();
    tracing::info!(seed = %host, limit = ?SEED_WAIT, "forming a new cluster: waiting for ordinal 0's etcd to serve its peer API, so etcd's bootstrap check is answered at once");
    while started.elapsed() < SEED_WAIT {
        let answer = crate::http_get::etcd_peer_version(cfg, 0, ip, SEED_ANSWER_TIMEOUT).await;
        if answer.is_ok() {
            tracing::info!(seed = %host, waited = ?started.elapsed(), "ordinal 0's etcd serves; starting etcd");
            return;
        }
        tokio::time::sleep(SEED_POLL).await;
    }
    tracing::info!(seed = %host, waited = ?started.elapsed(), "ordinal 0's etcd does not serve yet; starting etcd anyway (the other members can form a quorum)");
}
