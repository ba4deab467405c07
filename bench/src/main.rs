//! etcd-steward-bench: how fast etcd-steward forms, heals and restarts a cluster against
//! plain etcd doing the same with no agent in the way, and what the agent costs to run.
//! Everything runs on loopback (127.0.200.x–127.0.250.x) with real etcd, a real dnsmasq
//! and the real agent binary; every agent figure is measured in the same run as its
//! baseline and reported as a ratio. Writes BENCHMARKS.md (between its markers), a JSON
//! file of every sample, and bench/replacement.png. Needs root (mount namespaces), etcd
//! (scripts/install-test-deps.sh), dnsmasq and wrk.
//!
//! `--smoke`: one short run of every scenario with tiny data, written to a scratch
//! directory; exits non-zero if the machinery is broken (targets are not judged).
//!
//! `--only backup --section backup`: the backup figures (issue 10), a snapshot of
//! `--backup-size` into the store and three pods restored from it; not in the default run
//! (it needs several GiB of disk and ~10 minutes at 1 GiB), but in the smoke run.
//!
//! `--only backup-crypt --section backup-crypt`: what encrypting the backups costs (issue
//! 15), the same snapshot of `--backup-size` with and without encryption, paired; likewise
//! only when named, and in the smoke run.
//!
//! `--only recover --section recover`: a majority of volumes lost (issue 11), `recover
//! --yes` against the manual runbook on a set holding `--recover-size`; likewise only when
//! named (1–3 minutes to load 1 GiB, ~7 minutes in all), and in the smoke run.

mod backup;
mod env;
mod footprint;
mod formation;
mod health;
mod image;
mod load;
mod plot;
mod recover;
mod replacement;
mod report;
mod restart;
mod startup;
mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde::Serialize;

use env::Env;
use stats::Figure;

const SCENARIOS: &[&str] = &[
    "image",
    "startup",
    "formation",
    "restart",
    "replacement",
    "health",
    "footprint",
    "backup",
    "backup-crypt",
    "recover",
];

/// Run only when named in `--only` (and in the smoke run).
const NOT_BY_DEFAULT: &[&str] = &["backup", "backup-crypt", "recover"];

#[derive(Debug, Parser)]
#[command(
    name = "etcd-steward-bench",
    about = "Benchmarks etcd-steward against plain etcd on loopback"
)]
struct Cli {
    /// Runs per figure (each run measures the agent and its baseline).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// One short run of everything with tiny data, into a scratch directory.
    #[arg(long)]
    smoke: bool,
    /// The agent binary; default: `cargo build --release -p etcd-steward` and use it.
    #[arg(long)]
    steward_bin: Option<PathBuf>,
    /// etcd; default: .tools/etcd-v3.5.1/etcd (scripts/install-test-deps.sh).
    #[arg(long, env = "ETCD_3_5_BIN")]
    etcd_bin: Option<PathBuf>,
    /// Data sizes for the replacement figure (K, M, G suffixes are binary).
    #[arg(long, value_delimiter = ',', default_value = "0,100M")]
    sizes: Vec<String>,
    /// Runs for sizes of 512 MiB and more.
    #[arg(long, default_value_t = 1)]
    large_runs: usize,
    /// Footprint: how long the cluster idles (no writes).
    #[arg(long, default_value = "120s")]
    idle: humantime::Duration,
    /// Footprint: how long the steady write load lasts.
    #[arg(long, default_value = "300s")]
    soak: humantime::Duration,
    /// Footprint: the steady write load, 1 KiB puts per second.
    #[arg(long, default_value_t = 100)]
    writes_per_sec: u32,
    /// Health: seconds of wrk per endpoint and condition.
    #[arg(long, default_value_t = 10)]
    wrk_secs: u64,
    /// Start-up overhead: runs per case.
    #[arg(long, default_value_t = 20)]
    startup_runs: usize,
    /// Backup: bytes of keys in the member whose snapshot is taken and restored.
    #[arg(long, default_value = "1G")]
    backup_size: String,
    /// Backup: runs of the snapshot and of the restore figure (backup-crypt: of each pair).
    #[arg(long, default_value_t = 3)]
    backup_runs: usize,
    /// Recover: bytes of keys in the set that loses 2 of its 3 volumes.
    #[arg(long, default_value = "1G")]
    recover_size: String,
    /// Recover: paired runs (agent and manual runbook, alternating which goes first).
    #[arg(long, default_value_t = 3)]
    recover_runs: usize,
    /// Only these scenarios (image, startup, formation, restart, replacement, health,
    /// footprint; backup, backup-crypt and recover run only when named here).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Where to write the report; default BENCHMARKS.md (smoke: target/bench-smoke/).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where to draw the replacement; default bench/replacement.png (smoke: target/bench-smoke/).
    #[arg(long)]
    png: Option<PathBuf>,
    /// Every sample as JSON; default bench/results.json (smoke: target/bench-smoke/).
    #[arg(long)]
    json: Option<PathBuf>,
    /// The image whose size is reported (built by images/build-test-image.sh).
    #[arg(long, default_value = "etcd-steward:test")]
    image: String,
    /// Runs for the cheap figures (formation, full restart), whose etcd-side spread is wide.
    #[arg(long, default_value_t = 10)]
    cheap_runs: usize,
    /// The section of the report this run writes (`main`; e.g. `large` for a 1 GiB run).
    #[arg(long, default_value = "main")]
    section: String,
    /// Keep every set's logs and data.
    #[arg(long)]
    keep: bool,
    /// First loopback subnet: sets use 127.0.N.x for N in [net-base, net-base + 50].
    #[arg(long, default_value_t = 200)]
    net_base: u8,
}

