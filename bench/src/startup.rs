//! Figure 4: how long `init` takes, from its process start to the exec of etcd, when the
//! volume holds this member's data (the common restart). `--etcd-bin` points at this
//! benchmark's own executable, which, started with `BENCH_FAKE_ETCD_OUT` set, writes the
//! wall-clock time to that file and exits: the exec is the end of the measurement.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use harness::procs::signal;
use harness::{Kind, Set};
use tokio::process::Command;

use crate::env::Env;
use crate::load::{first_log_time, log_time, secs_since};
use crate::stats::{median, Figure, Target};

pub const FAKE_ETCD_ENV: &str = "BENCH_FAKE_ETCD_OUT";

/// Called first thing in `main`: act as the fake etcd when asked to.
pub fn fake_etcd() -> bool {
    let Some(out) = std::env::var_os(FAKE_ETCD_ENV) else {
        return false;
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let _ = std::fs::write(out, nanos.to_string());
    true
}

#[derive(Debug, Default, Clone, Copy)]
struct Timing {
    /// Spawn → the fake etcd's first instruction.
    total_ms: f64,
    first_log_ms: Option<f64>,
    decision_ms: Option<f64>,
    exec_log_ms: Option<f64>,
}

async fn once(env: &Env, set: &Set, o: u32, direct: bool) -> Result<Timing> {
    let out = set.root().join("fake-etcd.out");
    let log = set.root().join("startup-init.log");
    let _ = std::fs::remove_file(&out);
    let mut cmd = if direct {
        Command::new(&env.me)
    } else {
        let mut c = Command::new(&env.steward);
        c.arg("init")
            .args(set.common_args(o))
            .arg(format!("--etcd-bin={}", env.me.display()));
        c
    };
    cmd.env(FAKE_ETCD_ENV, &out)
        .env("ETCD_STEWARD_LOG", "info")
        .env_remove("HOSTNAME")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    let t0 = SystemTime::now();
    let mut child = cmd.spawn()?;
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .context("init did not exec etcd within 60 s")??;
    if !status.success() {
        bail!(
            "init failed ({status}): {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let t1: u128 = std::fs::read_to_string(&out)
        .with_context(|| format!("the fake etcd did not run; init log: {}", log.display()))?
        .trim()
        .parse()?;
    let t1 = UNIX_EPOCH + Duration::from_nanos(t1 as u64);
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    let ms = |t: Option<SystemTime>| t.map(|t| secs_since(t0, t) * 1000.0);
    Ok(Timing {
        total_ms: secs_since(t0, t1) * 1000.0,
        first_log_ms: ms(first_log_time(&logs)),
        decision_ms: ms(log_time(&logs, "decision")),
        exec_log_ms: ms(log_time(&logs, "exec etcd")),
    })
}

async fn series(
    env: &Env,
    set: &Set,
    o: u32,
    runs: usize,
    name: &str,
    floor: &[f64],
) -> Result<Figure> {
    let mut timings = Vec::new();
    for _ in 0..runs {
        timings.push(once(env, set, o, false).await?);
    }
    Ok(figure_of(timings, name, floor))
}

fn figure_of(timings: Vec<Timing>, name: &str, floor: &[f64]) -> Figure {
    let mut f = Figure::new(name, "ms", Target::Below(50.0))
        .with_baseline("the fake etcd spawned directly (floor)");
    f.agent = timings.iter().map(|t| t.total_ms).collect();
    f.baseline = floor.iter().copied().cycle().take(timings.len()).collect();
    let med = |g: &dyn Fn(&Timing) -> Option<f64>| {
        let v: Vec<f64> = timings.iter().filter_map(g).collect();
        median(&v).map(|m| format!("{m:.1}")).unwrap_or("?".into())
    };
    f.note = format!(
        "median ms from spawn: first log line {}, decision logged {}, `exec etcd` logged {}",
        med(&|t| t.first_log_ms),
        med(&|t| t.decision_ms),
        med(&|t| t.exec_log_ms)
    );
    eprintln!(
        "bench: startup {name}: median {:.1} ms ({})",
        median(&f.agent).unwrap_or(f64::NAN),
        f.note
    );
    f
}

pub async fn run(env: &Env, runs: usize) -> Result<Vec<Figure>> {
    let mut set = env.set(Kind::Agent, 3).await?;
    set.start_all(Duration::from_secs(90)).await?;
    crate::load::small(&set, 0, 100).await?;
    let leader = set.leader().await?;
    let o = (0..3).rev().find(|o| *o != leader).unwrap_or(2);
    let others: Vec<u32> = (0..3).filter(|p| *p != o).collect();
    // Pod o's etcd is gone; its volume keeps its data and its name stays published.
    set.kill_processes(o).await;
    check_has_wal(set.data_dir(o))?;

    let mut floor = Vec::new();
    for _ in 0..runs {
        floor.push(once(env, &set, o, true).await?.total_ms);
    }
    let mut figures = Vec::new();
    figures.push(
        series(
            env,
            &set,
            o,
            runs,
            "4. `init` start-up overhead, data on the volume, peers answer",
            &floor,
        )
        .await?,
    );

    // Peers hung: their processes stopped, so connections are accepted and never answered
    // (what a frozen node or a partition looks like). Each run is one restart after a
    // start the cluster vouched for (an untimed run with the peers answering): a second
    // restart in a row that nobody answered for would be a crash loop, which waits the
    // full deadline by design (src/observe/mod.rs, `cluster_deadline`).
    let pids: Vec<u32> = others
        .iter()
        .flat_map(|p| [set.etcd_pid(*p), set.sidecar_pid(*p)])
        .flatten()
        .collect();
    let mut hung_runs = Vec::new();
    for _ in 0..runs.min(5) {
        once(env, &set, o, false).await?;
        for pid in &pids {
            signal(*pid, "STOP")?;
        }
        let t = once(env, &set, o, false).await;
        for pid in &pids {
            signal(*pid, "CONT")?;
        }
        hung_runs.push(t?);
    }
    let hung = figure_of(
        hung_runs,
        "4d. `init` start-up, data on the volume, peers hung (SIGSTOP: connect, never answer)",
        &floor,
    );

    for p in &others {
        set.kill_processes(*p).await;
    }
    set.withdraw(&others).await?;
    figures.push(
        series(
            env,
            &set,
            o,
            runs,
            "4b. `init` start-up, data on the volume, peers' pods gone (names not published)",
            &floor,
        )
        .await?,
    );
    set.publish(&others).await?;
    figures.push(
        series(
            env,
            &set,
            o,
            runs,
            "4c. `init` start-up, data on the volume, peers' names published, nothing listening",
            &floor,
        )
        .await?,
    );
    figures.push(hung);
    set.shutdown().await;
    Ok(figures)
}

fn check_has_wal(dir: &Path) -> Result<()> {
    let has = std::fs::read_dir(dir.join("member/wal"))
        .map(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.path().extension().is_some_and(|x| x == "wal"))
        })
        .unwrap_or(false);
    if !has {
        bail!("{} holds no WAL", dir.display());
    }
    Ok(())
}
