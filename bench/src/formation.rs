//! Figure 1: empty volumes → three voters, all ready. Baseline: three plain etcd processes
//! started at once with the full static `--initial-cluster`.

use std::time::Duration;

use anyhow::{bail, Result};
use harness::Kind;
use tokio::time::Instant;

use crate::env::Env;
use crate::stats::{Figure, Target};

const TIMEOUT: Duration = Duration::from_secs(90);
const PODS: [u32; 3] = [0, 1, 2];

pub async fn run(env: &Env, runs: usize) -> Result<Vec<Figure>> {
    let mut ready = Figure::new(
        "1. Formation: empty volumes → 3 voters, all `/ready`",
        "s",
        Target::RatioAtMost(1.2),
    )
    .with_baseline("static `--initial-cluster`");
    let mut etcd = Figure::new(
        "1a. Formation, etcd-level: every member answers a linearizable read (the baseline's check)",
        "s",
        Target::None,
    )
    .with_baseline("static");
    for run in 0..runs {
        // Alternate which goes first so a drift in the machine's load hits both alike.
        let (a, b) = if run % 2 == 0 {
            let a = agent(env).await?;
            (a, plain(env).await?)
        } else {
            let b = plain(env).await?;
            (agent(env).await?, b)
        };
        eprintln!(
            "bench: formation run {}: agent /ready {:.3}s (etcd-level {:.3}s), plain {:.3}s",
            run + 1,
            a.0,
            a.1,
            b
        );
        ready.agent.push(a.0);
        ready.baseline.push(b);
        etcd.agent.push(a.1);
        etcd.baseline.push(b);
    }
    Ok(vec![ready, etcd])
}

/// (all /ready, all answer a linearizable read), in seconds from spawning the processes.
async fn agent(env: &Env) -> Result<(f64, f64)> {
    let mut set = env.set(Kind::Agent, 3).await?;
    set.publish(&PODS).await?;
    let t0 = Instant::now();
    for o in PODS {
        set.start(o)?;
    }
    let (mut ready, mut etcd) = (None, None);
    loop {
        if ready.is_none() && set.all_ready(&PODS).await {
            ready = Some(t0.elapsed().as_secs_f64());
        }
        if etcd.is_none() && set.all_linearizable(&PODS, 3).await {
            etcd = Some(t0.elapsed().as_secs_f64());
        }
        if let (Some(r), Some(e)) = (ready, etcd) {
            set.shutdown().await;
            return Ok((r, e));
        }
        if t0.elapsed() > TIMEOUT {
            bail!(
                "agent formation not done after {TIMEOUT:?}; logs in {}",
                set.root().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn plain(env: &Env) -> Result<f64> {
    let mut set = env.set(Kind::Plain, 3).await?;
    set.publish(&PODS).await?;
    let t0 = Instant::now();
    for o in PODS {
        set.start(o)?;
    }
    loop {
        if set.all_linearizable(&PODS, 3).await {
            let t = t0.elapsed().as_secs_f64();
            set.shutdown().await;
            return Ok(t);
        }
        if t0.elapsed() > TIMEOUT {
            bail!(
                "plain formation not done after {TIMEOUT:?}; logs in {}",
                set.root().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
