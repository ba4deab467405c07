//! `etcd-steward restore --snapshot NAME | --to-revision N | --to-time T [--yes]`: the
//! "someone deleted everything at 10:02" case. Every pod sets its current data aside
//! (renamed, never deleted) and the cluster re-forms from that snapshot, or from a restore
//! point (a snapshot with the archive replayed onto it up to the revision or the moment),
//! through the backup restore path, once per request.
//! Like `recover`, the command plans and hands the request to every pod's sidecar
//! (`POST /peer/restore`); the pods do the work (each sidecar stops its etcd, each `init`
//! sets the data aside, then they form anew from the snapshot), so the command may be
//! killed and run again: a request held for the same snapshot is continued.

use serde_json::json;

use crate::backup::archive::rfc3339_ms;
use crate::backup::Backups;
use crate::clock::unix_now;
use crate::config::{Config, SnapshotRestoreArgs};
use crate::decision::{parse_restore_point, snapshot_choice, Why};
use crate::dns::Dns;
use crate::etcd::Connector;
use crate::facts::{ClusterFacts, Facts, Lookup, PointAt, RestoreRequest, RestoreWanted};
use crate::observe::list_backups;

use super::recover::Ended;
use super::{POLL, REPOST};

/// Every pod of `f` with its report's `restored_for` (`None` for a silent pod).
fn pods(f: &Facts) -> Vec<(String, Result<Option<String>, String>)> {
    let mut out = vec![(f.name.clone(), Ok(f.data.restored_for.clone()))];
    for p in &f.peers {
        let answer = match (&p.dns, &p.report) {
            (Lookup::NotFound, _) if p.ordinal >= f.replicas => continue,
            (_, Some(Ok(r))) => Ok(r.restored_for.clone()),
            (_, Some(Err(e))) => Err(format!("sidecar did not answer: {e}")),
            (_, None) => Err("name does not resolve".into()),
        };
        out.push((p.name.clone(), answer));
    }
    out
}

