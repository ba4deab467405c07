//! `init`: observe → decide → act, round after round, until the decision is to start
//! etcd. Every act is followed by a fresh observation, so the agent can be killed at any
//! point and run again.

use std::path::PathBuf;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use serde_json::{json, Value};
use thiserror::Error;

use crate::cluster::{Connector, Etcd, EtcdError};
use crate::config::InitConfig;
use crate::datadir::{self, DataDirError, WalState};
use crate::decide::{decide, Action, BootstrapStep, ClusterFacts, Decision, Facts};
use crate::dns::{Dns, Lookup};
use crate::etcd_args::{etcd_argv, existing_initial_cluster, StartMode};
use crate::observe::Observer;

#[derive(Debug, Error)]
pub enum InitError {
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    Dns(#[from] crate::dns::DnsSetupError),
}

/// What `init` ends with.
#[derive(Debug)]
pub enum Outcome {
    /// `--dry-run`: the decision, to print.
    DryRun(Value),
    /// Start etcd: exec `bin` with `argv`.
    Exec { bin: PathBuf, argv: Vec<String> },
}

/// After writing the formation marker: long enough for peers started at the same moment
/// to write theirs, short next to etcd's own start.
const PREPARE_PAUSE: Duration = Duration::from_millis(25);
/// etcd refuses membership changes for 5 s after one ("unhealthy cluster"): retry on a
/// flat period rather than a growing back-off, which would overshoot the window by seconds.
const UNHEALTHY_CLUSTER_RETRY: Duration = Duration::from_millis(250);

/// How long a formation member other than ordinal 0 waits for ordinal 0's etcd to serve
/// its peer API before it starts etcd anyway (the others can form a quorum without it).
const SEED_WAIT: Duration = Duration::from_secs(2);
const SEED_POLL: Duration = Duration::from_millis(10);
/// One look at ordinal 0's peer API: a serving etcd answers on loopback or a pod network
/// in a few milliseconds.
const SEED_ANSWER_TIMEOUT: Duration = Duration::from_millis(100);

/// The back-off between rounds that wait: from 50 ms (peers started together answer within
/// a few rounds) up to 5 s (a long wait costs its peers and DNS little).
fn delays() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(5))
        .with_factor(1.6)
        .with_jitter()
        .without_max_times()
        .build()
}

fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The decision with the facts it was taken on, as logged and as `--dry-run` prints it.
pub fn decision_json(f: &Facts, d: &Decision) -> Value {
    let data = match &f.data.wal {
        WalState::None => json!({"has_data": false}),
        WalState::Present(Ok(w)) => {
            json!({"has_data": true, "member_id": format!("{:x}", w.member_id), "cluster_id": format!("{:x}", w.cluster_id)})
        }
        WalState::Present(Err(e)) => json!({"has_data": true, "wal_error": e}),
    };
    let cluster = match &f.cluster {
        ClusterFacts::Healthy(v) => json!({
            "source": v.source, "cluster_id": format!("{:x}", v.cluster_id), "leader": format!("{:x}", v.leader),
            "members": v.members,
        }),
        ClusterFacts::NotReached { tried } => json!({"not_reached": tried}),
    };
    let peers: Vec<Value> = f
        .peers
        .iter()
        .map(|p| {
            let dns = match &p.dns {
                Lookup::Found(ips) => json!(ips),
                Lookup::NotFound => json!("not published"),
                Lookup::Failed(e) => json!(format!("failed: {e}")),
            };
            let report = match &p.report {
                None => Value::Null,
                Some(Ok(r)) => json!(r),
                Some(Err(e)) => json!({"error": e}),
            };
            json!({"name": p.name, "dns": dns, "report": report})
        })
        .collect();
    let mut out = json!({
        "action": d.action.name(),
        "reason": d.reason,
        "pod": f.name,
        "data_dir": data,
        "formation": f.data.formation,
        "own_dns": matches!(f.own_dns, Lookup::Found(_)),
        "cluster": cluster,
        "peers": peers,
    });
    match &d.action {
        Action::Bootstrap { step, formation } => {
            out["step"] = json!(step);
            out["token"] = json!(formation.token);
        }
        Action::Resume { member_id } => out["member_id"] = json!(format!("{member_id:x}")),
        Action::Replace { stale } => out["stale_member_id"] = json!(format!("{:x}", stale.id)),
        Action::SetAside { why } => out["set_aside"] = json!(why),
        _ => {}
    }
    if !f.data.notes.is_empty() {
        out["notes"] = json!(f.data.notes);
    }
    out
}

