//! Figure 11 (issue 11): a majority of volumes lost → three ready voters again, from the
//! surviving volume. One three-pod set is loaded once; each run wipes two of its three
//! volumes (the survivor rotates with the run, so no survivor holds a recovery marker of
//! an earlier run) and brings the cluster back, the agent and the baseline alternating
//! which goes first, the set switched between agent and plain etcd on the same data.
//!
//! Agent: the two pods are killed, their volumes wiped and the pods started again (their
//! init waits); t0 when `etcd-steward recover --yes` is spawned with a wiped pod's options,
//! while the bench restarts an exited etcd container every 20 ms (kubelet); done when every
//! pod's `/ready` answers 200 and each serves a linearizable read as one of three voters.
//!
//! Baseline, the manual runbook as fast as a script can go: SIGKILL the survivor's etcd,
//! start it again with `--force-new-cluster`; once it serves, for each wiped member in turn:
//! MemberAdd as a learner (retried every 5 ms while etcd refuses), start it with
//! `--initial-cluster-state=existing`, MemberPromote retried every 5 ms until etcd accepts.
//! etcd 3.5 allows one learner at a time, and refuses a member change until the leader has
//! been connected to every voter for 5 s, so the joins are sequential for both.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use etcd_client::MemberAddOptions;
use harness::{Kind, PlainStart, Set};
use serde::Serialize;
use tokio::time::Instant;

use crate::env::{connect, Env};
use crate::load;
use crate::replacement::size_label;
use crate::stats::{median, Figure, Target};

const TIMEOUT: Duration = Duration::from_secs(600);
const PODS: [u32; 3] = [0, 1, 2];

/// The moments of one recovery, in seconds from t0.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Run {
    pub kind: String,
    pub run: usize,
    pub survivor: u32,
    /// The survivor's etcd exited (agent: the sidecar's SIGTERM; baseline: SIGKILLed at t0).
    pub stopped: Option<f64>,
    /// The survivor, alone after `--force-new-cluster`, serves a linearizable read.
    pub survivor_serving: Option<f64>,
    /// The first joiner's entry is listed (as a learner).
    pub first_added: Option<f64>,
    /// Two voters.
    pub first_promoted: Option<f64>,
    pub second_added: Option<f64>,
    /// Three voters.
    pub second_promoted: Option<f64>,
    /// Every pod serves a linearizable read as one of three voters.
    pub etcd_done: f64,
    /// Agent: additionally every `/ready` answers 200 (the figure); baseline: = etcd_done.
    pub done: f64,
    /// Agent: `recover --yes` exited.
    pub command_exited: Option<f64>,
}

pub async fn run(env: &Env, bytes: u64, runs: usize, done: &mut Vec<Run>) -> Result<Vec<Figure>> {
    let label = size_label(bytes);
    let mut set = env.set(Kind::Agent, 3).await?;
    set.start_all(Duration::from_secs(90)).await?;
    let t = Instant::now();
    let keys = load::fill(&set, bytes).await?;
    eprintln!(
        "bench: loaded {keys} keys ({label}) in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    for r in 0..runs {
        let order = if r % 2 == 0 {
            [Kind::Agent, Kind::Plain]
        } else {
            [Kind::Plain, Kind::Agent]
        };
        let survivor = (r % 3) as u32;
        for kind in order {
            if set.kind != kind {
                match kind {
                    Kind::Agent => set.become_agent().await?,
                    Kind::Plain => set.become_plain().await?,
                }
                set.wait_up(Duration::from_secs(300)).await?;
            }
            let mut ev = match kind {
                Kind::Agent => agent(env, &mut set, survivor).await,
                Kind::Plain => plain(&mut set, survivor).await,
            }
            .with_context(|| {
                format!("{kind:?} run {} (logs in {})", r + 1, set.root().display())
            })?;
            verify(&set, keys).await?;
            ev.run = r + 1;
            ev.survivor = survivor;
            eprintln!(
                "bench: recover {label} run {} {}: done {:.2}s (etcd-level {:.2}s; survivor serving {:.2}s, promoted {:.2}s / {:.2}s)",
                r + 1,
                ev.kind,
                ev.done,
                ev.etcd_done,
                ev.survivor_serving.unwrap_or(f64::NAN),
                ev.first_promoted.unwrap_or(f64::NAN),
                ev.second_promoted.unwrap_or(f64::NAN),
            );
            done.push(ev);
        }
    }
    set.shutdown().await;
    Ok(figures(&label, keys, done))
}

