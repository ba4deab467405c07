//! Figures 8 and 9 (issue 10): backups, and the cluster coming back from one when every
//! volume is lost.
//!
//! 8. A member holding `--backup-size` of keys is snapshotted by `etcd-steward backup`
//!    (etcd's snapshot stream → the backup store, etcd's SHA-256 trailer checked on the
//!    way, then the manifest), against `etcdctl snapshot save` of the same member to a local
//!    file; the agent's peak RSS (`VmHWM`) meanwhile. The store is `file://` on the same
//!    disk as etcdctl's file, so both write the same bytes to the same place.
//!
//! 8b. The restore drill of that snapshot (`etcd-steward backup --drill`), for context.
//!
//! 8c. The leader's sidecar's peak RSS over a backup round of its own (snapshot, then the
//!    drill), started again with an empty store so the round is due at once.
//!
//! 9. Every volume lost: three empty pods started at t0 with `--backup-url` agree on the
//!    newest snapshot, each downloads and checks it, restores it and starts etcd; done when
//!    all three `/ready` answer 200 as three voters. Baseline, by hand on three plain pods
//!    at once: copy the snapshot from the store onto the volume, `etcdutl snapshot restore`
//!    with the static initial cluster, start etcd with the static command line; done when
//!    every member is a voter answering a linearizable read. Both hold every key after.
//!
//! 10. (`backup-crypt`, issue 15) What encryption costs: the same member snapshotted by
//!     `etcd-steward backup` with `--backup-encryption-key-file` (age X25519) and without,
//!     into two `file://` stores on the same disk, alternating which goes first; time, peak
//!     RSS and CPU time of each, and the restore drill of each store's newest snapshot
//!     (which decrypts the encrypted one).
//!
//! Everything the scenario writes (the source member, the store, the restored sets) lives
//! in temporary directories it removes when it ends, failed or not; a failure carries the
//! pods' last log lines instead.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use harness::{Kind, PlainStart, Set};
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::env::Env;
use crate::footprint::{clk_tck, cpu_secs, status_kib};
use crate::load::{self, log_time, secs_since};
use crate::replacement::size_label;
use crate::stats::{fmt_num, median, Figure, Target};

/// The longest a restore may take before the run is called failed.
const TIMEOUT: Duration = Duration::from_secs(900);
const PODS: [u32; 3] = [0, 1, 2];
/// The bound on the agent's memory while it streams a 1 GiB snapshot.
const RSS_TARGET_MIB: f64 = 32.0;
/// How often a measured process's `VmHWM` is read.
const RSS_EVERY: Duration = Duration::from_millis(5);

/// What the scenario measures.
pub struct Options {
    /// Bytes of values the snapshotted member holds.
    pub bytes: u64,
    /// Runs of each figure (agent and baseline alternate which goes first).
    pub runs: usize,
}

/// Runs figures 8 and 9; pushes each group of figures into `out` as soon as it is complete,
/// so a failure in the restore keeps the snapshot's figures.
pub async fn run(env: &Env, opts: &Options, out: &mut Vec<Figure>) -> Result<()> {
    let tools = Tools::beside(&env.etcd)?;
    let store = Store::new()?;
    let label = size_label(opts.bytes);
    let mut src = env.set(Kind::Agent, 1).await?;
    let snapshot = {
        let r = snapshot_figures(env, &tools, &store, &mut src, opts, &label).await;
        finish(&mut src, r).await?
    };
    out.extend(snapshot.figures);
    out.extend(restore_figures(env, &tools, &store, &snapshot.taken, opts, &label).await?);
    Ok(())
}

/// etcd's command-line tools of the release under test (beside its etcd binary).
struct Tools {
    etcdctl: PathBuf,
    etcdutl: PathBuf,
}

impl Tools {
    fn beside(etcd: &Path) -> Result<Tools> {
        let t = Tools {
            etcdctl: etcd.with_file_name("etcdctl"),
            etcdutl: etcd.with_file_name("etcdutl"),
        };
        for p in [&t.etcdctl, &t.etcdutl] {
            if !p.exists() {
                bail!(
                    "{} not found beside etcd: the backup figures need etcd 3.5's tools",
                    p.display()
                );
            }
        }
        Ok(t)
    }
}

/// The backup store: a `file://` directory of the bench's own, removed when dropped.
struct Store {
    dir: tempfile::TempDir,
}

impl Store {
    fn new() -> Result<Store> {
        let dir = tempfile::Builder::new()
            .prefix("steward-bench-store-")
            .tempdir()
            .context("creating the backup store's directory")?;
        Ok(Store { dir })
    }

    fn url(&self) -> String {
        format!("file://{}", self.dir.path().display())
    }

    fn snapshots(&self) -> PathBuf {
        self.dir.path().join("snapshots")
    }

    fn snapshot_file(&self, name: &str) -> PathBuf {
        self.snapshots().join(format!("{name}.db"))
    }

