//! The fault schedules of [`crate::chaos`] played on Docker pods ([`crate::docker`]), where
//! faults are what a node does to a pod: containers SIGKILLed, a container frozen
//! (`docker pause`: etcd accepts connections and answers nothing), a pod cut off the cluster
//! network, a volume removed with its pod, every pod killed and started again in some order.
//! The checker is the loopback runner's ([`Outcome::violations`]).
//!
//! How each fault is made here:
//! - `KillPod`: both containers SIGKILLed; started again when healed.
//! - `KillSidecar`: the sidecar's container SIGKILLed; started again when healed.
//! - `Pause`: the etcd container frozen (`docker pause`); thawed when healed.
//! - `WithdrawDns`: the pod disconnected from the cluster network (Docker's DNS serves a
//!   pod's name only while it is attached, so the name goes with it): a partition of that
//!   pod from its peers, the writer (on the management network) still reaching it.
//! - `LoseVolume`: the pod removed with its volume; created again, empty, when healed.
//! - `RestartAll`: every pod killed, then started in the schedule's order.
//! - `Partition`: as `WithdrawDns`.
//! - `FillDisk` and `Backup` during the faults are not made on Docker (a named volume has no
//!   size to fill, and a backup's `docker exec` would hold the timeline up): they are
//!   skipped and not counted. A backup is taken after healing (`etcd-steward backup` by
//!   `docker exec` in the sidecar's container, into the set's `file://` store), and must
//!   succeed and verify.
//! - The "no data directory deleted" sentinels are the loopback runner's only: here no
//!   sentinel is planted (`sentinels: 0`).
//!
//! As kubelet does, an etcd container that exits by itself is started again (with its
//! sidecar) — except while the schedule holds that pod down.

use std::collections::BTreeSet;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use tokio::time::Instant;

use crate::chaos::{BackupTaken, Event, Fault, Outcome, Schedule, RECOVERY_BOUND};
use crate::docker::{docker, Cluster};
use crate::writer::{write_key, Writer};
use crate::Etcd;

enum Heal {
    Start(u32),
    StartSidecar(u32),
    Thaw(u32),
    Reconnect(u32),
    Recreate(u32),
    StartAll(Vec<u32>),
}

async fn client(c: &Cluster, o: u32) -> Option<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(Duration::from_secs(2));
    Client::connect([c.client_url(o)], Some(opts)).await.ok()
}

/// Acknowledged writes `0..acked` missing from a linearizable read through pod `o`.
async fn missing_writes(c: &Cluster, o: u32, acked: u64) -> Option<u64> {
    let mut cl = client(c, o).await?;
    let opts = GetOptions::new()
        .with_range(write_key(acked))
        .with_count_only();
    let r = cl.get(write_key(0), Some(opts)).await.ok()?;
    Some(acked.saturating_sub(u64::try_from(r.count()).unwrap_or(0)))
}

/// Every pod serves a linearizable read and lists `pods.len()` voters, and its sidecar says
/// ready.
async fn all_back(c: &Cluster, pods: &[u32]) -> bool {
    for o in pods {
        let Some(mut cl) = client(c, *o).await else {
            return false;
        };
        if cl.get("chaos-probe", None).await.is_err() {
            return false;
        }
        match cl.member_list().await {
            Ok(l)
                if l.members().len() == pods.len()
                    && l.members().iter().all(|m| !m.is_learner()) => {}
            _ => return false,
        }
        if !c.ready(*o).await {
            return false;
        }
    }
    true
}

/// Starts again the etcd containers that exited by themselves (and their sidecars), except
/// `held` (pods the schedule holds down).
async fn restart_exited(c: &Cluster, held: &BTreeSet<u32>) {
    for o in c.ordinals() {
        if held.contains(&o) {
            continue;
        }
        let ctr = c.etcd_ctr(o);
        let exited = docker(&["inspect", "-f", "{{.State.Status}}", &ctr])
            .await
            .is_ok_and(|s| s == "exited");
        if exited && docker(&["start", &ctr]).await.is_ok() {
            let _ = docker(&["restart", "-t", "2", &c.steward_ctr(o)]).await;
            c.say(&format!(
                "pod {o}: etcd container exited; restarted (as kubelet does)"
            ));
        }
    }
}