fn figures(label: &str, keys: u64, runs: &[Run]) -> Vec<Figure> {
    let agent: Vec<&Run> = runs.iter().filter(|r| r.kind == "agent").collect();
    let plain: Vec<&Run> = runs.iter().filter(|r| r.kind == "plain").collect();
    let by_hand = "by hand: SIGKILL, `--force-new-cluster`, each wiped member added as a learner, started, promoted, one after the other, every step retried every 5 ms";
    let mut fig = Figure::new(
        format!(
            "11. Recovery, {label} of keys, 2 of 3 volumes lost: `recover --yes` → 3 ready voters"
        ),
        "s",
        Target::RatioAtMost(1.2),
    )
    .with_baseline(by_hand);
    let mut etcd = Figure::new(
        format!("11a. Recovery, {label}, etcd-level: every member answers a linearizable read as one of 3 voters"),
        "s",
        Target::None,
    )
    .with_baseline("by hand");
    for (a, p) in agent.iter().zip(&plain) {
        fig.agent.push(a.done);
        fig.baseline.push(p.done);
        etcd.agent.push(a.etcd_done);
        etcd.baseline.push(p.etcd_done);
    }
    let med = |rs: &[&Run], f: &dyn Fn(&Run) -> Option<f64>| {
        let xs: Vec<f64> = rs.iter().filter_map(|r| f(r)).collect();
        median(&xs).map_or("—".to_string(), |m| format!("{m:.2}"))
    };
    let moments = |rs: &[&Run]| {
        format!(
            "survivor's etcd stopped {}, serves alone {}, 1st joiner listed {}, promoted {}, 2nd listed {}, promoted {}",
            med(rs, &|r| r.stopped),
            med(rs, &|r| r.survivor_serving),
            med(rs, &|r| r.first_added),
            med(rs, &|r| r.first_promoted),
            med(rs, &|r| r.second_added),
            med(rs, &|r| r.second_promoted),
        )
    };
    fig.note = format!(
        "paired runs, alternating which goes first; one set loaded once, switched between agent and plain etcd on the same data; median s from t0: agent: {}, `recover --yes` exited {}; by hand: {}; every pod holds all {keys} keys after",
        moments(&agent),
        med(&agent, &|r| r.command_exited),
        moments(&plain),
    );
    vec![fig, etcd]
}

/// Settled, then pods `lost` killed and wiped; their names withdrawn.
async fn lose(set: &mut Set, survivor: u32) -> Result<Vec<u32>> {
    set.wait_up(Duration::from_secs(120)).await?;
    // Followers learn the commit index with the next heartbeat and persist it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lost: Vec<u32> = PODS.iter().copied().filter(|o| *o != survivor).collect();
    for &o in &lost {
        set.kill(o).await?;
        set.wipe(o)?;
    }
    Ok(lost)
}

