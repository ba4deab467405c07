//! `etcd-steward recover`: observe (every pod's report, the cluster, this volume) → plan
//! (pure, [`super::plan`]) → print it. With `--yes`: hand the request to every pod's
//! sidecar (`POST /peer/recovery`), then follow it until the survivor serves as a
//! one-member cluster. The pods do the work (the survivor's sidecar stops etcd, its `init`
//! starts it forced, the others join as learners), so the command may be killed at any
//! step and run again: it finds the recovery under way and follows it.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;

use crate::config::{Config, RecoverArgs};
use crate::dns::Dns;
use crate::etcd::Connector;
use crate::facts::{ClusterFacts, Facts, Lookup, RecoveryRequest};
use crate::http_get;
use crate::init::observe::{view_from, HttpReports, Observer, PeerReports};
use crate::volume;

use super::plan::{plan, Plan};

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

const POLL: Duration = Duration::from_secs(1);
const POST_TIMEOUT: Duration = Duration::from_secs(3);
const REPOST: Duration = Duration::from_secs(5);

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A recovery under way or done: a volume's marker, with whether its forced start
/// happened, and whether a sidecar still holds that request.
fn recorded(f: &Facts) -> Option<(String, bool, bool)> {
    let held = |id: &str| f.recovery_request.as_ref().is_some_and(|r| r.id == id);
    if let Some(m) = &f.data.recovery {
        return Some((m.id.clone(), m.applied(f.data.tail.as_ref()), held(&m.id)));
    }
    f.peers.iter().find_map(|p| {
        let r = p.report.as_ref()?.as_ref().ok()?;
        let m = r.recovery.as_ref()?;
        Some((m.id.clone(), m.applied(r.log.as_ref()), held(&m.id)))
    })
}

async fn look<D, C, R>(obs: &Observer<D, C, R>) -> anyhow::Result<Facts>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
    R: PeerReports + Clone + 'static,
{
    let mut f = obs.observe(String::new()).await?;
    if f.data.has_data() {
        f.data.tail = volume::log_tail(&obs.cfg.data_dir)?;
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
    let reports = HttpReports::new(&cfg);
    let obs = Observer {
        cfg: cfg.clone(),
        dns,
        connector: connector.clone(),
        reports,
        store: None,
    };
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
    request(&obs, &f, &plan, &args.force_lost).await?;
    follow(&obs, &f, &plan, &args.force_lost, args.timeout).await
}

/// Hands the request to every pod whose name resolves; the survivor's sidecar must take it.
async fn request<D, C, R>(
    obs: &Observer<D, C, R>,
    f: &Facts,
    plan: &Plan,
    force_lost: &[String],
) -> anyhow::Result<()>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
    R: PeerReports + Clone + 'static,
{
    let cfg = &obs.cfg;
    let req = RecoveryRequest {
        id: plan.id.clone(),
        survivor: plan.survivor.clone(),
        force_lost: force_lost.to_vec(),
        expires_unix: unix_now() + crate::sidecar::recovery::REQUEST_TTL.as_secs(),
    };
    let body = serde_json::to_vec(&req)?;
    let (port, tls) = match &cfg.peer_tls {
        Some(t) => (cfg.peer_report_port, Some(t.client_config())),
        None => (cfg.http_port, None),
    };
    let mut targets: Vec<(u32, Lookup)> = vec![(f.ordinal, f.own_dns.clone())];
    targets.extend(f.peers.iter().map(|p| (p.ordinal, p.dns.clone())));
    let mut survivor_took = false;
    for (o, lookup) in targets {
        let name = cfg.identity.pod_name(o);
        let Some(ip) = lookup.first() else { continue };
        let addr = SocketAddr::new(ip, port);
        let host = cfg.identity.host(o);
        let r = http_get::post_json(
            addr,
            &host,
            "/peer/recovery",
            body.clone(),
            POST_TIMEOUT,
            tls.as_ref(),
        )
        .await;
        match r {
            Ok((202, _)) => {
                survivor_took |= name == plan.survivor;
                eprintln!(
                    "{}",
                    json!({"recovery": plan.id, "pod": name, "request": "held"})
                );
            }
            Ok((status, body)) => eprintln!(
                "{}",
                json!({"recovery": plan.id, "pod": name, "request": format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim())})
            ),
            Err(e) => eprintln!(
                "{}",
                json!({"recovery": plan.id, "pod": name, "request": e.to_string()})
            ),
        }
    }
    if !survivor_took {
        anyhow::bail!("the survivor {}'s sidecar did not take the recovery request; nothing was started (run the command again once it answers)", plan.survivor);
    }
    Ok(())
}

/// Follows the recovery until the survivor serves (a leader and a linearizable read).
async fn follow<D, C, R>(
    obs: &Observer<D, C, R>,
    f: &Facts,
    plan: &Plan,
    force_lost: &[String],
    timeout: Duration,
) -> anyhow::Result<Ended>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
    R: PeerReports + Clone + 'static,
{
    let cfg = &obs.cfg;
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
            let _ = request(obs, f, plan, force_lost).await;
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
