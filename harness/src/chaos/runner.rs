//! Running a schedule: readying the set, playing the faults under a writer, healing.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use etcd_client::GetOptions;
use tokio::time::Instant;

use super::check::{Outcome, Sentinels};
use super::corrupt::{all_written, corrupt_value, unwritten_values};
use super::schedule::{Event, Fault, Schedule, CORRUPTION_CHECK, DEFRAG_THRESHOLD};
use crate::backup_taken::BackupTaken;
use crate::bounds::{BACKUP_TIME_OUT, RECOVERY_BOUND};
use crate::disaster::Disaster;
use crate::kube_apiserver::KubeApiServer;
use crate::kube_writer::{KubeSeen, KubeWriter};
use crate::loopback::Set;
use crate::wal_kept::WalRecords;
use crate::writer::{Writer, WriterReport};

/// `etcd_steward_defrag_total` of every sidecar, summed over restarts (a restarted
/// sidecar counts from zero again).
struct DefragCount {
    before_restarts: Vec<u64>,
    last: Vec<u64>,
}

impl DefragCount {
    fn new(pods: usize) -> DefragCount {
        DefragCount {
            before_restarts: vec![0; pods],
            last: vec![0; pods],
        }
    }

    async fn sample(&mut self, set: &Set) {
        for o in 0..self.last.len() {
            // Briefly: the runner's timeline must not wait on a sidecar.
            let answer =
                tokio::time::timeout(Duration::from_millis(300), set.http(o as u32, "/metrics"));
            let Ok(Some((200, text))) = answer.await else {
                continue;
            };
            let Some(now) = crate::client::sample(&text, "etcd_steward_defrag_total") else {
                continue;
            };
            let now = now as u64;
            if now < self.last[o] {
                self.before_restarts[o] += self.last[o];
            }
            self.last[o] = now;
        }
    }

    fn total(&self) -> u64 {
        self.before_restarts.iter().sum::<u64>() + self.last.iter().sum::<u64>()
    }
}

/// Readies `set` (built, not started) for `schedule`: size-limited volumes when it fills a
/// disk, partitions when it cuts a pod off.
pub fn prepare(set: &mut Set, schedule: &Schedule) -> crate::Result<()> {
    if schedule.fills_disks() {
        set.limit_volumes(VOLUME_MIB)?;
    }
    if schedule.partitions() {
        set.enable_partitions()?;
    }
    if schedule.defrag {
        set.extra_args.push(DEFRAG_THRESHOLD.into());
    }
    if schedule.corrupts() {
        set.extra_args.push(CORRUPTION_CHECK.into());
    }
    if let Some(d) = &schedule.disaster {
        let options = crate::disaster::options(set, d);
        set.extra_args.extend(options);
    }
    Ok(())
}

/// The size of a volume that can be filled: room for etcd's preallocated 64 MiB WAL
/// segment, a second one and the database.
pub const VOLUME_MIB: u32 = 256;

/// The value corrupted on a pod's disk, until the agent rebuilt the member.
struct Corruption {
    pod: u32,
    /// Its event among those played: it lasts until the pods serve written values alone.
    played: usize,
    /// The member before the fault: a rebuild gives the pod another, never this one again.
    id: Option<u64>,
    /// The write whose value was changed.
    write: Option<u64>,
    /// Every pod answered with written values alone since the fault was applied.
    healed: bool,
    /// When it was healed, after the fault was applied.
    healed_after: Option<Duration>,
    /// When the runner saw the pod's etcd exit (and started it again, as kubelet would)
    /// while the value was not yet healed: the agent stopping the diverged member, or its
    /// new member's start.
    stops: Vec<Duration>,
}