async fn agent(env: &Env, set: &mut Set, survivor: u32) -> Result<Run> {
    let lost = lose(set, survivor).await?;
    for &o in &lost {
        set.start(o)?;
    }
    // Their sidecars answer and their init waits; the survivor has lost its leader.
    let t = Instant::now();
    for &o in &lost {
        while set.http(o, "/healthz").await.is_none() {
            if t.elapsed() > Duration::from_secs(30) {
                bail!("pod {o}'s sidecar does not answer");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let runner = lost[0];
    let t0 = Instant::now();
    let child = tokio::process::Command::new(&env.steward)
        .arg("recover")
        .arg("--yes")
        .arg("--timeout=10m")
        .args(set.common_args(runner))
        .env_remove("HOSTNAME")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("spawning etcd-steward recover")?;
    let command = tokio::spawn(child.wait_with_output());
    let mut ev = Run {
        kind: "agent".into(),
        ..Run::default()
    };
    let mut exited = false;
    let (mut etcd_done, mut done) = (None, None);
    let mut command = Some(command);
    while !exited || done.is_none() {
        let restarted = set.restart_exited()?;
        if ev.stopped.is_none() && restarted.contains(&survivor) {
            ev.stopped = Some(t0.elapsed().as_secs_f64());
        }
        if let Some(c) = command.take_if(|c| c.is_finished()) {
            ev.command_exited = Some(t0.elapsed().as_secs_f64());
            exited = true;
            let out = c.await??;
            if !out.status.success() {
                bail!(
                    "recover --yes failed: {}{}",
                    String::from_utf8_lossy(&out.stderr),
                    set.dump()
                );
            }
        }
        step(set, survivor, t0, &mut ev, &mut etcd_done, &mut done).await;
        if t0.elapsed() > TIMEOUT {
            bail!("not recovered after {TIMEOUT:?}{}", set.dump());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ev.etcd_done = etcd_done.unwrap_or_default();
    ev.done = done.unwrap_or_default();
    set.changed();
    Ok(ev)
}

/// One look at the agent's recovery: the survivor, the member list, the pods.
async fn step(
    set: &Set,
    survivor: u32,
    t0: Instant,
    ev: &mut Run,
    etcd_done: &mut Option<f64>,
    done: &mut Option<f64>,
) {
    if done.is_some() {
        return;
    }
    let now = || Some(t0.elapsed().as_secs_f64());
    if ev.survivor_serving.is_none() {
        if set.linearizable_ok(survivor).await {
            ev.survivor_serving = now();
        } else {
            return;
        }
    }
    if ev.second_promoted.is_none() {
        if let Ok(ms) = set.members(survivor).await {
            let voters = ms.iter().filter(|m| !m.is_learner()).count();
            if ms.len() >= 2 && ev.first_added.is_none() {
                ev.first_added = now();
            }
            if voters >= 2 && ev.first_promoted.is_none() {
                ev.first_promoted = now();
            }
            if ms.len() >= 3 && ev.second_added.is_none() {
                ev.second_added = now();
            }
            if voters >= 3 {
                ev.second_promoted = now();
            }
        }
        if ev.second_promoted.is_none() {
            return;
        }
    }
    if etcd_done.is_none() && set.all_linearizable(&PODS, 3).await {
        *etcd_done = now();
    }
    if etcd_done.is_some() && set.all_ready(&PODS).await {
        *done = now();
    }
}

async fn plain(set: &mut Set, survivor: u32) -> Result<Run> {
    let lost = lose(set, survivor).await?;
    // The pods exist again (empty), their names resolve; nothing runs in them yet.
    set.publish(&lost).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t0 = Instant::now();
    let at = || Some(t0.elapsed().as_secs_f64());
    let mut ev = Run {
        kind: "plain".into(),
        ..Run::default()
    };
    // 1. stop the survivor, start it again alone
    set.kill_etcd(survivor).await;
    ev.stopped = at();
    set.start_plain_with(survivor, &PlainStart::New, &["--force-new-cluster"])?;
    while !set.linearizable_ok(survivor).await {
        tight(t0).await?;
    }
    ev.survivor_serving = at();
    let mut lc = loop {
        match connect(&set.client_url(survivor)).await {
            Ok(c) => break c,
            Err(_) => tight(t0).await?,
        }
    };
    // 2. each wiped member: add a learner, start it, promote it
    for (i, &o) in lost.iter().enumerate() {
        let peer_url = set.peer_url(o);
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
        if i == 0 {
            ev.first_added = at();
        } else {
            ev.second_added = at();
        }
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
        while lc.member_promote(id).await.is_err() {
            tight(t0).await?;
        }
        if i == 0 {
            ev.first_promoted = at();
        } else {
            ev.second_promoted = at();
        }
    }
    // 3. three voters serving
    while !set.all_linearizable(&PODS, 3).await {
        tight(t0).await?;
    }
    ev.etcd_done = t0.elapsed().as_secs_f64();
    ev.done = ev.etcd_done;
    set.changed();
    Ok(ev)
}

async fn tight(t0: Instant) -> Result<()> {
    if t0.elapsed() > TIMEOUT {
        bail!("baseline recovery not done after {TIMEOUT:?}");
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

/// Every pod holds every key.
async fn verify(set: &Set, keys: u64) -> Result<()> {
    for o in PODS {
        let n = set.count_keys_on(o, load::PREFIX).await?;
        if n != keys as i64 {
            bail!("pod {o} holds {n} keys after the recovery, expected {keys}");
        }
    }
    Ok(())
}
