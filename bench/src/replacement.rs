//! Figure 2: a member's volume is wiped → a promoted voter holding all the data.
//! Agent: the pod starts again (sidecar + init); init removes the stale entry, adds a
//! learner, starts etcd, and the sidecar promotes it. Baseline: the same steps by hand in
//! the tightest loop (remove, add learner, start etcd, promote every 5 ms until etcd
//! accepts). Both clusters hold the same data and are measured in the same run.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Result};
use etcd_client::{Client, MemberAddOptions};
use harness::client::http_get;
use harness::{Kind, PlainStart, Set};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::env::{connect, Env};
use crate::load::{self, log_time, secs_since};
use crate::stats::{Figure, Target};

const TIMEOUT: Duration = Duration::from_secs(600);
const SAMPLE_EVERY: Duration = Duration::from_millis(25);
const SETTLE: Duration = Duration::from_millis(5500);

/// One sample of the replacement as seen from outside. The leader's raft progress comes
/// from its `/debug/vars` (`raft.status`): `match` is the highest log index a member is
/// known to have persisted, the figure etcd itself judges a promotion by.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds from t0, when the leader's answers arrived.
    pub t: f64,
    /// The leader's own last log index (its `match` in its progress table).
    pub leader_match: Option<u64>,
    /// The new member's `match` as the leader sees it.
    pub learner_match: Option<u64>,
    /// The new member's own applied index, once its client API answers.
    pub learner_applied: Option<u64>,
    /// The entry for the replaced pod's peer URL, as the leader lists it: (id, is learner).
    pub entry: Option<(u64, bool)>,
    pub old_listed: bool,
}

/// The moments of one replacement, in seconds from the pod's start (t0).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Events {
    pub removed: Option<f64>,
    pub added: Option<f64>,
    /// etcd was exec'd (agent: init's log) or spawned (baseline).
    pub started: Option<f64>,
    /// The learner's `match` first reached 90% of the leader's: etcd's own rule
    /// (`isLearnerReady`), so from here on MemberPromote is accepted.
    pub caught_up: Option<f64>,
    /// The new member's client API first answered (it has applied what it received).
    pub serving: Option<f64>,
    pub promoted: Option<f64>,
    /// A voter that answers a linearizable read: promoted, with all the data.
    pub done: f64,
    /// The agent's `/ready` answered 200.
    pub ready: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    pub kind: String,
    pub size: String,
    pub bytes: u64,
    pub samples: Vec<Sample>,
    pub events: Events,
}