impl Corruption {
    /// Whether the pods serve written values alone now (once the pod is started again: no
    /// heal of its event `pending`). The fault, as played, lasts only while its pod is down:
    /// the rebuild after it refuses no write through the healthy majority, and explains
    /// refusals only at each stop of the pod's etcd ([`Outcome::rebuild_stops`]).
    async fn heal_seen(
        &mut self,
        set: &Set,
        pods: &[u32],
        played: &[Event],
        pending: &[(Duration, Heal, usize)],
        now: Duration,
    ) {
        let started_again = !pending.iter().any(|(_, _, i)| *i == self.played);
        if !self.healed && started_again && all_written(set, pods).await {
            self.healed = true;
            let after = now.saturating_sub(played[self.played].at);
            self.healed_after = Some(after);
            eprintln!(
                "chaos: every pod serves written values alone ({after:?} after the corruption)"
            );
        }
    }
}

/// Starts exited etcd containers again, as kubelet would; an exit of the pod whose value is
/// corrupted, until it is healed, is recorded (at `now`) as a stop of its rebuild.
fn restart_exited(set: &mut Set, corruption: &mut Option<Corruption>, now: Duration) {
    let Ok(restarted) = set.restart_exited() else {
        return;
    };
    if let Some(c) = corruption
        .as_mut()
        .filter(|c| !c.healed && restarted.contains(&c.pod))
    {
        eprintln!("chaos: pod {}'s etcd exited during its rebuild", c.pod);
        c.stops.push(now);
    }
}

/// Whether the agent set pod data aside as diverged (a rebuild: the member is another).
fn set_aside_as_diverged(volume: &std::path::Path) -> bool {
    std::fs::read_dir(volume.join("set-aside")).is_ok_and(|d| {
        d.filter_map(std::result::Result::ok)
            .any(|e| e.file_name().to_string_lossy().ends_with("-diverged"))
    })
}

/// Writes acknowledged before a value is corrupted: the value changed is one of the first
/// half, long in the database file.
const ACKED_BEFORE_CORRUPTION: u64 = 200;

enum Heal {
    /// A backup (the runner starts it itself): nothing to heal.
    Nothing,
    Partition(u32),
    Free(u32),
    Start(u32),
    StartSidecar(u32),
    Resume(u32),
    Publish(u32),
    StartAll(Vec<u32>),
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

/// Who writes while a schedule plays.
pub enum Writes<'a> {
    /// The etcd writer ([`Writer`]), through every pod's client URL.
    Etcd,
    /// Kubernetes' own API server on the pods ([`KubeWriter`]): objects, Leases renewed,
    /// Events with their leases, and a watcher; what it served is checked through it.
    Kube(&'a KubeApiServer),
}

/// The writer of a run.
enum Running {
    Etcd(Writer),
    Kube(Box<KubeWriter>),
}

impl Running {
    fn acked(&self) -> u64 {
        match self {
            Running::Etcd(w) => w.acked(),
            Running::Kube(w) => w.acked(),
        }
    }

    async fn wait_progress(&self, n: u64, timeout: Duration, what: &str) {
        match self {
            Running::Etcd(w) => w.wait_progress(n, timeout, what).await,
            Running::Kube(w) => w.wait_progress(n, timeout, what).await,
        }
    }

    /// The etcd writer, which the disasters and the corruption need (they hold it, or
    /// read its values from the database files).
    fn etcd(&self, what: &str) -> &Writer {
        match self {
            Running::Etcd(w) => w,
            Running::Kube(_) => panic!("chaos: {what} is played under the etcd writer alone"),
        }
    }

    /// Stops writing; the report, and for the API server what it serves, checked.
    async fn stop(self) -> (WriterReport, Option<KubeSeen>) {
        match self {
            Running::Etcd(w) => (w.stop().await, None),
            Running::Kube(w) => {
                let written = w.stop().await;
                let report = written.report().clone();
                (report, Some(written.check().await))
            }
        }
    }

