//! Figure 3: every pod killed → all ready again. Baseline: plain etcd restarted on the
//! same data with its static command line.

use std::time::Duration;

use anyhow::{bail, Result};
use harness::{Kind, Set};
use tokio::time::Instant;

use crate::env::Env;
use crate::load;
use crate::stats::{Figure, Target};

const TIMEOUT: Duration = Duration::from_secs(120);
const PODS: [u32; 3] = [0, 1, 2];

pub async fn run(env: &Env, runs: usize) -> Result<Vec<Figure>> {
    let mut ready = Figure::new(
        "3. Full restart: all pods killed → all `/ready`",
        "s",
        Target::RatioAtMost(1.2),
    )
    .with_baseline("plain etcd restarted");
    let mut etcd = Figure::new(
        "3a. Full restart, etcd-level: every member answers a linearizable read",
        "s",
        Target::None,
    )
    .with_baseline("plain");
    let mut a = up(env, Kind::Agent).await?;
    let mut p = up(env, Kind::Plain).await?;
    for run in 0..runs {
        let (ra, rp) = if run % 2 == 0 {
            let ra = restart(&mut a).await?;
            (ra, restart(&mut p).await?)
        } else {
            let rp = restart(&mut p).await?;
            (restart(&mut a).await?, rp)
        };
        eprintln!(
            "bench: restart run {}: agent /ready {:.3}s (etcd-level {:.3}s), plain {:.3}s",
            run + 1,
            ra.0,
            ra.1,
            rp.1
        );
        ready.agent.push(ra.0);
        ready.baseline.push(rp.1);
        etcd.agent.push(ra.1);
        etcd.baseline.push(rp.1);
    }
    a.shutdown().await;
    p.shutdown().await;
    Ok(vec![ready, etcd])
}

async fn up(env: &Env, kind: Kind) -> Result<Set> {
    let mut set = env.set(kind, 3).await?;
    set.start_all(Duration::from_secs(90)).await?;
    load::small(&set, 0, 1000).await?;
    Ok(set)
}

/// Kills every pod (their names vanish, as when the pods are deleted), publishes them again
/// and starts them all at once: (all /ready, all linearizable), in seconds. For the plain
/// set both are the linearizable time.
async fn restart(set: &mut Set) -> Result<(f64, f64)> {
    set.wait_up(Duration::from_secs(60)).await?;
    for o in PODS {
        set.kill_processes(o).await;
    }
    set.withdraw(&PODS).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    set.publish(&PODS).await?;
    let t0 = Instant::now();
    // An experiment for BENCHMARKS.md (D): start the agent's sidecars only once etcd serves,
    // to see what their probes of a starting etcd cost. Only the etcd-level time counts then.
    let late_sidecars =
        set.kind == Kind::Agent && std::env::var_os("BENCH_RESTART_LATE_SIDECARS").is_some();
    for o in PODS {
        if late_sidecars {
            set.start_init(o)?;
        } else {
            set.start(o)?;
        }
    }
    let agent = set.kind == Kind::Agent && !late_sidecars;
    let (mut ready, mut etcd) = (None, None);
    loop {
        if agent && ready.is_none() && set.all_ready(&PODS).await {
            ready = Some(t0.elapsed().as_secs_f64());
        }
        if etcd.is_none() && set.all_linearizable(&PODS, 3).await {
            etcd = Some(t0.elapsed().as_secs_f64());
            if !agent {
                ready = etcd;
            }
        }
        if let (true, Some(e)) = (late_sidecars, etcd) {
            for o in PODS {
                set.start_sidecar(o)?;
            }
            return Ok((e, e));
        }
        if let (Some(r), Some(e)) = (ready, etcd) {
            return Ok((r, e));
        }
        if t0.elapsed() > TIMEOUT {
            bail!(
                "{:?} restart not done after {TIMEOUT:?}; logs in {}",
                set.kind,
                set.root().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
