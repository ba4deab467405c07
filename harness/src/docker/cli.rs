//! The `docker` command, and what a run creates and removes with it: networks, labels, the
//! sweep of dead runs.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::process::Command;

use super::ETCD_3_4_IN_POD;
use crate::Etcd;

// ---- docker CLI ------------------------------------------------------------------------

/// Runs `docker ARGS`; its trimmed stdout, or an error naming the command and its stderr.
pub async fn docker(args: &[&str]) -> Result<String, String> {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run docker {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "docker {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `docker ARGS`, panicking on failure.
pub async fn must(args: &[&str]) -> String {
    docker(args).await.unwrap_or_else(|e| panic!("{e}"))
}

/// `docker ARGS` from a synchronous context (Drop); stdout+stderr, errors ignored.
pub(super) fn docker_sync(args: &[&str]) -> String {
    match std::process::Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => format!("cannot run docker: {e}"),
    }
}

// ---- etcd versions ---------------------------------------------------------------------

/// `-v` options that put the host's etcd 3.4 and its shared libraries into a pod.
pub(super) async fn etcd_3_4_mounts() -> Vec<String> {
    let bin = Etcd::V3_4.bin().display().to_string();
    let out = Command::new("ldd")
        .arg(&bin)
        .output()
        .await
        .unwrap_or_else(|e| panic!("ldd must be installed: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut mounts = vec![format!("{bin}:{ETCD_3_4_IN_POD}:ro")];
    if text.contains("not a dynamic executable") || !out.status.success() {
        return mounts;
    }
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux….so.2 (0x…)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            mounts.push(format!("{p}:{p}:ro"));
        }
    }
    mounts
}

// ---- the cluster -----------------------------------------------------------------------

static NEXT_SUBNET: AtomicU32 = AtomicU32::new(0);

/// A /24 under 10.213.0.0/16 not used by another Docker network: the third octet.
pub(super) async fn create_network(name: &str, run: &str) -> u8 {
    let _ = docker(&["network", "rm", name]).await;
    let base = std::process::id();
    let mut last = String::new();
    for _ in 0..256 {
        let n = ((base.wrapping_mul(7) + NEXT_SUBNET.fetch_add(1, Ordering::SeqCst)) % 250) as u8;
        let subnet = format!("10.213.{n}.0/24");
        match docker(&[
            "network",
            "create",
            "--driver",
            "bridge",
            "--subnet",
            &subnet,
            "--label",
            &format!("esf.run={run}"),
            "--label",
            &host_label(),
            name,
        ])
        .await
        {
            Ok(_) => return n,
            Err(e) if e.contains("overlap") => last = e,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("no free 10.213.N.0/24 for network {name}: {last}");
}
/// The labels on everything a run creates: the run, and the host whose process made it.
pub(super) fn labels(run: &str) -> Vec<String> {
    vec![
        "--label".into(),
        format!("esf.run={run}"),
        "--label".into(),
        host_label(),
    ]
}

fn host_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("esf.host={}", host.trim())
}

/// Removes what earlier runs on this host left behind when their process was killed
/// before `Drop` could run (a CI time-out): runs `esf-<pid>-…` whose pid is gone.
pub(super) fn sweep_dead_runs() {
    let filter = format!("label={}", host_label());
    let mut runs = BTreeSet::new();
    for list in [
        vec!["ps", "-a"],
        vec!["network", "ls"],
        vec!["volume", "ls"],
    ] {
        let mut args = list;
        args.extend(["--filter", &filter, "--format", "{{.Label \"esf.run\"}}"]);
        for run in docker_sync(&args).lines() {
            runs.insert(run.trim().to_string());
        }
    }
    for run in runs {
        let pid = run
            .strip_prefix("esf-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != std::process::id() && !alive(pid) {
                log(&run, "left behind by a dead test process: removing it");
                cleanup_sync(&run);
            }
        }
    }
}

/// Whether a process exists on this host (a zombie does not count).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S …": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Removes every container, network and volume labelled `esf.run=<run>`.
pub(super) fn cleanup_sync(run: &str) {
    let label = format!("label=esf.run={run}");
    let ids = docker_sync(&["ps", "-aq", "--filter", &label]);
    let ids: Vec<&str> = ids.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f", "-v"];
        args.extend(ids);
        docker_sync(&args);
    }
    for kind in ["network", "volume"] {
        let names = docker_sync(&[kind, "ls", "-q", "--filter", &label]);
        let names: Vec<&str> = names.split_whitespace().collect();
        if !names.is_empty() {
            let mut args = vec![kind, "rm"];
            args.extend(names);
            docker_sync(&args);
        }
    }
}

pub(super) fn log(run: &str, what: &str) {
    let _ = writeln!(std::io::stderr(), "[{run}] {what}");
}
