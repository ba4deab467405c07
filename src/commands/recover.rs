//! `etcd-steward recover`: observe (every pod's report, the cluster, this volume) → plan
//! (pure, [`crate::recovery`]) → print it. With `--yes`: hand the request to every pod's
//! sidecar (`POST /peer/recovery`), then follow it until the survivor serves as a
//! one-member cluster. The pods do the work (the survivor's sidecar stops etcd, its `init`
//! starts it forced, the others join as learners), so the command may be killed at any
//! step and run again: it finds the recovery under way and follows it.

use std::time::Duration;

use serde_json::json;

use crate::clock::unix_now;
use crate::config::{Config, RecoverArgs};
use crate::dns::Dns;
use crate::etcd::Connector;
use crate::facts::{ClusterFacts, Facts, Lookup, RecoveryRequest};
use crate::observe::{view_from, Observer, PeerReports};
use crate::volume;

use super::{POLL, REPOST};
use crate::recovery::{plan, recorded, Plan};

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The plan was printed (no `--yes`).
    Planned,
    /// The survivor serves as a one-member cluster (or had already been recovered).
    Recovered,
    /// Refused, with the one line that says why.
    Refused(String),
    /// `--yes`, but the survivor did not serve within `--timeout`.
    TimedOut(String),
}

async fn look<D, C, R>(obs: &Observer<D, C, R>) -> anyhow::Result<Facts>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
    R: PeerReports + Clone + 'static,
{
    let mut f = obs.observe(String::new()).await?;
    if f.data.has_data() {
        f.data.tail = volume::log_tail(&obs.pod.data_dir)?;
    }
    Ok(f)
}

/// Runs the command; prints the plan (one JSON object) on stdout and progress on stderr.
pub async fn run<D, C>(
    cfg: Config,
    args: &RecoverArgs,
    dns: D,
    connector: C,
) -> anyhow::Result<Ended>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    if args.yes {
        if let Some(why) = super::control_unavailable(&cfg) {
            return Ok(Ended::Refused(why));
        }
    }
    let obs = cfg.observer(dns, connector.clone());
    let f = look(&obs).await?;
    let under_way = recorded(&f);
    if let ClusterFacts::Healthy(view) = &f.cluster {
        if let Some((id, true, true)) = &under_way {
            println!(
                "{}",
                json!({"state": "recovered", "recovery": id, "cluster": format!("{:x}", view.cluster_id), "members": view.members.len()})
            );
            return Ok(Ended::Recovered);
        }
    }
    let pending = under_way
        .as_ref()
        .filter(|(_, applied, _)| !applied)
        .map(|(id, _, _)| id.as_str());
    let plan = match plan(&f, &args.force_lost, pending) {
        Ok(p) => p,
        Err(refusal) => return Ok(Ended::Refused(refusal.to_string())),
    };
    let mut out = serde_json::to_value(&plan)?;
    out["state"] = json!(if args.yes { "requested" } else { "planned" });
    if !args.yes {
        out["next"] = json!("run the same command with --yes to carry this plan out");
        println!("{out}");
        return Ok(Ended::Planned);
    }
    println!("{out}");
    // One request, handed over again unchanged while it is followed.
    let req = RecoveryRequest {
        id: plan.id.clone(),
        survivor: plan.survivor.clone(),
        force_lost: args.force_lost.clone(),
        expires_unix: unix_now() + crate::control::REQUEST_TTL.as_secs(),
    };
    request(&cfg, &f, &req, true).await?;
    follow(&cfg, &obs, &f, &plan, &req, args.timeout).await
}

/// Hands the request to every pod whose name resolves (saying, with `say`, which took it);
/// the survivor's sidecar must take it.
async fn request(cfg: &Config, f: &Facts, req: &RecoveryRequest, say: bool) -> anyhow::Result<()> {
    let body = serde_json::to_vec(req)?;
    let mut survivor_took = false;
    for (pod, took) in super::hand_over(cfg, f, "/peer/recovery", &body).await {
        survivor_took |= took.is_ok() && pod == req.survivor;
        if say {
            let answer = took.err().unwrap_or_else(|| "held".into());
            eprintln!(
                "{}",
                json!({"recovery": req.id, "pod": pod, "request": answer})
            );
        }
    }
    if !survivor_took {
        anyhow::bail!("the survivor {}'s sidecar did not take the recovery request; nothing was started (run the command again once it answers)", req.survivor);
    }
    Ok(())
}

/// Follows the recovery until the survivor serves (a leader and a linearizable read).
async fn follow<D, C, R>(
    cfg: &Config,
    obs: &Observer<D, C, R>,
    f: &Facts,
    plan: &Plan,
    req: &RecoveryRequest,
    timeout: Duration,
) -> anyhow::Result<Ended>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
    R: PeerReports + Clone + 'static,
{
    let Some(o) = cfg.identity.ordinal_of_name(&plan.survivor) else {
        anyhow::bail!("{} is not a pod of this set", plan.survivor);
    };
    let host = cfg.identity.host(o);
    let lookup = if o == f.ordinal {
        f.own_dns.clone()
    } else {
        f.peers
            .iter()
            .find(|p| p.ordinal == o)
            .map(|p| p.dns.clone())
            .unwrap_or(Lookup::NotFound)
    };
    let Some(ip) = lookup.first() else {
        anyhow::bail!("{}'s name does not resolve", plan.survivor);
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::new();
    let mut handed = tokio::time::Instant::now();
    loop {
        // A sidecar restarted meanwhile has forgotten the request: hand it again.
        if handed.elapsed() >= REPOST {
            let _ = request(cfg, f, req, false).await;
            handed = tokio::time::Instant::now();
        }
        let state = match tokio::time::timeout(
            Duration::from_secs(3),
            view_from(&obs.connector, &host, ip, cfg.identity.client_port),
        )
        .await
        {
            Ok(Ok(view)) => {
                println!(
                    "{}",
                    json!({"state": "recovered", "recovery": plan.id, "survivor": plan.survivor, "cluster": format!("{:x}", view.cluster_id), "members": view.members.len(), "next": "the other pods join as learners and are promoted; watch /ready"})
                );
                return Ok(Ended::Recovered);
            }
            Ok(Err(e)) => e,
            Err(_) => "no answer".to_string(),
        };
        if state != last {
            eprintln!(
                "{}",
                json!({"recovery": plan.id, "survivor": plan.survivor, "waiting": state})
            );
            last = state;
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(Ended::TimedOut(format!("recovery {} was requested, but {} does not serve yet after {timeout:?}; it goes on in the pods: see {}'s /ready and its etcd container's log, and run this command again to follow it", plan.id, plan.survivor, plan.survivor)));
        }
        tokio::time::sleep(POLL).await;
    }
}