fn log_decision(f: &Facts, d: &Decision, round: u64) {
    let details = decision_json(f, d);
    let action = d.action.name();
    let inputs = json!({"data_dir": details["data_dir"], "formation": details["formation"], "cluster": details["cluster"], "peers": details["peers"]});
    if matches!(d.action, Action::Wait) {
        tracing::warn!(round, action, reason = %d.reason, inputs = %inputs, "waiting");
    } else {
        tracing::info!(round, action, reason = %d.reason, inputs = %inputs, "decision");
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Runs `init` until etcd can be started (or, with `--dry-run`, for one round).
pub async fn run<D, C>(init: InitConfig, dns: D, connector: C) -> Result<Outcome, InitError>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    let cfg = init.config.clone();
    if !init.dry_run {
        datadir::prepare(&cfg.data_dir)?;
    }
    let observer = Observer {
        cfg: cfg.clone(),
        dns,
        connector: connector.clone(),
    };
    let mut backoff = delays();
    let mut last_reason = String::new();
    let mut round = 0u64;
    loop {
        round += 1;
        let facts = observer.observe(nonce()).await?;
        let d = decide(&facts);
        log_decision(&facts, &d, round);
        if init.dry_run {
            return Ok(Outcome::DryRun(decision_json(&facts, &d)));
        }
        if d.reason != last_reason {
            backoff = delays();
            last_reason.clone_from(&d.reason);
        }
        let record = || json!({"ts": unix_now(), "action": d.action.name(), "reason": d.reason});
        let pause = match &d.action {
            Action::Wait => backoff.next(),
            Action::Restart => {
                datadir::record_decision(&cfg.data_dir, &record())?;
                return Ok(exec(&init, StartMode::Restart));
            }
            Action::Bootstrap {
                step: BootstrapStep::Prepare,
                formation,
            } => {
                datadir::write_formation(&cfg.data_dir, formation)?;
                tracing::info!(nonce = %formation.nonce, "formation marker written; waiting for every initial pod to prepare");
                Some(PREPARE_PAUSE)
            }
            Action::Bootstrap {
                step: BootstrapStep::Start,
                formation,
            } => {
                datadir::write_formation(&cfg.data_dir, formation)?;
                datadir::record_decision(&cfg.data_dir, &record())?;
                if cfg.identity.ordinal != 0 {
                    wait_for_seed(&cfg, &facts).await;
                }
                let mode = StartMode::New {
                    initial_cluster: formation.initial_cluster.clone(),
                    token: formation.token.clone().unwrap_or_default(),
                };
                return Ok(exec(&init, mode));
            }
            Action::Resume { .. } => {
                let ClusterFacts::Healthy(view) = &facts.cluster else {
                    continue;
                };
                datadir::record_decision(&cfg.data_dir, &record())?;
                let initial_cluster = existing_initial_cluster(&cfg.identity, &view.members);
                return Ok(exec(&init, StartMode::Existing { initial_cluster }));
            }
            Action::SetAside { why } => {
                match datadir::set_aside(&cfg.data_dir, why.slug(), unix_now())? {
                    Some(to) => {
                        tracing::warn!(moved_to = %to.display(), why = why.slug(), "data set aside (renamed, not deleted); this pod now joins as a new member")
                    }
                    None => tracing::info!("nothing to set aside"),
                }
                None
            }
            Action::Join | Action::Replace { .. } => {
                let ClusterFacts::Healthy(view) = &facts.cluster else {
                    continue;
                };
                let port = cfg.identity.client_port;
                let result = match connector.connect(&view.source, view.source_ip, port).await {
                    Err(e) => Err(e),
                    Ok(member) => match &d.action {
                        Action::Replace { stale } => member.remove(stale.id).await.map(|()| {
                            tracing::warn!(removed = %format!("{:x}", stale.id), via = %view.source, "stale member entry removed; joining as a new learner next");
                        }),
                        _ => member.add_learner(&facts.peer_url).await.map(|m| {
                            tracing::info!(member_id = %format!("{:x}", m.id), via = %view.source, "added as a learner; starting etcd next");
                        }),
                    },
                };
                if let Err(e) = &result {
                    match e {
                        EtcdError::UnhealthyCluster => {
                            tracing::info!(error = %e, retry_in = ?UNHEALTHY_CLUSTER_RETRY, "etcd refuses membership changes until its voters have been connected for 5 s; retrying");
                            Some(UNHEALTHY_CLUSTER_RETRY)
                        }
                        EtcdError::PeerUrlExists | EtcdError::MemberNotFound { .. } => {
                            tracing::info!(error = %e, "membership already changed by an earlier attempt; looking again");
                            backoff.next()
                        }
                        EtcdError::TooManyLearners => {
                            tracing::warn!("waiting for our turn: another learner is joining and etcd allows one at a time");
                            backoff.next()
                        }
                        _ => {
                            tracing::warn!(error = %e, action = d.action.name(), "membership change failed; will retry");
                            backoff.next()
                        }
                    }
                } else {
                    datadir::record_decision(&cfg.data_dir, &record())?;
                    None
                }
            }
        };
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
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
async fn wait_for_seed(cfg: &crate::config::Config, facts: &Facts) {
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

fn exec(init: &InitConfig, mode: StartMode) -> Outcome {
    let argv = etcd_argv(&init.config, &mode, &init.etcd_args);
    Outcome::Exec {
        bin: init.config.etcd_bin.clone(),
        argv,
    }
}