pub fn size_label(bytes: u64) -> String {
    if bytes == 0 {
        "0 B".into()
    } else if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// Runs the replacement figures for one data size; returns them and every run's trace.
pub async fn run(env: &Env, bytes: u64, runs: usize) -> Result<(Vec<Figure>, Vec<Trace>)> {
    let label = size_label(bytes);
    let mut done = Figure::new(
        format!("2. Replacement, {label} of keys: wiped volume → promoted voter with all data"),
        "s",
        Target::RatioAtMost(1.1),
    )
    .with_baseline("by hand, tightest loop");
    let mut ready = Figure::new(
        format!("2a. Replacement, {label}: → the pod's `/ready` (what Kubernetes sees)"),
        "s",
        Target::None,
    )
    .with_baseline("by hand (voter with data)");
    let mut lag = Figure::new(
        format!("2b. Replacement, {label}: promotion after etcd would accept it"),
        "s",
        Target::AtMost(1.0),
    )
    .with_baseline("by hand");
    let mut traces = Vec::new();

    // Sets of 1 GiB are measured one after the other (each etcd holds its raft log in
    // memory); smaller ones side by side, interleaving agent and baseline runs.
    let big = bytes >= 512 << 20;
    let keys = bytes / load::VALUE_BYTES as u64;
    let mut agent_runs = Vec::new();
    let mut plain_runs = Vec::new();
    if big {
        // One load serves both: the agent's runs first, then the same pods restarted as
        // plain etcd on the same data for the baseline's runs.
        let mut set = up(env, Kind::Agent, bytes).await?;
        for run in 0..runs {
            agent_runs.push(agent_run(&mut set, keys, &label, run, &mut traces).await?);
        }
        set.become_plain().await?;
        set.wait_up(Duration::from_secs(300)).await?;
        set.changed();
        for run in 0..runs {
            plain_runs.push(plain_run(&mut set, keys, &label, run, &mut traces).await?);
        }
        set.shutdown().await;
    } else {
        let mut a = up(env, Kind::Agent, bytes).await?;
        let mut p = up(env, Kind::Plain, bytes).await?;
        for run in 0..runs {
            agent_runs.push(agent_run(&mut a, keys, &label, run, &mut traces).await?);
            plain_runs.push(plain_run(&mut p, keys, &label, run, &mut traces).await?);
        }
        a.shutdown().await;
        p.shutdown().await;
    }
    for (a, p) in agent_runs.iter().zip(&plain_runs) {
        done.agent.push(a.done);
        done.baseline.push(p.done);
        ready.agent.push(a.ready.unwrap_or(f64::NAN));
        ready.baseline.push(p.done);
        lag.agent.push(lag_of(a));
        lag.baseline.push(lag_of(p));
    }
    if big {
        done.note = "one set loaded once: the agent's runs, then the same pods restarted as plain etcd for the baseline's".into();
    }
    lag.note = "from the first sample (every 25 ms) in which the leader's raft progress (`/debug/vars`) shows the learner's match ≥ 90% of its own, etcd's rule for accepting MemberPromote, to the promotion; ≤ 0: the promotion got in before the sample".into();
    Ok((vec![done, ready, lag], traces))
}

async fn agent_run(
    set: &mut Set,
    keys: u64,
    label: &str,
    run: usize,
    traces: &mut Vec<Trace>,
) -> Result<Events> {
    let (ev, samples) = agent(set, keys).await?;
    eprintln!(
        "bench: replacement {label} run {}: agent done {:.3}s ready {:.3}s promotion lag {:.3}s",
        run + 1,
        ev.done,
        ev.ready.unwrap_or(f64::NAN),
        lag_of(&ev)
    );
    traces.push(trace("agent", label, keys, samples, &ev));
    Ok(ev)
}

async fn plain_run(
    set: &mut Set,
    keys: u64,
    label: &str,
    run: usize,
    traces: &mut Vec<Trace>,
) -> Result<Events> {
    let (ev, samples) = plain(set, keys).await?;
    eprintln!(
        "bench: replacement {label} run {}: plain done {:.3}s promotion lag {:.3}s",
        run + 1,
        ev.done,
        lag_of(&ev)
    );
    traces.push(trace("plain", label, keys, samples, &ev));
    Ok(ev)
}

fn trace(kind: &str, label: &str, keys: u64, samples: Vec<Sample>, ev: &Events) -> Trace {
    Trace {
        kind: kind.into(),
        size: label.to_string(),
        bytes: keys * load::VALUE_BYTES as u64,
        samples,
        events: ev.clone(),
    }
}

fn lag_of(ev: &Events) -> f64 {
    match (ev.promoted, ev.caught_up) {
        (Some(p), Some(c)) => p - c,
        _ => f64::NAN,
    }
}

async fn up(env: &Env, kind: Kind, bytes: u64) -> Result<Set> {
    let mut set = env.set(kind, 3).await?;
    set.start_all(Duration::from_secs(90)).await?;
    set.changed();
    let t = Instant::now();
    let keys = load::fill(&set, bytes).await?;
    if bytes > 0 {
        eprintln!(
            "bench: loaded {keys} keys ({}) into the {kind:?} set in {:.1}s",
            size_label(bytes),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(set)
}

/// Kills a follower, wipes its volume, withdraws its name and waits until the two others
/// are healthy; then publishes the name again. Returns (pod, its old member ID, leader).
async fn prepare(set: &mut Set) -> Result<(u32, u64, u32)> {
    set.wait_up(Duration::from_secs(60)).await?;
    // etcd refuses a member change ("unhealthy cluster") unless the member asked has been
    // connected to every voter for 5 s (etcdserver HealthInterval): a real replacement
    // meets a settled cluster, so both kinds start at least 5.5 s after the last change.
    set.settle(SETTLE).await;
    let leader = set.leader().await?;
    let o = (0..set.replicas)
        .rev()
        .find(|o| *o != leader)
        .ok_or_else(|| anyhow!("no follower"))?;
    let old = set.member_id(o).await?;
    set.kill_processes(o).await;
    set.withdraw(&[o]).await?;
    set.wipe(o)?;
    let others: Vec<u32> = (0..set.replicas).filter(|p| *p != o).collect();
    for p in &others {
        let mut ok = false;
        for _ in 0..500 {
            if set.linearizable_ok(*p).await {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !ok {
            bail!("pod {p} unhealthy after pod {o} was killed");
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    set.publish(&[o]).await?;
    Ok((o, old, leader))
}

struct Sampler {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(set: &Set, leader: u32, o: u32, old: u64, t0: Instant) -> Sampler {
        let (stop, mut rx) = watch::channel(false);
        let leader_url = set.client_url(leader);
        let leader_addr = SocketAddr::new(IpAddr::V4(set.pod(leader).ip), 2379);
        let learner_url = set.client_url(o);
        let peer_url = set.peer_url(o);
        let task = tokio::spawn(async move {
            let mut out = Vec::new();
            let mut lc: Option<Client> = None;
            let mut nc: Option<Client> = None;
            loop {
                // One last sample after the stop, so the final state is in the trace.
                let last = *rx.borrow();
                let mut s = Sample {
                    t: 0.0,
                    leader_match: None,
                    learner_match: None,
                    learner_applied: None,
                    entry: None,
                    old_listed: true,
                };
                if lc.is_none() {
                    lc = connect(&leader_url).await.ok();
                }
                if let Some(c) = lc.as_mut() {
                    match c.member_list().await {
                        Ok(ms) => {
                            s.old_listed = ms.members().iter().any(|m| m.id() == old);
                            s.entry = ms
                                .members()
                                .iter()
                                .find(|m| m.id() != old && m.peer_urls().contains(&peer_url))
                                .map(|m| (m.id(), m.is_learner()));
                        }
                        Err(_) => lc = None,
                    }
                }
                if let Some(progress) = raft_progress(leader_addr).await {
                    s.leader_match = progress.leader;
                    if let Some((id, _)) = s.entry {
                        s.learner_match = progress.matches.get(&id).copied();
                    }
                }
                s.t = t0.elapsed().as_secs_f64();
                if nc.is_none() {
                    nc = connect(&learner_url).await.ok();
                }
                if let Some(c) = nc.as_mut() {
                    // Until it serves clients the call hangs: give up at once.
                    match tokio::time::timeout(Duration::from_millis(100), c.status()).await {
                        Ok(Ok(st)) => s.learner_applied = Some(st.raft_applied_index()),
                        Ok(Err(_)) => nc = None,
                        Err(_) => {}
                    }
                }
                out.push(s);
                if last {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                    _ = rx.changed() => {}
                }
            }
            out
        });
        Sampler { stop, task }
    }

    async fn finish(self) -> Vec<Sample> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// The leader's raft progress table from its `/debug/vars`.
struct Progress {
    leader: Option<u64>,
    matches: HashMap<u64, u64>,
}

async fn raft_progress(addr: SocketAddr) -> Option<Progress> {
    let (status, body) = http_get(addr, "/debug/vars", Duration::from_millis(500), 4 << 20).await?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let raft = &v["raft.status"];
    let id = |s: &str| u64::from_str_radix(s, 16).ok();
    let matches: HashMap<u64, u64> = raft["progress"]
        .as_object()?
        .iter()
        .filter_map(|(k, p)| Some((id(k)?, p["match"].as_u64()?)))
        .collect();
    let leader = raft["id"]
        .as_str()
        .and_then(id)
        .and_then(|me| matches.get(&me).copied());
    Some(Progress { leader, matches })
}

fn events(samples: &[Sample], done: f64) -> Events {
    let first = |f: &dyn Fn(&Sample) -> bool| samples.iter().find(|s| f(s)).map(|s| s.t);
    Events {
        removed: first(&|s| !s.old_listed),
        added: first(&|s| s.entry.is_some()),
        caught_up: first(&|s| match (s.learner_match, s.leader_match) {
            (Some(n), Some(l)) => l > 0 && n * 10 >= l * 9,
            _ => false,
        }),
        serving: first(&|s| s.learner_applied.is_some()),
        promoted: first(&|s| matches!(s.entry, Some((_, false)))),
        done,
        ..Events::default()
    }
}

async fn agent(set: &mut Set, keys: u64) -> Result<(Events, Vec<Sample>)> {
    let (o, old, leader) = prepare(set).await?;
    let t0 = Instant::now();
    let t0_wall = SystemTime::now();
    let sampler = Sampler::start(set, leader, o, old, t0);
    set.start(o)?;
    let (mut done, mut ready) = (None, None);
    while done.is_none() || ready.is_none() {
        if done.is_none() && set.linearizable_ok(o).await {
            done = Some(t0.elapsed().as_secs_f64());
        }
        if ready.is_none() && set.ready(o).await {
            ready = Some(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > TIMEOUT {
            bail!(
                "agent replacement not done after {TIMEOUT:?}; logs in {}",
                set.root().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let samples = sampler.finish().await;
    let done = done.unwrap_or_default();
    let mut ev = events(&samples, done);
    ev.ready = ready;
    let init = set.read_logs(o, "init");
    let sidecar = set.read_logs(o, "sidecar");
    let at = |t: Option<SystemTime>| t.map(|t| secs_since(t0_wall, t));
    // The logs have the agent's own moments exactly; the samples only within 25 ms.
    ev.started = at(log_time(&init, "exec etcd"));
    ev.added = at(log_time(&init, "added as a learner")).or(ev.added);
    ev.removed = at(log_time(&init, "stale member entry removed")).or(ev.removed);
    ev.promoted = at(log_time(&sidecar, "learner promoted")).or(ev.promoted);
    verify(set, o, keys).await?;
    set.changed();
    Ok((ev, samples))
}

async fn plain(set: &mut Set, keys: u64) -> Result<(Events, Vec<Sample>)> {
    let (o, old, leader) = prepare(set).await?;
    let mut lc = connect(&set.client_url(leader)).await?;
    let peer_url = set.peer_url(o);
    let t0 = Instant::now();
    let sampler = Sampler::start(set, leader, o, old, t0);
    // 1. remove the stale entry
    loop {
        match lc.member_remove(old).await {
            Ok(_) => break,
            Err(e) if e.to_string().contains("member not found") => break,
            Err(_) => tight(t0).await?,
        }
    }
    let removed = t0.elapsed().as_secs_f64();
    // 2. add the learner
    let id = loop {
        match lc
            .member_add(
                [peer_url.as_str()],
                Some(MemberAddOptions::new().with_is_learner()),
            )
            .await
        {
            Ok(r) => break r.member().map(|m| m.id()).unwrap_or_default(),
            Err(_) => tight(t0).await?,
        }
    };
    let added = t0.elapsed().as_secs_f64();
    // 3. start it with the member list as the cluster now has it
    let members = lc.member_list().await?;
    let cluster: Vec<String> = members
        .members()
        .iter()
        .flat_map(|m| {
            let name = match set.ordinal_of(m) {
                Some(p) => set.member_name(p),
                None => m.name().to_string(),
            };
            m.peer_urls()
                .iter()
                .map(move |u| format!("{name}={u}"))
                .collect::<Vec<_>>()
        })
        .collect();
    set.start_plain(o, &PlainStart::Existing(cluster.join(",")))?;
    let started = t0.elapsed().as_secs_f64();
    // 4. promote as soon as etcd accepts
    while lc.member_promote(id).await.is_err() {
        tight(t0).await?;
    }
    let promoted = t0.elapsed().as_secs_f64();
    // 5. a voter with all the data
    let mut done = None;
    while done.is_none() {
        if set.linearizable_ok(o).await {
            done = Some(t0.elapsed().as_secs_f64());
        } else {
            tight(t0).await?;
        }
    }
    let samples = sampler.finish().await;
    let mut ev = events(&samples, done.unwrap_or_default());
    ev.removed = Some(removed);
    ev.added = Some(added);
    ev.started = Some(started);
    ev.promoted = Some(promoted);
    verify(set, o, keys).await?;
    set.changed();
    Ok((ev, samples))
}

async fn tight(t0: Instant) -> Result<()> {
    if t0.elapsed() > TIMEOUT {
        bail!("baseline replacement not done after {TIMEOUT:?}");
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

/// The new member holds every key.
async fn verify(set: &mut Set, o: u32, keys: u64) -> Result<()> {
    let n = set.count_keys_on(o, load::PREFIX).await?;
    if n != keys as i64 {
        bail!("replaced pod {o} holds {n} keys, expected {keys}");
    }
    Ok(())
}