    /// Removes every stored snapshot but `keep`'s (.db and .json). The store is the
    /// bench's own: each run adds a full copy, and only the newest is restored.
    fn keep_only(&self, keep: &str) -> Result<()> {
        for e in std::fs::read_dir(self.snapshots())? {
            let path = e?.path();
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            if stem != keep {
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
        Ok(())
    }
}

/// The options every `etcd-steward` command of the scenario gets to reach the store.
fn backup_args(tools: &Tools, store: &Store, scratch: &Path) -> Vec<String> {
    let mut args = vec![
        format!("--backup-url={}", store.url()),
        format!("--etcdutl-bin={}", tools.etcdutl.display()),
        format!("--backup-scratch-dir={}", scratch.display()),
        // Periodic snapshots stay out of the measurement.
        "--backup-interval=1h".into(),
    ];
    // A tool that cannot move the revision forward is refused unless the jump is off.
    args.extend(harness::etcd::jump_args(&tools.etcdutl));
    args
}

/// `etcd-steward backup [more]` through the source member (`--etcd-bin`: the drill's
/// throw-away etcd is the release under test; `init` gets it from the harness).
fn backup_command(env: &Env, tools: &Tools, store: &Store, src: &Set, more: &[&str]) -> Command {
    let mut cmd = Command::new(&env.steward);
    cmd.arg("backup")
        .args(more)
        .args(src.common_args(0))
        .args(backup_args(tools, store, &src.root().join("scratch")))
        .arg(format!("--etcd-bin={}", env.etcd.display()))
        .env("ETCD_STEWARD_LOG", "warn")
        .env_remove("HOSTNAME");
    cmd
}

/// Shuts the set down (its directory goes unless `--keep`); a failure carries the pods'
/// last log lines, since the logs go with the directory.
async fn finish<T>(set: &mut Set, r: Result<T>) -> Result<T> {
    let r = match r {
        Ok(v) => Ok(v),
        Err(e) => Err(e.context(format!("the set's last log lines:{}", set.dump()))),
    };
    set.shutdown().await;
    r
}

// ---- measuring a process ------------------------------------------------------------------

/// A finished process: wall time from spawn to exit, its peak RSS, what it printed.
struct Measured {
    secs: f64,
    peak_mib: f64,
    /// utime + stime of the process itself (not its children), last read at most 5 ms
    /// before it exited.
    cpu_secs: f64,
    stdout: String,
    stderr: String,
}

async fn read_all<R: tokio::io::AsyncRead + Unpin>(r: Option<R>) -> String {
    let mut buf = Vec::new();
    if let Some(mut r) = r {
        let _ = r.read_to_end(&mut buf).await;
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Runs `cmd` to its end, reading its `VmHWM` every 5 ms (the kernel's high-water mark of
/// its resident set; the last reading is at most 5 ms before it exits); fails unless it
/// exits 0.
async fn measure(mut cmd: Command, program: &Path) -> Result<Measured> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let tck = clk_tck();
    let t0 = Instant::now();
    let mut child = harness::procs::spawn(cmd, program)?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("{} exited at once", program.display()))?;
    let stdout = tokio::spawn(read_all(child.stdout.take()));
    let stderr = tokio::spawn(read_all(child.stderr.take()));
    let mut peak_kib: f64 = 0.0;
    let mut cpu: f64 = 0.0;
    let status = loop {
        if let Ok(kib) = status_kib(pid, "VmHWM") {
            peak_kib = peak_kib.max(kib);
        }
        if let Ok(c) = cpu_secs(pid, tck) {
            cpu = cpu.max(c);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        tokio::time::sleep(RSS_EVERY).await;
    };
    let secs = t0.elapsed().as_secs_f64();
    let m = Measured {
        secs,
        peak_mib: peak_kib / 1024.0,
        cpu_secs: cpu,
        stdout: stdout.await.unwrap_or_default(),
        stderr: stderr.await.unwrap_or_default(),
    };
    if !status.success() {
        bail!(
            "{} failed ({status}): {}",
            program.display(),
            last_chars(&m.stderr, 1500)
        );
    }
    Ok(m)
}

fn last_chars(s: &str, n: usize) -> String {
    let chars: Vec<char> = s.trim().chars().collect();
    chars[chars.len().saturating_sub(n)..].iter().collect()
}

/// Runs a by-hand step (`cp`, `etcdutl`) to its end; fails unless it exits 0.
async fn step(cmd: Command, program: &Path) -> Result<()> {
    measure(cmd, program).await.map(drop)
}

// ---- figure 8: the snapshot -----------------------------------------------------------------

struct SnapshotResult {
    figures: Vec<Figure>,
    /// The newest snapshot in the store (the one the restore figures restore).
    taken: Taken,
}

/// A snapshot in the store and what it holds.
#[derive(Clone)]
struct Taken {
    name: String,
    keys: u64,
    /// The plain database to restore by hand: the stored object itself, or (when the
    /// agent compressed it) a copy decompressed before any restore is timed, so the
    /// baseline stays a `cp`.
    plain: PathBuf,
}

async fn snapshot_figures(
    env: &Env,
    tools: &Tools,
    store: &Store,
    src: &mut Set,
    opts: &Options,
    label: &str,
) -> Result<SnapshotResult> {
    let mut time = Figure::new(
        format!("8. Snapshot, {label} of keys: `etcd-steward backup` streams it into the store (file://), checks etcd's SHA-256 and writes the manifest"),
        "s",
        Target::None,
    )
    .with_baseline("`etcdctl snapshot save` to a local file");
    let mut rss = Figure::new(
        format!("8a. Peak RSS (`VmHWM`) of `etcd-steward backup` while it streams {label}"),
        "MiB",
        Target::AtMost(RSS_TARGET_MIB),
    )
    .with_baseline("etcdctl's");

    src.start_all(Duration::from_secs(90)).await?;
    let t = Instant::now();
    let keys = load::fill(src, opts.bytes).await?;
    eprintln!(
        "bench: backup: loaded {keys} keys ({label}) into a one-member set in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let local = src.root().join("etcdctl-snapshot.db");
    let mut newest = None;
    let mut sizes = Vec::new();
    let mut plain_sizes = Vec::new();
    for run in 0..opts.runs.max(1) {
        let (a, b) = if run % 2 == 0 {
            let a = agent_snapshot(env, tools, store, src).await?;
            (a, etcdctl_snapshot(tools, src, &local).await?)
        } else {
            let b = etcdctl_snapshot(tools, src, &local).await?;
            (agent_snapshot(env, tools, store, src).await?, b)
        };
        let (agent, manifest) = a;
        let (plain, plain_size) = b;
        let size = manifest["size"].as_u64().unwrap_or(0);
        let compressed = manifest["compression"].is_string();
        if size < opts.bytes && !compressed {
            bail!("the snapshot holds {size} bytes, less than the {label} loaded: {manifest}");
        }
        let name = manifest["name"]
            .as_str()
            .ok_or_else(|| anyhow!("the manifest has no name: {manifest}"))?
            .to_string();
        store.keep_only(&name)?;
        eprintln!(
            "bench: backup: snapshot run {}: agent {:.2}s peak {:.1} MiB ({} bytes), etcdctl {:.2}s peak {:.1} MiB ({} bytes)",
            run + 1,
            agent.secs,
            agent.peak_mib,
            size,
            plain.secs,
            plain.peak_mib,
            plain_size
        );
        time.agent.push(agent.secs);
        time.baseline.push(plain.secs);
        rss.agent.push(agent.peak_mib);
        rss.baseline.push(plain.peak_mib);
        sizes.push(size as f64);
        newest = Some((name, manifest["compression"].as_str().map(str::to_string)));
        plain_sizes.push(plain_size as f64);
    }
    let (name, compression) = newest.ok_or_else(|| anyhow!("no snapshot taken"))?;
    let size = median(&sizes).unwrap_or(0.0);
    let plain_size = median(&plain_sizes).unwrap_or(0.0);
    let throughput_of = |xs: &[f64], bytes: f64| {
        median(xs)
            .map(|s| fmt_num(bytes / s / f64::from(1u32 << 20)))
            .unwrap_or_else(|| "—".into())
    };
    let mib = |b: f64| fmt_num(b / f64::from(1u32 << 20));
    time.note = format!(
        "snapshot {} MiB ({} MiB stored, compression: {}); agent {} MiB/s, etcdctl {} MiB/s (of the snapshot); one member, no writes meanwhile",
        mib(plain_size),
        mib(size),
        compression.as_deref().unwrap_or("none"),
        throughput_of(&time.agent, plain_size),
        throughput_of(&time.baseline, plain_size)
    );
    rss.note = "read from `/proc/PID/status` every 5 ms until the process exits; the sidecar's round runs the same code (`Backups::tick` → `snapshot::take`)".into();

    // The drill of the newest snapshot: restored into scratch by etcdutl, started as a
    // throw-away etcd, its HashKV compared with the live member's.
    let mut drill = Figure::new(
        format!("8b. Restore drill of the {label} snapshot (`backup --drill`): restore into scratch, start it, compare HashKV with the live member"),
        "s",
        Target::None,
    );
    let (d, outcome) = agent_drill(env, tools, store, src).await?;
    drill.agent.push(d.secs);
    drill.note = format!(
        "hash check: {}; restored revision {}; peak RSS of `etcd-steward backup --drill` {} MiB (etcdutl and the throw-away etcd are its children, not counted)",
        outcome["hash_check"].as_str().unwrap_or("?"),
        outcome["restored_revision"],
        fmt_num(d.peak_mib)
    );
    eprintln!(
        "bench: backup: drill {:.2}s peak {:.1} MiB: {}",
        d.secs, d.peak_mib, outcome
    );
    let sidecar = sidecar_rounds(env, tools, src, opts, label).await?;
    let stored = store.snapshot_file(&name);
    let plain = match compression.as_deref() {
        None => stored,
        Some(_) => {
            let plain = store.dir.path().join(format!("{name}.plain.db"));
            let mut c = Command::new("zstd");
            c.args(["-d", "-q", "-f", "-o"]).arg(&plain).arg(&stored);
            step(c, Path::new("zstd")).await?;
            plain
        }
    };
    Ok(SnapshotResult {
        figures: vec![time, rss, drill, sidecar],
        taken: Taken { name, keys, plain },
    })
}

/// 8c: the sidecar's own rounds. Per run, the member's sidecar is started again with an
/// empty store of its own: as the leader it takes a snapshot at once, then drills it.
/// Its `VmHWM` is read every 5 ms from its start until the drill is recorded.
async fn sidecar_rounds(
    env: &Env,
    tools: &Tools,
    src: &mut Set,
    opts: &Options,
    label: &str,
) -> Result<Figure> {
    let mut fig = Figure::new(
        format!("8c. Peak RSS (`VmHWM`) of the leader's sidecar over a backup round of {label}: the snapshot, then its drill"),
        "MiB",
        Target::AtMost(RSS_TARGET_MIB),
    );
    let (mut taken_at, mut drilled_at) = (Vec::new(), Vec::new());
    for run in 0..opts.runs.max(1) {
        let store = Store::new()?;
        let r = sidecar_round(env, tools, src, &store).await?;
        eprintln!(
            "bench: backup: sidecar round {}: snapshot in the store {:.2}s after the sidecar started, drilled {:.2}s, sidecar peak {:.1} MiB",
            run + 1,
            r.taken_at,
            r.drilled_at,
            r.peak_mib
        );
        fig.agent.push(r.peak_mib);
        taken_at.push(r.taken_at);
        drilled_at.push(r.drilled_at);
    }
    fig.note = format!(
        "from the sidecar's start (its store empty, so the round is due at once): snapshot in the store after {} s, drill recorded after {} s (medians); the sidecar's own process (etcdutl and the drill's throw-away etcd are its children, not counted)",
        median(&taken_at).map(fmt_num).unwrap_or_default(),
        median(&drilled_at).map(fmt_num).unwrap_or_default()
    );
    Ok(fig)
}

struct Round {
    peak_mib: f64,
    taken_at: f64,
    drilled_at: f64,
}

async fn sidecar_round(env: &Env, tools: &Tools, src: &mut Set, store: &Store) -> Result<Round> {
    src.kill_sidecar(0).await;
    let plain = std::mem::take(&mut src.extra_args);
    let mut args = backup_args(tools, store, &src.root().join("scratch-sidecar"));
    // The drill's throw-away etcd: the release under test (the harness passes --etcd-bin
    // to init only).
    args.push(format!("--etcd-bin={}", env.etcd.display()));
    src.extra_args = args;
    let started = src.start_sidecar(0);
    src.extra_args = plain;
    started?;
    let t0 = Instant::now();
    let pid = src
        .sidecar_pid(0)
        .ok_or_else(|| anyhow!("the sidecar exited at once"))?;
    let mut peak_kib: f64 = 0.0;
    let mut taken_at = None;
    let mut polls: u64 = 0;
    loop {
        match status_kib(pid, "VmHWM") {
            Ok(kib) => peak_kib = peak_kib.max(kib),
            Err(_) => bail!("the sidecar exited during its backup round"),
        }
        polls += 1;
        // The store is looked at every 50 ms; the sidecar's memory every 5 ms.
        if polls % 10 == 0 {
            if let Some(m) = stored_manifest(store)? {
                if taken_at.is_none() {
                    if m["verified"] != true {
                        bail!("the sidecar's snapshot is not verified: {m}");
                    }
                    taken_at = Some(t0.elapsed().as_secs_f64());
                }
                if !m["drill"].is_null() {
                    if m["drill"]["passed"] != true {
                        bail!("the sidecar's drill failed: {m}");
                    }
                    let drilled_at = t0.elapsed().as_secs_f64();
                    src.kill_sidecar(0).await;
                    return Ok(Round {
                        peak_mib: peak_kib / 1024.0,
                        taken_at: taken_at.unwrap_or(drilled_at),
                        drilled_at,
                    });
                }
            }
        }
        if t0.elapsed() > TIMEOUT {
            bail!("the sidecar's backup round not done after {TIMEOUT:?}");
        }
        tokio::time::sleep(RSS_EVERY).await;
    }
}

/// The one manifest in the store, once written (the store's writes are renames: a
/// manifest is read whole or not at all).
fn stored_manifest(store: &Store) -> Result<Option<serde_json::Value>> {
    let entries = match std::fs::read_dir(store.snapshots()) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    for e in entries {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&path)?;
            return Ok(Some(serde_json::from_str(&text).with_context(|| {
                format!("{} is not a manifest", path.display())
            })?));
        }
    }
    Ok(None)
}

/// `etcd-steward backup` through the member: (the process, its manifest).
async fn agent_snapshot(
    env: &Env,
    tools: &Tools,
    store: &Store,
    src: &Set,
) -> Result<(Measured, serde_json::Value)> {
    let cmd = backup_command(env, tools, store, src, &[]);
    let m = measure(cmd, &env.steward).await?;
    let manifest: serde_json::Value = serde_json::from_str(m.stdout.trim())
        .with_context(|| format!("`backup` printed no manifest: {:?}", m.stdout))?;
    if manifest["verified"] != true {
        bail!("the snapshot is not verified: {manifest}");
    }
    Ok((m, manifest))
}

/// `etcdctl snapshot save` of the member to `file`: (the process, the file's size).
async fn etcdctl_snapshot(tools: &Tools, src: &Set, file: &Path) -> Result<(Measured, u64)> {
    let mut cmd = Command::new(&tools.etcdctl);
    cmd.env_clear()
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", src.client_url(0)))
        .args(["snapshot", "save"])
        .arg(file);
    let m = measure(cmd, &tools.etcdctl).await?;
    let size = std::fs::metadata(file)
        .with_context(|| format!("etcdctl wrote no {}", file.display()))?
        .len();
    std::fs::remove_file(file)?;
    Ok((m, size))
}

/// `etcd-steward backup --drill`: (the process, the drill's outcome), which must pass.
async fn agent_drill(
    env: &Env,
    tools: &Tools,
    store: &Store,
    src: &Set,
) -> Result<(Measured, serde_json::Value)> {
    let cmd = backup_command(env, tools, store, src, &["--drill"]);
    let m = measure(cmd, &env.steward).await?;
    let outcome: serde_json::Value = serde_json::from_str(m.stdout.trim())
        .with_context(|| format!("`backup --drill` printed no outcome: {:?}", m.stdout))?;
    if outcome["passed"] != true {
        bail!("the drill failed: {outcome}");
    }
    Ok((m, outcome))
}

// ---- figure 10: what encryption costs (issue 15) --------------------------------------------

/// Runs figure 10 (`backup-crypt`): a member holding `opts.bytes` snapshotted with and
/// without encryption, paired run by run; pushes the figures into `out`.
pub async fn run_crypt(env: &Env, opts: &Options, out: &mut Vec<Figure>) -> Result<()> {
    let tools = Tools::beside(&env.etcd)?;
    let label = size_label(opts.bytes);
    let mut src = env.set(Kind::Agent, 1).await?;
    let r = crypt_figures(env, &tools, &mut src, opts, &label).await;
    out.extend(finish(&mut src, r).await?);
    Ok(())
}

/// One snapshot's process and what its manifest says.
struct Shot {
    m: Measured,
    size: u64,
}

/// `etcd-steward backup` into `store`, with `more` options; its manifest must be verified and
/// encrypted exactly when `encrypted`.
async fn crypt_snapshot(
    env: &Env,
    tools: &Tools,
    store: &Store,
    src: &Set,
    more: &[&str],
    encrypted: bool,
) -> Result<Shot> {
    let cmd = backup_command(env, tools, store, src, more);
    let m = measure(cmd, &env.steward).await?;
    let manifest: serde_json::Value = serde_json::from_str(m.stdout.trim())
        .with_context(|| format!("`backup` printed no manifest: {:?}", m.stdout))?;
    if manifest["verified"] != true {
        bail!("the snapshot is not verified: {manifest}");
    }
    if manifest["encryption"].is_null() == encrypted {
        bail!("the snapshot's encryption is not as asked (encrypted: {encrypted}): {manifest}");
    }
    let name = manifest["name"]
        .as_str()
        .ok_or_else(|| anyhow!("the manifest has no name: {manifest}"))?
        .to_string();
    store.keep_only(&name)?;
    Ok(Shot {
        m,
        size: manifest["size"].as_u64().unwrap_or(0),
    })
}

async fn crypt_figures(
    env: &Env,
    tools: &Tools,
    src: &mut Set,
    opts: &Options,
    label: &str,
) -> Result<Vec<Figure>> {
    let mut time = Figure::new(
        format!("10. Encrypted snapshot, {label} of keys: `etcd-steward backup` with `--backup-encryption-key-file` (age X25519) into the store (file://)"),
        "s",
        Target::None,
    )
    .with_baseline("the same, unencrypted, into a file:// store on the same disk");
    let mut rss = Figure::new(
        format!("10a. Peak RSS (`VmHWM`) of `etcd-steward backup` while it encrypts and streams {label}"),
        "MiB",
        Target::AtMost(RSS_TARGET_MIB),
    )
    .with_baseline("unencrypted");
    let mut cpu = Figure::new(
        format!("10b. CPU time (user + system) of `etcd-steward backup`, {label}"),
        "s",
        Target::None,
    )
    .with_baseline("unencrypted");
    let mut drill = Figure::new(
        format!("10c. Restore drill of the {label} snapshot (`backup --drill`), encrypted: download, decrypt, restore, start, compare HashKV"),
        "s",
        Target::None,
    )
    .with_baseline("the unencrypted snapshot's drill");

    src.start_all(Duration::from_secs(90)).await?;
    let t = Instant::now();
    let keys = load::fill(src, opts.bytes).await?;
    eprintln!(
        "bench: backup-crypt: loaded {keys} keys ({label}) into a one-member set in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    // A key of its own, as `backup --generate-key` writes it.
    let key_file = src.root().join("backup.key");
    let key = Command::new(&env.steward)
        .args(["backup", "--generate-key"])
        .output()
        .await
        .context("etcd-steward backup --generate-key")?;
    if !key.status.success() {
        bail!(
            "etcd-steward backup --generate-key failed: {}",
            String::from_utf8_lossy(&key.stderr)
        );
    }
    std::fs::write(&key_file, &key.stdout)?;
    let key_arg = format!("--backup-encryption-key-file={}", key_file.display());
    let (plain_store, crypt_store) = (Store::new()?, Store::new()?);
    let (mut plain_sizes, mut crypt_sizes) = (Vec::new(), Vec::new());
    for run in 0..opts.runs.max(1) {
        let plain_first = run % 2 == 0;
        let mut shots = Vec::new();
        for encrypted in [!plain_first, plain_first] {
            let (store, more): (&Store, Vec<&str>) = if encrypted {
                (&crypt_store, vec![key_arg.as_str()])
            } else {
                (&plain_store, vec![])
            };
            shots.push((
                encrypted,
                crypt_snapshot(env, tools, store, src, &more, encrypted).await?,
            ));
        }
        shots.sort_by_key(|(e, _)| *e);
        let (p, c) = (&shots[0].1, &shots[1].1);
        eprintln!(
            "bench: backup-crypt: snapshot run {}: encrypted {:.2}s peak {:.1} MiB cpu {:.2}s ({} bytes), unencrypted {:.2}s peak {:.1} MiB cpu {:.2}s ({} bytes)",
            run + 1,
            c.m.secs,
            c.m.peak_mib,
            c.m.cpu_secs,
            c.size,
            p.m.secs,
            p.m.peak_mib,
            p.m.cpu_secs,
            p.size
        );
        time.agent.push(c.m.secs);
        time.baseline.push(p.m.secs);
        rss.agent.push(c.m.peak_mib);
        rss.baseline.push(p.m.peak_mib);
        cpu.agent.push(c.m.cpu_secs);
        cpu.baseline.push(p.m.cpu_secs);
        plain_sizes.push(p.size as f64);
        crypt_sizes.push(c.size as f64);
    }
    let mib = |b: f64| b / f64::from(1u32 << 20);
    let (plain_size, crypt_size) = (
        median(&plain_sizes).unwrap_or(0.0),
        median(&crypt_sizes).unwrap_or(0.0),
    );
    let rate = |size: f64, xs: &[f64]| {
        median(xs)
            .map(|s| fmt_num(mib(size) / s))
            .unwrap_or_else(|| "—".into())
    };
    let extra_cpu: Vec<f64> = cpu
        .agent
        .iter()
        .zip(&cpu.baseline)
        .map(|(c, p)| c - p)
        .collect();
    time.note = format!(
        "paired runs, alternating which goes first; snapshot {} MiB, ciphertext {} MiB (+{} KiB: age's header and a 16-byte tag per 64 KiB chunk); encrypted {} MiB/s, unencrypted {} MiB/s; one member, no writes meanwhile",
        fmt_num(mib(plain_size)),
        fmt_num(mib(crypt_size)),
        fmt_num((crypt_size - plain_size) / 1024.0),
        rate(plain_size, &time.agent),
        rate(plain_size, &time.baseline)
    );
    rss.note = "read from `/proc/PID/status` every 5 ms until the process exits".into();
    cpu.note = format!(
        "the process's own utime + stime from `/proc/PID/stat` (100 Hz ticks), last read ≤ 5 ms before it exits; encryption adds {} CPU-s (median): ≈ {} MiB of snapshot per added CPU-second (age's ChaCha20-Poly1305 and its buffer copies)",
        median(&extra_cpu).map(fmt_num).unwrap_or_else(|| "—".into()),
        median(&extra_cpu)
            .filter(|x| *x > 0.0)
            .map(|x| fmt_num(mib(plain_size) / x))
            .unwrap_or_else(|| "—".into())
    );

    // The drills: each store's newest snapshot restored into scratch and compared with the
    // live member (the encrypted one decrypted first), paired and alternating like the above.
    let mut drill_rss = (Vec::new(), Vec::new());
    for run in 0..opts.runs.max(1) {
        let plain_first = run % 2 == 0;
        let mut got = Vec::new();
        for encrypted in [!plain_first, plain_first] {
            let (store, more): (&Store, Vec<&str>) = if encrypted {
                (&crypt_store, vec!["--drill", key_arg.as_str()])
            } else {
                (&plain_store, vec!["--drill"])
            };
            let cmd = backup_command(env, tools, store, src, &more);
            let m = measure(cmd, &env.steward).await?;
            let outcome: serde_json::Value = serde_json::from_str(m.stdout.trim())
                .with_context(|| format!("`backup --drill` printed no outcome: {:?}", m.stdout))?;
            if outcome["passed"] != true {
                bail!("the drill failed (encrypted: {encrypted}): {outcome}");
            }
            got.push((encrypted, m));
        }
        got.sort_by_key(|(e, _)| *e);
        let (p, c) = (&got[0].1, &got[1].1);
        eprintln!(
            "bench: backup-crypt: drill run {}: encrypted {:.2}s peak {:.1} MiB, unencrypted {:.2}s peak {:.1} MiB",
            run + 1,
            c.secs,
            c.peak_mib,
            p.secs,
            p.peak_mib
        );
        drill.agent.push(c.secs);
        drill.baseline.push(p.secs);
        drill_rss.0.push(c.peak_mib);
        drill_rss.1.push(p.peak_mib);
    }
    drill.note = format!(
        "paired runs; peak RSS of `backup --drill` {} MiB encrypted, {} MiB unencrypted (medians; etcdutl and the throw-away etcd are its children, not counted)",
        median(&drill_rss.0).map(fmt_num).unwrap_or_default(),
        median(&drill_rss.1).map(fmt_num).unwrap_or_default()
    );
    Ok(vec![time, rss, cpu, drill])
}

// ---- figure 9: every volume lost → the cluster back from the snapshot -----------------------

/// One restore, in seconds from t0. The phases are the moment the last pod reached them.
struct Restore {
    /// Every pod `/ready` as three voters (agent); every member a voter answering a
    /// linearizable read (by hand).
    done: f64,
    /// Every member answers a linearizable read.
    etcd: f64,
    /// The snapshot is on every volume (agent: downloaded and checked).
    fetched: Option<f64>,
    /// `snapshot restore` finished on every pod.
    restored: Option<f64>,
    /// etcd started on every pod.
    started: Option<f64>,
}

async fn restore_figures(
    env: &Env,
    tools: &Tools,
    store: &Store,
    taken: &Taken,
    opts: &Options,
    label: &str,
) -> Result<Vec<Figure>> {
    let mut done = Figure::new(
        format!("9. Restore, {label}: every volume lost → 3 voters from the newest backup, all `/ready`"),
        "s",
        Target::RatioAtMost(1.2),
    )
    .with_baseline("by hand: copy from the store, `etcdutl snapshot restore` on each, static start");
    let mut etcd = Figure::new(
        format!("9a. Restore, {label}, etcd-level: every member answers a linearizable read (the baseline's check)"),
        "s",
        Target::None,
    )
    .with_baseline("by hand");
    let mut agents = Vec::new();
    let mut plains = Vec::new();
    for run in 0..opts.runs.max(1) {
        let (a, p) = if run % 2 == 0 {
            let a = agent_restore(env, tools, store, taken).await?;
            (a, plain_restore(env, tools, taken).await?)
        } else {
            let p = plain_restore(env, tools, taken).await?;
            (agent_restore(env, tools, store, taken).await?, p)
        };
        eprintln!(
            "bench: backup: restore run {}: agent /ready {:.2}s (etcd-level {:.2}s; snapshot on every volume {}, restored {}, etcd started {}), by hand {:.2}s (copied {}, restored {}, started {})",
            run + 1,
            a.done,
            a.etcd,
            opt_s(a.fetched),
            opt_s(a.restored),
            opt_s(a.started),
            p.done,
            opt_s(p.fetched),
            opt_s(p.restored),
            opt_s(p.started)
        );
        done.agent.push(a.done);
        done.baseline.push(p.done);
        etcd.agent.push(a.etcd);
        etcd.baseline.push(p.done);
        agents.push(a);
        plains.push(p);
    }
    let phase = |runs: &[Restore], f: fn(&Restore) -> Option<f64>| {
        let xs: Vec<f64> = runs.iter().filter_map(f).collect();
        median(&xs)
            .map(|m| format!("{m:.2}"))
            .unwrap_or_else(|| "—".into())
    };
    done.note = format!(
        "median s from t0 until the last pod: agent: snapshot downloaded and checked {}, restored {}, etcd exec'd {}; by hand: copied {}, restored {}, etcd started {}; every pod holds all {} keys after",
        phase(&agents, |r| r.fetched),
        phase(&agents, |r| r.restored),
        phase(&agents, |r| r.started),
        phase(&plains, |r| r.fetched),
        phase(&plains, |r| r.restored),
        phase(&plains, |r| r.started),
        taken.keys
    );
    Ok(vec![done, etcd])
}

fn opt_s(x: Option<f64>) -> String {
    x.map(|x| format!("{x:.2}s")).unwrap_or_else(|| "?".into())
}

/// The latest moment any pod's `init` logged `message`, in seconds from `t0`.
fn last_pod_log(set: &Set, t0: SystemTime, message: &str) -> Option<f64> {
    let mut last: Option<f64> = None;
    for o in PODS {
        let t = log_time(&set.read_logs(o, "init"), message)?;
        let s = secs_since(t0, t);
        last = Some(last.map_or(s, |l: f64| l.max(s)));
    }
    last
}

async fn agent_restore(env: &Env, tools: &Tools, store: &Store, taken: &Taken) -> Result<Restore> {
    let mut set = env.set(Kind::Agent, 3).await?;
    let mut args = backup_args(tools, store, &set.root().join("scratch"));
    args.push("--restore=latest".into());
    set.extra_args = args;
    let r = agent_restore_in(&mut set, taken).await;
    finish(&mut set, r).await
}

async fn agent_restore_in(set: &mut Set, taken: &Taken) -> Result<Restore> {
    set.publish(&PODS).await?;
    let t0 = Instant::now();
    let t0_wall = SystemTime::now();
    for o in PODS {
        set.start(o)?;
    }
    let (mut done, mut etcd) = (None, None);
    while done.is_none() || etcd.is_none() {
        if done.is_none() && set.all_ready(&PODS).await && voters(set).await == Some(3) {
            done = Some(t0.elapsed().as_secs_f64());
        }
        if etcd.is_none() && set.all_linearizable(&PODS, 3).await {
            etcd = Some(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > TIMEOUT {
            bail!("the agent's restore not done after {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Each pod restored the snapshot, or (a pod whose round came after the others had
    // formed from it) joined that restored cluster as the member its formation listed, the
    // data then coming from its peers: both name the snapshot; at least one restored it,
    // and every pod holds every key (verify).
    let mut restored = 0;
    for o in PODS {
        let init = set.read_logs(o, "init");
        if !init.contains(&taken.name) {
            bail!(
                "pod {o} neither restored {} nor joined the cluster formed from it",
                taken.name
            );
        }
        restored += usize::from(init.contains("restored from a backup"));
    }
    if restored == 0 {
        bail!("no pod says it restored {}", taken.name);
    }
    verify(set, taken.keys).await?;
    Ok(Restore {
        done: done.unwrap_or_default(),
        etcd: etcd.unwrap_or_default(),
        fetched: last_pod_log(set, t0_wall, "formation marker written"),
        restored: last_pod_log(set, t0_wall, "this member is restored from a backup"),
        started: last_pod_log(set, t0_wall, "exec etcd"),
    })
}

/// The number of voters (named, not learners) pod 0 lists.
async fn voters(set: &Set) -> Option<usize> {
    let ms = set.members(0).await.ok()?;
    Some(
        ms.iter()
            .filter(|m| !m.is_learner() && !m.name().is_empty())
            .count(),
    )
}

async fn plain_restore(env: &Env, tools: &Tools, taken: &Taken) -> Result<Restore> {
    let mut set = env.set(Kind::Plain, 3).await?;
    let r = plain_restore_in(&mut set, tools, taken).await;
    finish(&mut set, r).await
}

async fn plain_restore_in(set: &mut Set, tools: &Tools, taken: &Taken) -> Result<Restore> {
    set.publish(&PODS).await?;
    let cluster: Vec<String> = PODS
        .iter()
        .map(|p| format!("{}={}", set.member_name(*p), set.peer_url(*p)))
        .collect();
    let cluster = cluster.join(",");
    let token = format!("restored-by-hand-{}", set.net);
    let snapshot = taken.plain.clone();
    let t0 = Instant::now();
    // Each pod by hand, all three at once, as three people (or one script per node) would.
    let mut pods = JoinSet::new();
    for o in PODS {
        let copy = set.root().join(format!("pod-{o}/snapshot.db"));
        let data = set.data_dir(o).to_path_buf();
        let (name, peer) = (set.member_name(o), set.peer_url(o));
        let (snapshot, cluster, token) = (snapshot.clone(), cluster.clone(), token.clone());
        let etcdutl = tools.etcdutl.clone();
        // etcdutl resolves the peer URLs: in the pod's namespace, with its DNS, as init.
        let resolv = set.root().join("resolv.conf");
        pods.spawn(async move {
            let cp = Path::new("cp");
            let mut c = Command::new(cp);
            c.arg(&snapshot).arg(&copy);
            step(c, cp).await?;
            let fetched = t0.elapsed().as_secs_f64();
            let mut r = harness::procs::in_pod_namespace(&resolv, &etcdutl);
            r.args(["snapshot", "restore"])
                .arg(&copy)
                .args(["--name", &name, "--initial-cluster", &cluster])
                .args(["--initial-cluster-token", &token])
                .args(["--initial-advertise-peer-urls", &peer])
                .arg("--data-dir")
                .arg(&data);
            step(r, &etcdutl).await?;
            anyhow::Ok((o, fetched, t0.elapsed().as_secs_f64()))
        });
    }
    let (mut fetched, mut restored, mut started) = (0.0f64, 0.0f64, 0.0f64);
    while let Some(r) = pods.join_next().await {
        let (o, f, r) = r.context("a by-hand restore task panicked")??;
        set.start_plain(o, &PlainStart::New)?;
        fetched = fetched.max(f);
        restored = restored.max(r);
        started = started.max(t0.elapsed().as_secs_f64());
    }
    let done = loop {
        if set.all_linearizable(&PODS, 3).await {
            break t0.elapsed().as_secs_f64();
        }
        if t0.elapsed() > TIMEOUT {
            bail!("the by-hand restore not done after {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    verify(set, taken.keys).await?;
    Ok(Restore {
        done,
        etcd: done,
        fetched: Some(fetched),
        restored: Some(restored),
        started: Some(started),
    })
}

/// Every pod holds every key the snapshot holds.
async fn verify(set: &Set, keys: u64) -> Result<()> {
    for o in PODS {
        let n = set.count_keys_on(o, load::PREFIX).await?;
        if n != keys as i64 {
            bail!("restored pod {o} holds {n} keys, expected {keys}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_only_the_named_snapshot() {
        let store = Store::new().expect("store");
        std::fs::create_dir_all(store.snapshots()).expect("mkdir");
        for n in ["a", "b"] {
            for ext in ["db", "json"] {
                std::fs::write(store.snapshots().join(format!("{n}.{ext}")), n).expect("write");
            }
        }
        store.keep_only("b").expect("keep_only");
        let mut left: Vec<String> = std::fs::read_dir(store.snapshots())
            .expect("read")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["b.db", "b.json"]);
        assert!(store.url().starts_with("file:///"));
    }

    #[tokio::test]
    async fn a_measured_process_reports_its_peak_memory_and_output() {
        let sh = Path::new("sh");
        let mut c = Command::new(sh);
        // Holds ~8 MiB in a shell variable long enough to be seen.
        c.args([
            "-c",
            "x=$(head -c 8388608 /dev/zero | tr '\\0' a); sleep 0.2; echo ${#x}",
        ]);
        let m = measure(c, sh).await.expect("measure");
        assert_eq!(m.stdout.trim(), "8388608");
        assert!(m.peak_mib >= 8.0, "peak {} MiB", m.peak_mib);
        assert!(m.secs >= 0.2);
        let mut f = Command::new(sh);
        f.args(["-c", "echo broken >&2; exit 3"]);
        let e = measure(f, sh)
            .await
            .err()
            .expect("a failing process is an error");
        assert!(e.to_string().contains("broken"), "{e}");
    }
}