pub async fn run<D, C>(
    cfg: Config,
    args: &SnapshotRestoreArgs,
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
    let Some(backup_cfg) = cfg.backup.clone() else {
        return Ok(Ended::Refused(
            "restore needs --backup-url (or ETCD_STEWARD_BACKUP_URL)".into(),
        ));
    };
    let backups = Backups::new(&backup_cfg, cfg.etcd_bin.clone())?;
    let point = match point_of(args, &backups).await {
        Ok(point) => point,
        Err(refusal) => return Ok(Ended::Refused(refusal)),
    };
    let (snapshot, at) = parse_restore_point(&point);
    let manifests = backups.list().await?;
    let Some(m) = manifests.iter().find(|m| m.name == snapshot) else {
        return Ok(Ended::Refused(format!(
            "snapshot {snapshot} is not in {} (etcd-steward backup --list shows what is)",
            backup_cfg.url
        )));
    };
    if !m.verified || m.drill.as_ref().is_some_and(|d| !d.passed) {
        return Ok(Ended::Refused(format!(
            "snapshot {} is not usable: it {}",
            m.name,
            if m.verified {
                "failed its restore drill"
            } else {
                "failed its checksum when it was taken"
            }
        )));
    }
    let obs = cfg.observer(dns, connector);
    let f = obs.observe(String::new()).await?;
    let silent: Vec<String> = pods(&f)
        .into_iter()
        .filter_map(|(name, a)| a.err().map(|e| format!("{name} ({e})")))
        .collect();
    if !silent.is_empty() {
        return Ok(Ended::Refused(format!(
            "every pod must set its data aside, but {} did not answer",
            silent.join(", ")
        )));
    }
    let id = match &f.restore_request {
        Some(r) if r.snapshot == point => r.id.clone(),
        _ => format!("restore-{point}-{}", unix_now()),
    };
    let original = match &f.cluster {
        ClusterFacts::Healthy(v) => Some(v.cluster_id),
        ClusterFacts::NotReached { .. } => None,
    };
    let plan = json!({
        "id": id,
        "point": point,
        "snapshot": m.name,
        "revision": m.revision,
        "taken": m.time,
        "to": match at {
            None => json!({"revision": m.revision}),
            Some(PointAt::Revision(n)) => json!({"revision": n}),
            Some(PointAt::Time { unix_ms }) => json!({"time": rfc3339_ms(unix_ms)}),
        },
        "cluster": original.map(|c| format!("{c:x}")),
        "pods": pods(&f).into_iter().map(|(name, _)| json!({"pod": name, "step": "set-aside-and-restore"})).collect::<Vec<_>>(),
        "state": if args.yes { "requested" } else { "planned" },
        "writes_lost": match at {
            None => format!("every write after {} (revision {})", m.time, m.revision),
            Some(PointAt::Revision(n)) => format!("every write after revision {n}"),
            Some(PointAt::Time { unix_ms }) => format!("every write archived after {}", rfc3339_ms(unix_ms)),
        },
    });
    println!("{plan}");
    if !args.yes {
        return Ok(Ended::Planned);
    }
    let request = RestoreRequest {
        id: id.clone(),
        snapshot: point.clone(),
        expires_unix: unix_now() + crate::control::REQUEST_TTL.as_secs(),
    };
    let took = hand_over(&cfg, &f, &request).await?;
    if took < f.replicas as usize {
        anyhow::bail!("only {took} pods took the restore request; every initial pod must (run the command again)");
    }
    let deadline = tokio::time::Instant::now() + args.timeout;
    let mut handed = tokio::time::Instant::now();
    let mut last = String::new();
    loop {
        tokio::time::sleep(POLL).await;
        if handed.elapsed() >= REPOST {
            let _ = hand_over(&cfg, &f, &request).await;
            handed = tokio::time::Instant::now();
        }
        let now = obs.observe(String::new()).await?;
        let waiting: Vec<String> = pods(&now)
            .into_iter()
            .filter(|(_, a)| a.as_ref().ok().and_then(Option::as_deref) != Some(id.as_str()))
            .map(|(name, _)| name)
            .collect();
        let state = match &now.cluster {
            ClusterFacts::Healthy(v) if waiting.is_empty() && Some(v.cluster_id) != original => {
                println!(
                    "{}",
                    json!({"state": "restored", "restore": id, "point": point, "snapshot": m.name, "cluster": format!("{:x}", v.cluster_id), "members": v.members.len()})
                );
                return Ok(Ended::Recovered);
            }
            ClusterFacts::Healthy(_) if waiting.is_empty() => {
                "the old cluster still answers".to_string()
            }
            _ if !waiting.is_empty() => {
                format!("waiting for {} to set their data aside", waiting.join(", "))
            }
            _ => "waiting for the new cluster to serve".to_string(),
        };
        if state != last {
            eprintln!("{}", json!({"restore": id, "waiting": state}));
            last = state;
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(Ended::TimedOut(format!("restore {id} was requested but is not complete after {:?}; it goes on in the pods: see their /ready, and run this command again to follow it", args.timeout)));
        }
    }
}

/// The restore point the options name: `--snapshot`'s name as given, or the point the
/// store's snapshots and archive make for `--to-revision` / `--to-time`, chosen as `init`
/// chooses for `--restore revision:N` / `time:T`. A moment outside what the store restores
/// is refused with the range it does.
async fn point_of(args: &SnapshotRestoreArgs, backups: &Backups) -> Result<String, String> {
    let wanted = match (&args.snapshot, args.to_revision, args.to_time) {
        (Some(name), _, _) => return Ok(name.clone()),
        (None, Some(n), _) => RestoreWanted::Revision(n),
        (None, None, Some(unix_ms)) => RestoreWanted::Time(unix_ms),
        (None, None, None) => {
            return Err("restore needs --snapshot, --to-revision or --to-time".into())
        }
    };
    let facts = list_backups(&backups.store, wanted).await;
    match snapshot_choice(&facts, &[]) {
        Ok(Some(point)) => Ok(point),
        Ok(None) => Err(format!(
            "{} holds no snapshot to restore",
            backups.config.url
        )),
        Err(Why::NamedBackupUnusable { name, problem }) => Err(format!("{name} {problem}")),
        Err(why) => Err(why.to_string()),
    }
}

/// Hands the request to every pod whose name resolves; how many took it.
async fn hand_over(cfg: &Config, f: &Facts, request: &RestoreRequest) -> anyhow::Result<usize> {
    let body = serde_json::to_vec(request)?;
    let answers = super::hand_over(cfg, f, "/peer/restore", &body).await;
    Ok(answers.iter().filter(|(_, took)| took.is_ok()).count())
}
