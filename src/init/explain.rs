//! How a decision is shown: the JSON object `init --dry-run` prints and each round's log
//! line carries (its `inputs` a nested object, so `jq .inputs.peers` reads it).

use serde_json::{json, Value};

use crate::facts::{BackupFacts, ClusterFacts, Facts, Lookup, WalState};

use crate::decision::{Action, Decision};

fn data_dir(f: &Facts) -> Value {
    match &f.data.wal {
        WalState::None => json!({"has_data": false}),
        WalState::Present(Ok(w)) => json!({
            "has_data": true,
            "member_id": format!("{:x}", w.member_id),
            "cluster_id": format!("{:x}", w.cluster_id),
        }),
        WalState::Present(Err(e)) => json!({"has_data": true, "wal_error": e}),
    }
}

fn cluster(f: &Facts) -> Value {
    match &f.cluster {
        ClusterFacts::Healthy(v) => json!({
            "source": v.source.host,
            "cluster_id": format!("{:x}", v.cluster_id),
            "leader": format!("{:x}", v.leader),
            "members": v.members,
        }),
        ClusterFacts::NotReached { tried } => json!({"not_reached": tried}),
    }
}

fn peers(f: &Facts) -> Value {
    f.peers
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
        .collect()
}

fn backups(f: &Facts) -> Value {
    match &f.backups {
        BackupFacts::Off => json!("off"),
        BackupFacts::NotAsked => json!("not asked"),
        BackupFacts::Unreachable { error } => json!({"unreachable": error}),
        BackupFacts::Listed {
            wanted,
            snapshots,
            keys,
        } => json!({
            "restore": wanted,
            "snapshots": snapshots,
            "keys": keys,
            "rejected_here": f.data.rejected_snapshots,
        }),
    }
}

fn versions(f: &Facts) -> Value {
    json!({
        "binary": f.versions.binary.map(|v| v.to_string()),
        "peers": f.versions.peers.iter().map(|p| json!({
            "name": p.name,
            "server": p.server.to_string(),
            "cluster": p.cluster.map(|v| v.to_string()),
        })).collect::<Vec<_>>(),
    })
}

/// What a decision was taken on: the facts a reader of an incident needs.
pub fn inputs(f: &Facts) -> Value {
    json!({
        "data_dir": data_dir(f),
        "formation": f.data.formation,
        "cluster": cluster(f),
        "peers": peers(f),
        "backups": backups(f),
        "versions": versions(f),
    })
}

/// The decision with the facts it was taken on, as `--dry-run` prints it.
pub fn decision_json(f: &Facts, d: &Decision) -> Value {
    let mut out = json!({
        "action": d.action.name(),
        "reason": d.reason(),
        "pod": f.name,
        "data_dir": data_dir(f),
        "formation": f.data.formation,
        "own_dns": matches!(f.own_dns, Lookup::Found(_)),
        "cluster": cluster(f),
        "peers": peers(f),
        "backups": backups(f),
        "versions": versions(f),
    });
    match &d.action {
        Action::Bootstrap(step) => {
            out["step"] = json!(step.step_name());
            out["token"] = json!(step.marker().token);
            out["snapshot"] = json!(step.marker().snapshot);
        }
        Action::Resume { member_id, .. } => out["member_id"] = json!(format!("{member_id:x}")),
        Action::Replace { stale, .. } => out["stale_member_id"] = json!(format!("{:x}", stale.id)),
        Action::SetAside { why } => out["set_aside"] = json!(why),
        Action::Join { via } | Action::Snapshot { via } => out["via"] = json!(via.host),
        Action::UpdatePeerUrls { member, via } => {
            out["member_id"] = json!(format!("{member:x}"));
            out["via"] = json!(via.host);
        }
        Action::Recover { id, commit, .. } => {
            out["recovery"] = json!(id);
            out["commit_index"] = json!(commit);
        }
        Action::Restart | Action::Wait => {}
    }
    if !f.data.notes.is_empty() {
        out["notes"] = json!(f.data.notes);
    }
    out
}

/// One line per round: `decision`, or `waiting` (a warning) while it waits.
pub fn log(f: &Facts, d: &Decision, round: u64) {
    let action = d.action.name();
    let inputs = inputs(f);
    if matches!(d.action, Action::Wait) {
        tracing::warn!(round, action, reason = %d.why, inputs = %inputs, "waiting");
    } else {
        tracing::info!(round, action, reason = %d.why, inputs = %inputs, "decision");
    }
}