#[derive(Serialize)]
struct Results<'a> {
    machine: &'a report::Machine,
    command: &'a str,
    figures: &'a [Figure],
    failures: &'a [String],
    traces: &'a [replacement::Trace],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    recoveries: &'a [recover::Run],
}

fn parse_size(s: &str) -> Result<u64> {
    let s = s
        .trim()
        .trim_end_matches(['B', 'b'])
        .trim_end_matches(['i', 'I']);
    let (num, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = num
        .trim()
        .parse()
        .with_context(|| format!("bad size {s:?}"))?;
    Ok(n << shift)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Builds the agent with the bench's own profile (release for published figures; the
/// smoke run may use the debug build the test suite already made).
fn build_steward(repo: &Path) -> Result<PathBuf> {
    let release = !cfg!(debug_assertions);
    let mut args = vec![
        "build",
        "--locked",
        "-p",
        "etcd-steward",
        "--bin",
        "etcd-steward",
    ];
    if release {
        args.push("--release");
    }
    eprintln!("bench: cargo {}", args.join(" "));
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args(&args)
        .current_dir(repo)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("building etcd-steward failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"));
    let target = if target.is_absolute() {
        target
    } else {
        repo.join(target)
    };
    Ok(target
        .join(if release { "release" } else { "debug" })
        .join("etcd-steward"))
}

fn main() -> ExitCode {
    if startup::fake_etcd() {
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(mut cli: Cli) -> Result<bool> {
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("bench: interrupted; stopping every process it started");
            harness::procs::kill_all_children();
            std::process::exit(130);
        }
    });
    let repo = repo_root();
    let scratch = repo.join("target/bench-smoke");
    if cli.smoke {
        cli.runs = 1;
        cli.cheap_runs = 1;
        cli.sizes = vec!["0".into(), "4M".into()];
        cli.idle = Duration::from_secs(2).into();
        cli.soak = Duration::from_secs(3).into();
        cli.wrk_secs = 1;
        cli.startup_runs = 3;
        cli.backup_size = "4M".into();
        cli.backup_runs = 1;
        cli.recover_size = "4M".into();
        cli.recover_runs = 1;
        std::fs::create_dir_all(&scratch)?;
    }
    let pick = |given: &Option<PathBuf>, full: PathBuf, smoke: &str| {
        given
            .clone()
            .unwrap_or_else(|| if cli.smoke { scratch.join(smoke) } else { full })
    };
    let out = pick(&cli.out, repo.join("BENCHMARKS.md"), "BENCHMARKS.md");
    let suffix = if cli.section == "main" {
        String::new()
    } else {
        format!("-{}", cli.section)
    };
    let png = pick(
        &cli.png,
        repo.join(format!("bench/replacement{suffix}.png")),
        "replacement.png",
    );
    let json = pick(
        &cli.json,
        repo.join(format!("bench/results{suffix}.json")),
        "results.json",
    );
    let only: Vec<String> = if cli.only.is_empty() {
        SCENARIOS
            .iter()
            .filter(|s| cli.smoke || !NOT_BY_DEFAULT.contains(s))
            .map(|s| s.to_string())
            .collect()
    } else {
        for s in &cli.only {
            if !SCENARIOS.contains(&s.as_str()) {
                bail!("unknown scenario {s:?}; one of {SCENARIOS:?}");
            }
        }
        cli.only.clone()
    };
    let sizes: Vec<u64> = cli
        .sizes
        .iter()
        .map(|s| parse_size(s))
        .collect::<Result<_>>()?;
    let backup_bytes = parse_size(&cli.backup_size)?;
    let recover_bytes = parse_size(&cli.recover_size)?;
    let etcd = cli
        .etcd_bin
        .clone()
        .unwrap_or_else(|| repo.join(".tools/etcd-v3.5.1/etcd"));
    if !etcd.exists() {
        bail!(
            "etcd not found at {}: run scripts/install-test-deps.sh or pass --etcd-bin",
            etcd.display()
        );
    }
    let steward = match &cli.steward_bin {
        Some(p) => p.clone(),
        None => build_steward(&repo)?,
    };
    let env = Env {
        steward: steward
            .canonicalize()
            .with_context(|| format!("{}", steward.display()))?,
        etcd: etcd.canonicalize()?,
        me: std::env::current_exe()?,
        net_base: cli.net_base,
        net_count: 51,
        keep: cli.keep,
    };
    let mut machine = report::Machine::probe(&repo, &env.etcd);
    let command: String = {
        // What a person types: scripts/bench.sh passes --steward-bin itself.
        let mut args: Vec<String> = Vec::new();
        let mut skip = false;
        for a in std::env::args().skip(1) {
            if skip {
                skip = false;
            } else if a == "--steward-bin" {
                skip = true;
            } else if !a.starts_with("--steward-bin=") {
                args.push(a);
            }
        }
        if args.is_empty() {
            "scripts/bench.sh".into()
        } else {
            format!("scripts/bench.sh {}", args.join(" "))
        }
    };
    let mut settings = format!(
        "{} runs per figure ({} for formation and full restart, {} for ≥ 512 MiB); replacement sizes {}; footprint {} idle + {} at {} writes/s; wrk {} s per case, {} thread, {} connections, a new connection per request; start-up {} runs per case",
        cli.runs,
        cli.cheap_runs,
        cli.large_runs,
        sizes.iter().map(|b| replacement::size_label(*b)).collect::<Vec<_>>().join(", "),
        cli.idle,
        cli.soak,
        cli.writes_per_sec,
        cli.wrk_secs,
        health::WRK_THREADS,
        health::WRK_CONNECTIONS,
        cli.startup_runs
    );
    if only.iter().any(|s| s == "backup") {
        settings.push_str(&format!(
            "; backup: a one-member set holding {}, {} runs of each backup figure, store `file://`",
            replacement::size_label(backup_bytes),
            cli.backup_runs
        ));
    }
    if only.iter().any(|s| s == "backup-crypt") {
        settings.push_str(&format!(
            "; backup-crypt: a one-member set holding {}, {} paired runs (encrypted, unencrypted) of each figure, stores `file://`",
            replacement::size_label(backup_bytes),
            cli.backup_runs
        ));
    }
    if only.iter().any(|s| s == "recover") {
        settings.push_str(&format!(
            "; recover: a three-pod set holding {}, {} paired runs (agent, manual runbook), 2 of 3 volumes wiped in each",
            replacement::size_label(recover_bytes),
            cli.recover_runs
        ));
    }
    eprintln!("bench: {settings}");

    let mut figures: Vec<Figure> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut traces: Vec<replacement::Trace> = Vec::new();
    let mut recoveries: Vec<recover::Run> = Vec::new();
    let started = std::time::Instant::now();
    for scenario in SCENARIOS.iter().filter(|s| only.iter().any(|o| o == *s)) {
        let t = std::time::Instant::now();
        eprintln!("bench: === {scenario} ===");
        let result: Result<Vec<Figure>> = match *scenario {
            "image" => image::run(&cli.image, &env.steward, &env.etcd),
            "startup" => startup::run(&env, cli.startup_runs).await,
            "formation" => formation::run(&env, cli.cheap_runs).await,
            "restart" => restart::run(&env, cli.cheap_runs).await,
            "replacement" => {
                let mut all = Vec::new();
                let mut err = None;
                for b in &sizes {
                    let runs = if *b >= 512 << 20 {
                        cli.large_runs
                    } else {
                        cli.runs
                    };
                    match replacement::run(&env, *b, runs).await {
                        Ok((f, t)) => {
                            all.extend(f);
                            traces.extend(t);
                        }
                        Err(e) => {
                            err = Some(e.context(format!(
                                "replacement at {}",
                                replacement::size_label(*b)
                            )));
                            break;
                        }
                    }
                }
                match err {
                    Some(e) => {
                        figures.extend(all);
                        Err(e)
                    }
                    None => Ok(all),
                }
            }
            "health" => health::run(&env, cli.wrk_secs).await,
            "footprint" => {
                footprint::run(
                    &env,
                    &footprint::Options {
                        idle: cli.idle.into(),
                        load: cli.soak.into(),
                        writes_per_sec: cli.writes_per_sec,
                    },
                )
                .await
            }
            "backup" => {
                let opts = backup::Options {
                    bytes: backup_bytes,
                    runs: cli.backup_runs,
                };
                let mut done = Vec::new();
                let r = backup::run(&env, &opts, &mut done).await;
                match r {
                    Ok(()) => Ok(done),
                    Err(e) => {
                        figures.extend(done);
                        Err(e)
                    }
                }
            }
            "backup-crypt" => {
                let opts = backup::Options {
                    bytes: backup_bytes,
                    runs: cli.backup_runs,
                };
                let mut done = Vec::new();
                let r = backup::run_crypt(&env, &opts, &mut done).await;
                match r {
                    Ok(()) => Ok(done),
                    Err(e) => {
                        figures.extend(done);
                        Err(e)
                    }
                }
            }
            "recover" => recover::run(&env, recover_bytes, cli.recover_runs, &mut recoveries).await,
            _ => unreachable!("listed in SCENARIOS"),
        };
        match result {
            Ok(f) => figures.extend(f),
            Err(e) => {
                eprintln!("bench: {scenario} FAILED: {e:#}");
                failures.push(format!("{scenario}: {e:#}"));
            }
        }
        eprintln!("bench: {scenario} took {:.0} s", t.elapsed().as_secs_f64());
    }
    machine.load_end = report::loadavg();

    // The picture: the replacement with the most data up to 100 MiB.
    let trace = traces
        .iter()
        .filter(|t| t.kind == "agent" && t.events.done > 0.0)
        .max_by_key(|t| (t.bytes <= 100 << 20, t.bytes));
    let mut png_ref = None;
    if let Some(t) = trace {
        match plot::replacement(t, &png) {
            Ok(()) => {
                let rel = png
                    .strip_prefix(out.parent().unwrap_or(Path::new("/")))
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|_| png.clone());
                png_ref = Some(rel.display().to_string());
                eprintln!("bench: drew {}", png.display());
            }
            Err(e) => failures.push(format!("plot: {e:#}")),
        }
    } else if only.iter().any(|s| s == "replacement") {
        failures.push("plot: no replacement trace to draw".into());
    }

    let generated = report::generated(
        &cli.section,
        &machine,
        &command,
        &figures,
        &failures,
        png_ref.as_deref(),
        &settings,
    );
    report::write(&out, &cli.section, &generated)?;
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&Results {
            machine: &machine,
            command: &command,
            figures: &figures,
            failures: &failures,
            traces: &traces,
            recoveries: &recoveries,
        })?,
    )?;
    println!("{}", stats::TABLE_HEADER);
    for f in &figures {
        println!("{}", f.row());
    }
    eprintln!(
        "bench: wrote {} and {} in {:.0} s total",
        out.display(),
        json.display(),
        started.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        eprintln!("bench: {} scenario(s) failed:", failures.len());
        for f in &failures {
            eprintln!("  - {f}");
        }
        return Ok(false);
    }
    if cli.smoke {
        let ok = figures
            .iter()
            .all(|f| !f.agent.is_empty() && f.agent.iter().all(|v| v.is_finite()));
        let png_ok = std::fs::metadata(&png)
            .map(|m| m.len() > 1000)
            .unwrap_or(false);
        if !ok || !png_ok {
            eprintln!("bench: smoke: a figure has no finite value or the PNG is missing");
            return Ok(false);
        }
        eprintln!("bench: smoke run OK ({} figures)", figures.len());
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0").ok(), Some(0));
        assert_eq!(parse_size("100M").ok(), Some(100 << 20));
        assert_eq!(parse_size("100MiB").ok(), Some(100 << 20));
        assert_eq!(parse_size("1G").ok(), Some(1 << 30));
        assert_eq!(parse_size("4K").ok(), Some(4096));
    }
}
