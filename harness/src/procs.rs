//! The processes the harness starts: each is remembered so an interrupted run (Ctrl-C)
//! can end them, and only them.

use std::path::Path;
use std::process::Stdio;
use std::sync::Mutex;

use tokio::process::{Child, Command};

use crate::{Error, Result};

/// Every process the harness started in this process's lifetime.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Spawns `cmd` (killed when its handle drops) and remembers its pid.
pub fn spawn(mut cmd: Command, program: &Path) -> Result<Child> {
    let child = cmd
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| Error::Spawn {
            program: program.to_path_buf(),
            source,
        })?;
    if let (Some(pid), Ok(mut all)) = (child.id(), CHILDREN.lock()) {
        all.push(pid);
    }
    Ok(child)
}

/// A command for `program` run in a private mount namespace whose /etc/resolv.conf is
/// `resolv`: what a pod's etcd container sees (its own cluster DNS).
pub fn in_pod_namespace(resolv: &Path, program: &Path) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
    ])
    .arg(resolv)
    .arg(program);
    cmd
}

/// SIGKILLs every process the harness started that may still run (on Ctrl-C).
pub fn kill_all_children() {
    if let Ok(all) = CHILDREN.lock() {
        for pid in all.iter() {
            let _ = std::process::Command::new("kill")
                .args(["-s", "KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Sends a signal (`STOP`, `CONT`, `HUP`, `KILL`, …) to one process.
pub fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .status()
        .map_err(Error::io(format!("kill -s {sig} {pid}")))?;
    if !status.success() {
        return Err(Error::Failed(format!("kill -s {sig} {pid} failed")));
    }
    Ok(())
}