    /// The etcd key of each write.
    fn key_of(&self) -> fn(u64) -> String {
        match self {
            Running::Etcd(_) => crate::writer::write_key,
            Running::Kube(_) => crate::kube_writer::write_key,
        }
    }
}

/// Plays `schedule` on `set` (formed, every pod a ready voter) under a writer through every
/// pod, heals, waits for recovery and checks.
pub async fn run(set: &mut Set, schedule: &Schedule) -> Outcome {
    run_writing(set, schedule, Writes::Etcd).await
}

/// [`run`], written by `writes`.
pub async fn run_writing(set: &mut Set, schedule: &Schedule, writes: Writes<'_>) -> Outcome {
    let pods: Vec<u32> = (0..schedule.pods).collect();
    let cluster_before = set.cluster_id(0).await.ok();
    let mut ids_before = Vec::new();
    for o in &pods {
        ids_before.push(set.member_id(*o).await.ok());
    }
    // The writer's times and the faults' count from the same start.
    let started = Instant::now();
    let writer = match writes {
        Writes::Etcd => Running::Etcd(Writer::start(
            pods.iter().map(|o| set.client_url(*o)).collect(),
        )),
        Writes::Kube(api) => Running::Kube(Box::new(
            KubeWriter::start(api).unwrap_or_else(|e| panic!("chaos: the API server writer: {e}")),
        )),
    };
    let mut pending: Vec<(Duration, Heal, usize)> = Vec::new();
    let mut played: Vec<Event> = Vec::new();
    let mut paused: Vec<(u32, u32)> = Vec::new();
    let mut lost_ids: Vec<u64> = Vec::new();
    let mut wiped: BTreeSet<u32> = BTreeSet::new();
    let mut corruption: Option<Corruption> = None;
    let mut applied = 0;
    let mut sentinels = Sentinels::new(schedule.seed);
    let mut wals = WalRecords::default();
    let store = crate::disaster::store_url(set);
    // A disaster schedule's pods carry the store in their options already.
    let backup_args: Vec<&str> = match schedule.disaster {
        Some(_) => vec!["backup"],
        None => vec!["backup", "--backup-url", &store],
    };
    let mut backups_running = Vec::new();
    let mut defrags = DefragCount::new(pods.len());
    let mut next_sample = Duration::ZERO;
    let mut next_value_check = Duration::ZERO;
    let mut events = schedule.events.iter().peekable();
    loop {
        for o in &pods {
            sentinels.plant(*o, set.data_dir(*o));
        }
        let now = started.elapsed();
        if schedule.defrag && now >= next_sample {
            defrags.sample(set).await;
            next_sample = now + Duration::from_secs(1);
        }
        // When the agent healed a corrupted value (about once a second: every key read
        // through every pod).
        if let Some(c) = corruption
            .as_mut()
            .filter(|c| !c.healed && now >= next_value_check)
        {
            c.heal_seen(set, &pods, &played, &pending, now).await;
            next_value_check = now + Duration::from_secs(1);
        }
        // Heal what is due, then apply what is due; restart exited containers (kubelet).
        pending.sort_by_key(|(t, _, _)| *t);
        while pending.first().is_some_and(|(t, _, _)| *t <= now) {
            let (_, heal, i) = pending.remove(0);
            apply_heal(set, heal, &mut paused);
            played[i].lasts = started.elapsed().saturating_sub(played[i].at);
        }
        if let Some(e) = events.peek() {
            if e.at <= now {
                // A volume is lost only once every copy is back: every pod a ready voter
                // (losing two copies before they re-replicate is real data loss). Until
                // then the timeline waits, healing what falls due.
                // So is a value corrupted (with writes long in the database files), and a
                // volume is lost only once a corrupted value is healed (a copy rebuilt from
                // a corrupt one is corrupt too).
                let loss = matches!(e.fault, Fault::LoseVolume(_));
                let corrupts = matches!(e.fault, Fault::CorruptValue(_));
                if let Some(c) = corruption.as_mut().filter(|_| loss) {
                    let now = started.elapsed();
                    c.heal_seen(set, &pods, &played, &pending, now).await;
                }
                let waits = (loss && corruption.as_ref().is_some_and(|c| !c.healed))
                    || (corrupts && writer.acked() < ACKED_BEFORE_CORRUPTION);
                if (loss || corrupts)
                    && now < e.at + RECOVERY_BOUND
                    && (waits || !set.all_linearizable(&pods, pods.len()).await)
                {
                    restart_exited(set, &mut corruption, started.elapsed());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let e = events.next().cloned().unwrap_or_else(|| unreachable!());
                if let Fault::Backup(o) = e.fault {
                    eprintln!("chaos: {}", e.fault);
                    let mut cmd = set.steward_in(o, &backup_args);
                    match cmd.kill_on_drop(true).spawn() {
                        Ok(child) => backups_running.push((o, child)),
                        Err(err) => eprintln!("chaos: starting a backup failed: {err}"),
                    }
                    continue;
                }
                for o in &pods {
                    wals.record(*o, set.data_dir(*o));
                }
                let o = e.fault.pod();
                if let Some(o) = o {
                    if matches!(e.fault, Fault::LoseVolume(_)) {
                        // Its member may not answer just now (its etcd paused a moment
                        // ago, no leader): the ID seen before the fault is the one lost.
                        let id = set.member_id(o).await.ok().or(ids_before[o as usize]);
                        lost_ids.extend(id);
                        wals.volume_lost(o);
                        // Lost whether or not its member answered just now.
                        wiped.insert(o);
                        sentinels.volume_lost(o);
                    }
                }
                if let Fault::CorruptValue(o) = e.fault {
                    let id = set.member_id(o).await.ok().or(ids_before[o as usize]);
                    corruption = Some(Corruption {
                        pod: o,
                        played: played.len(),
                        id,
                        write: None,
                        healed: false,
                        healed_after: None,
                        stops: Vec::new(),
                    });
                }
                let at = started.elapsed();
                let heal = match e.fault {
                    Fault::CorruptValue(o) => {
                        let i = corrupt(set, o, writer.etcd("a corrupted value").acked()).await;
                        if let Some(c) = corruption.as_mut() {
                            c.write = Some(i);
                        }
                        Heal::Start(o)
                    }
                    _ => apply_fault(set, &e.fault, &mut paused).await,
                };
                pending.push((started.elapsed() + e.lasts, heal, played.len()));
                played.push(Event { at, ..e });
                applied += 1;
                continue;
            }
        }
        if events.peek().is_none() && pending.is_empty() {
            break;
        }
        restart_exited(set, &mut corruption, started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Generator 3: the disaster, once every fault is healed.
    let struck_at = started.elapsed();
    let struck = match &schedule.disaster {
        Some(d) => {
            // The members the disaster loses, as they are before it (a pod whose volume a
            // fault lost is another member by now), for when they do not answer then.
            let mut ids = ids_before.clone();
            for o in &pods {
                wals.record(*o, set.data_dir(*o));
                if let Ok(id) = set.member_id(*o).await {
                    ids[*o as usize] = Some(id);
                }
            }
            let struck = crate::disaster::strike(set, d, writer.etcd("a disaster")).await;
            for o in d.wiped(schedule.pods) {
                wiped.insert(o);
                sentinels.volume_lost(o);
                wals.volume_lost(o);
                lost_ids.extend(ids[o as usize]);
            }
            lost_ids.extend(&struck.lost_ids);
            applied += 1;
            Some(struck)
        }
        None => None,
    };
    // Healed: every pod back as a ready voter within the bound (restarting what exits), and
    // a corrupted value healed by the agent.
    let deadline = Instant::now() + RECOVERY_BOUND;
    let mut recovered = false;
    while Instant::now() < deadline {
        restart_exited(set, &mut corruption, started.elapsed());
        for o in &pods {
            sentinels.plant(*o, set.data_dir(*o));
        }
        if let Some(c) = corruption.as_mut() {
            c.heal_seen(set, &pods, &played, &[], started.elapsed())
                .await;
        }
        if corruption.as_ref().is_none_or(|c| c.healed)
            && set.all_linearizable(&pods, pods.len()).await
            && set.all_ready(&pods).await
        {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if recovered {
        writer
            .wait_progress(10, RECOVERY_BOUND, "after healing")
            .await;
    }
    let key_of = writer.key_of();
    let (writes, kube) = writer.stop().await;
    if schedule.defrag {
        defrags.sample(set).await;
    }
    let mut backups = Vec::new();
    for (o, child) in backups_running {
        let out = tokio::time::timeout(BACKUP_TIME_OUT, child.wait_with_output()).await;
        backups.push(BackupTaken::from_output(
            o,
            false,
            out.ok().and_then(std::result::Result::ok),
        ));
    }
    let last = set.steward_in(0, &backup_args).kill_on_drop(true).output();
    let out = tokio::time::timeout(BACKUP_TIME_OUT, last).await;
    backups.push(BackupTaken::from_output(
        0,
        true,
        out.ok().and_then(std::result::Result::ok),
    ));
    let mut missing = Vec::new();
    let mut clusters = BTreeSet::new();
    // A restore gives the cluster a new identity: one cluster ID afterwards.
    if !schedule.disaster.as_ref().is_some_and(Disaster::restores) {
        clusters.extend(cluster_before);
    }
    let mut reused_ids = Vec::new();
    let mut replaced = Vec::new();
    // A member rebuilt from its peers is another: its old ID must never come back.
    let rebuilt = corruption
        .as_ref()
        .filter(|c| set_aside_as_diverged(set.data_dir(c.pod)));
    lost_ids.extend(rebuilt.and_then(|c| c.id));
    let mut unwritten = Vec::new();
    let mut values_unread = Vec::new();
    for o in &pods {
        match unwritten_values(set, *o).await {
            Some(u) => unwritten.extend(u.into_iter().map(|(k, v)| (*o, k, v))),
            None => values_unread.push(*o),
        }
    }
    for o in &pods {
        missing.push(missing_writes(set, *o, writes.acked, key_of).await);
        if let Ok(c) = set.cluster_id(*o).await {
            clusters.insert(c);
        }
        match set.member_id(*o).await {
            Ok(id) if lost_ids.contains(&id) => reused_ids.push(id),
            Ok(id)
                if !wiped.contains(o)
                    && rebuilt.is_none_or(|c| c.pod != *o)
                    && ids_before[*o as usize].is_some_and(|b| b != id) =>
            {
                replaced.push(*o)
            }
            _ => {}
        }
    }
    let mut disaster_window = None;
    let disaster = match struck {
        Some(mut struck) => {
            backups.extend(struck.backup.take());
            let held = struck.held;
            let seen = crate::disaster::observe(set, struck, &writes).await;
            // Writes lost with the volumes, or never lost, said per pod.
            missing = seen.missing(&writes);
            // From the kill until every pod is back, writes are refused: the recovery
            // bound is what the disaster explains, and the time the pods had the wrong
            // key on purpose.
            disaster_window = Some((struck_at, struck_at + RECOVERY_BOUND + held));
            Some(seen)
        }
        None => None,
    };
    let deleted = sentinels.missing(|o| set.data_dir(o).to_path_buf());
    let wal_missing = wals.missing(|o| set.data_dir(o).to_path_buf());
    let mut enospc_lines = 0;
    for o in &pods {
        let logs = set.logs(*o);
        let full: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("no space left on device"))
            .collect();
        if let Some(first) = full.first() {
            eprintln!("chaos: pod {o} felt a full disk: {first}");
        }
        enospc_lines += full.len();
    }
    Outcome {
        seed: schedule.seed,
        faults: applied,
        writes,
        missing,
        clusters,
        reused_ids,
        replaced,
        corrupted: corruption.as_ref().map(|c| (c.pod, c.write)),
        rebuilt: rebuilt.map(|c| c.pod),
        healed_after: corruption.as_ref().and_then(|c| c.healed_after),
        rebuild_stops: corruption
            .as_ref()
            .map(|c| c.stops.clone())
            .unwrap_or_default(),
        unwritten,
        values_unread,
        recovered,
        sentinels: sentinels.count(),
        deleted,
        wal_records: wals.count(),
        wal_missing,
        enospc_lines,
        backups,
        defrags: defrags.total(),
        played,
        slack: Duration::ZERO,
        disaster_window,
        disaster,
        kube,
    }
}

/// A fault or heal the schedule lays must be made: one that cannot be (no iptables, no
/// tmpfs, a volume that cannot be emptied) stops the run rather than count as survived.
fn made<T>(r: crate::Result<T>, what: impl fmt::Display) -> T {
    r.unwrap_or_else(|e| panic!("chaos: {what}: could not be made: {e}"))
}

/// Pod `o` killed and the value of one of the writes `0..acked` changed in its database
/// file; which write.
async fn corrupt(set: &mut Set, o: u32, acked: u64) -> u64 {
    let fault = Fault::CorruptValue(o);
    eprintln!("chaos: {fault}");
    let _ = set.kill(o).await;
    let changed = corrupt_value(set.data_dir(o), acked)
        .map_err(crate::Error::io(format!("pod {o}'s database file")));
    let Some(changed) = made(changed, &fault) else {
        panic!(
            "chaos: {fault}: none of the first {} writes' values is in pod {o}'s database file",
            acked / 2
        );
    };
    eprintln!(
        "chaos: pod {o}'s value of {} changed on disk ({} copies in its database file)",
        crate::writer::write_key(changed.i),
        changed.copies
    );
    changed.i
}

async fn apply_fault(set: &mut Set, fault: &Fault, paused: &mut Vec<(u32, u32)>) -> Heal {
    eprintln!("chaos: {fault}");
    match fault {
        Fault::KillPod(o) => {
            let _ = set.kill(*o).await;
            Heal::Start(*o)
        }
        Fault::KillSidecar(o) => {
            set.kill_sidecar(*o).await;
            Heal::StartSidecar(*o)
        }
        Fault::Pause(o) => {
            if let Some(pid) = set.etcd_pid(*o) {
                signal(pid, "-STOP");
                paused.push((*o, pid));
            }
            Heal::Resume(*o)
        }
        Fault::WithdrawDns(o) => {
            let _ = set.set_dns(*o, false);
            Heal::Publish(*o)
        }
        Fault::LoseVolume(o) => {
            let _ = set.kill(*o).await;
            made(set.wipe(*o), fault);
            Heal::Start(*o)
        }
        Fault::Backup(_) => Heal::Nothing,
        Fault::CorruptValue(_) => {
            unreachable!("{fault}: made by `corrupt`, with the writer's count")
        }
        Fault::Partition(o) => {
            made(set.partition(*o, true), fault);
            Heal::Partition(*o)
        }
        Fault::FillDisk(o) => {
            let n = made(set.fill_volume(*o), fault);
            eprintln!("chaos: pod {o}'s volume full ({} MiB of filler)", n >> 20);
            Heal::Free(*o)
        }
        Fault::RestartAll(order) => {
            for o in order {
                let _ = set.kill(*o).await;
            }
            Heal::StartAll(order.clone())
        }
    }
}

fn apply_heal(set: &mut Set, heal: Heal, paused: &mut Vec<(u32, u32)>) {
    match heal {
        Heal::Nothing => {}
        Heal::Partition(o) => {
            made(set.partition(o, false), format!("healing pod {o}'s cut"));
        }
        Heal::Free(o) => {
            made(set.free_volume(o), format!("freeing pod {o}'s volume"));
        }
        Heal::Start(o) => {
            let _ = set.start(o);
        }
        Heal::StartSidecar(o) => {
            if set.sidecar_pid(o).is_none() {
                let _ = set.start_sidecar(o);
            }
        }
        Heal::Resume(o) => {
            for (_, pid) in paused.iter().filter(|(p, _)| *p == o) {
                signal(*pid, "-CONT");
            }
            paused.retain(|(p, _)| *p != o);
        }
        Heal::Publish(o) => {
            let _ = set.set_dns(o, true);
        }
        Heal::StartAll(order) => {
            for o in order {
                let _ = set.start(o);
            }
        }
    }
}

/// Acknowledged writes `0..acked` (the `i`-th under etcd key `key(i)`) missing from a
/// linearizable read through pod `o`.
async fn missing_writes(set: &Set, o: u32, acked: u64, key: fn(u64) -> String) -> Option<u64> {
    let mut c = set.client(o).await.ok()?;
    let opts = GetOptions::new().with_range(key(acked)).with_count_only();
    let r = c.get(key(0), Some(opts)).await.ok()?;
    Some(acked.saturating_sub(r.count().max(0) as u64))
}