/// What a fault costs on Docker beyond [`Fault::cost`]: containers start and stop far slower
/// than processes, and this runner's faults are not calibrated as the loopback runner's are,
/// so it keeps the former flat 15 s.
pub const DOCKER_SLACK: Duration = Duration::from_secs(15);

/// Plays `schedule` on `c` (formed by [`Cluster::form`] on `etcd`, every pod a ready voter)
/// under a writer through every pod, heals, waits for recovery and checks.
pub async fn run(c: &mut Cluster, etcd: Etcd, schedule: &Schedule) -> Outcome {
    assert!(
        schedule.disaster.is_none(),
        "the Docker runner does not make generator 3's disasters (the loopback runner does)"
    );
    let pods: Vec<u32> = (0..schedule.pods).collect();
    let cluster_before = c.cluster_id(0).await;
    let mut ids_before = Vec::new();
    for o in &pods {
        ids_before.push(c.member_id(*o).await);
    }
    let started = Instant::now();
    let writer = Writer::start(pods.iter().map(|o| c.client_url(*o)).collect());
    // Each heal with the pod it frees (`None`: every pod) and its fault in `played`.
    let mut pending: Vec<(Duration, Heal, Option<u32>, usize)> = Vec::new();
    let mut played: Vec<Event> = Vec::new();
    let mut held: BTreeSet<u32> = BTreeSet::new();
    let mut lost_ids: Vec<u64> = Vec::new();
    let mut wiped: BTreeSet<u32> = BTreeSet::new();
    let mut applied = 0;
    let mut events = schedule.events.iter().peekable();
    loop {
        let now = started.elapsed();
        pending.sort_by_key(|(t, _, _, _)| *t);
        while pending.first().is_some_and(|(t, _, _, _)| *t <= now) {
            let (_, heal, _, i) = pending.remove(0);
            apply_heal(c, etcd, heal, &mut held).await;
            played[i].lasts = started.elapsed().saturating_sub(played[i].at);
        }
        if let Some(e) = events.peek() {
            // A volume loss waits for every copy (below), which can push it onto the next
            // fault of its pod: a fault waits until its pod's earlier fault is healed, as
            // the generator meant (one fault per pod at a time).
            let busy = pending.iter().any(|(_, _, p, _)| match (p, e.fault.pod()) {
                (Some(a), Some(b)) => *a == b,
                _ => true,
            });
            if e.at <= now && !busy {
                // A volume is lost only once every copy is back (see chaos::run).
                if matches!(e.fault, Fault::LoseVolume(_))
                    && now < e.at + RECOVERY_BOUND
                    && !all_back(c, &pods).await
                {
                    restart_exited(c, &held).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                let Some(e) = events.next().cloned() else {
                    break;
                };
                if !made_on_docker(&e.fault) {
                    c.say(&format!("chaos: {} — not made on Docker, skipped", e.fault));
                    continue;
                }
                if let Fault::LoseVolume(o) = e.fault {
                    let id = c.member_id(o).await;
                    if id != 0 {
                        lost_ids.push(id);
                    }
                    wiped.insert(o);
                }
                let at = started.elapsed();
                let heal = apply_fault(c, &e.fault, &mut held).await;
                pending.push((
                    started.elapsed() + e.lasts,
                    heal,
                    e.fault.pod(),
                    played.len(),
                ));
                // A withdrawn name is a cut here (see apply_fault).
                let fault = match e.fault {
                    Fault::WithdrawDns(o) => Fault::Partition(o),
                    f => f,
                };
                played.push(Event { at, fault, ..e });
                applied += 1;
                continue;
            }
        }
        if events.peek().is_none() && pending.is_empty() {
            break;
        }
        restart_exited(c, &held).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.say("chaos: every fault healed");
    let deadline = Instant::now() + RECOVERY_BOUND;
    let mut recovered = false;
    while Instant::now() < deadline {
        restart_exited(c, &held).await;
        if all_back(c, &pods).await {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    if recovered {
        writer
            .wait_progress(10, RECOVERY_BOUND, "after healing")
            .await;
    }
    let writes = writer.stop().await;
    // A backup after healing must succeed and verify (the store: `Cluster::enable_backups`).
    let (code, stdout, stderr) = c.exec_sidecar_steward(0, &["backup"]).await;
    let backups = vec![BackupTaken::from_parts(
        0,
        true,
        code == 0,
        &stdout,
        &stderr,
    )];
    let mut missing = Vec::new();
    let mut clusters = BTreeSet::new();
    if cluster_before != 0 {
        clusters.insert(cluster_before);
    }
    let mut reused_ids = Vec::new();
    let mut replaced = Vec::new();
    for o in &pods {
        missing.push(missing_writes(c, *o, writes.acked).await);
        let cid = c.cluster_id(*o).await;
        if cid != 0 {
            clusters.insert(cid);
        }
        let id = c.member_id(*o).await;
        let before = ids_before[*o as usize];
        if id != 0 && lost_ids.contains(&id) {
            reused_ids.push(id);
        } else if id != 0 && !wiped.contains(o) && before != 0 && before != id {
            replaced.push(*o);
        }
    }
    Outcome {
        seed: schedule.seed,
        faults: applied,
        writes,
        missing,
        clusters,
        reused_ids,
        replaced,
        corrupted: None,
        rebuilt: None,
        healed_after: None,
        rebuild_stops: Vec::new(),
        unwritten: Vec::new(),
        values_unread: Vec::new(),
        recovered,
        sentinels: 0,
        deleted: Vec::new(),
        wal_records: 0,
        wal_missing: Vec::new(),
        enospc_lines: 0,
        backups,
        defrags: 0,
        played,
        slack: DOCKER_SLACK,
        disaster_window: None,
        disaster: None,
        kube: None,
    }
}

/// Whether this runner makes the fault (see the module's doc): a full disk, a backup during
/// the faults and a corrupted value are skipped.
pub fn made_on_docker(f: &Fault) -> bool {
    !matches!(
        f,
        Fault::FillDisk(_) | Fault::Backup(_) | Fault::CorruptValue(_)
    )
}

async fn apply_fault(c: &mut Cluster, fault: &Fault, held: &mut BTreeSet<u32>) -> Heal {
    c.say(&format!("chaos: {fault}"));
    match fault {
        Fault::KillPod(o) => {
            held.insert(*o);
            c.kill(*o).await;
            Heal::Start(*o)
        }
        Fault::KillSidecar(o) => {
            let _ = docker(&["kill", &c.steward_ctr(*o)]).await;
            Heal::StartSidecar(*o)
        }
        Fault::Pause(o) => {
            let _ = docker(&["pause", &c.etcd_ctr(*o)]).await;
            Heal::Thaw(*o)
        }
        Fault::WithdrawDns(o) | Fault::Partition(o) => {
            c.partition(*o).await;
            Heal::Reconnect(*o)
        }
        Fault::FillDisk(_) | Fault::Backup(_) | Fault::CorruptValue(_) => {
            unreachable!("{fault}: not made on Docker, skipped by run (made_on_docker)")
        }
        Fault::LoseVolume(o) => {
            held.insert(*o);
            c.remove(*o, true).await;
            Heal::Recreate(*o)
        }
        Fault::RestartAll(order) => {
            for o in order {
                held.insert(*o);
                c.kill(*o).await;
            }
            Heal::StartAll(order.clone())
        }
    }
}

async fn apply_heal(c: &mut Cluster, etcd: Etcd, heal: Heal, held: &mut BTreeSet<u32>) {
    match heal {
        Heal::Start(o) => {
            let _ = docker(&["start", &c.etcd_ctr(o)]).await;
            let _ = docker(&["start", &c.steward_ctr(o)]).await;
            held.remove(&o);
            c.say(&format!("chaos: pod {o} started"));
        }
        Heal::StartSidecar(o) => {
            let _ = docker(&["start", &c.steward_ctr(o)]).await;
            c.say(&format!("chaos: pod {o}'s sidecar started"));
        }
        Heal::Thaw(o) => {
            let _ = docker(&["unpause", &c.etcd_ctr(o)]).await;
            c.say(&format!("chaos: pod {o} thawed"));
        }
        Heal::Reconnect(o) => c.heal(o).await,
        Heal::Recreate(o) => {
            c.create_pod(o, etcd).await;
            held.remove(&o);
        }
        Heal::StartAll(order) => {
            for o in order {
                let _ = docker(&["start", &c.etcd_ctr(o)]).await;
                let _ = docker(&["start", &c.steward_ctr(o)]).await;
                held.remove(&o);
            }
            c.say("chaos: every pod started again");
        }
    }
}
