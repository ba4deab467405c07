//! A loopback set formed with backups configured, as the backup, archive, restore and RPO
//! scenarios need it: every pod's options name the store, etcd's offline tool, a scratch
//! directory of its own for the drills, and the revision jump the tool allows; the drills'
//! throw-away etcds are stopped when the set goes (the harness SIGKILLs sidecars, and a
//! drill's etcd would outlive its sidecar, holding the test lock's inherited descriptor).

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::Set;
use crate::{wait_for, Etcd, Result};

/// Where a set's pods back up to, and with which options.
#[derive(Debug, Clone)]
pub struct Backups {
    /// `--backup-url`.
    pub url: String,
    /// More options for the pods (intervals, keys, `--restore`, …).
    pub args: Vec<String>,
    /// Whether `init` gets the options too, at every start (it restores with them), or
    /// only each sidecar's first start (it backs up; a pod started again later gets the
    /// set's common options alone).
    pub init_too: bool,
}

impl Backups {
    /// Into the store at `url`, for `init` and the sidecars.
    pub fn at(url: impl Into<String>) -> Self {
        Backups {
            url: url.into(),
            args: Vec::new(),
            init_too: true,
        }
    }

    /// Into a `file://` store in `dir`.
    pub fn file(dir: &Path) -> Self {
        Self::at(format!("file://{}", dir.display()))
    }

    /// With more options.
    pub fn with<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Only the sidecars get the options.
    pub fn sidecars_only(mut self) -> Self {
        self.init_too = false;
        self
    }

    /// Whether an option `--name…` is given.
    pub fn has(&self, name: &str) -> bool {
        self.args.iter().any(|a| a.starts_with(name))
    }

    /// The options a pod of a set rooted at `root`, running `etcd`, gets.
    pub fn options(&self, root: &Path, etcd: Etcd) -> Vec<String> {
        let mut args = vec![format!("--backup-url={}", self.url)];
        args.extend(self.args.iter().cloned());
        args.extend([
            format!("--etcdutl-bin={}", etcd.offline_tool().display()),
            format!(
                "--backup-scratch-dir={}/scratch-{{ordinal}}",
                root.display()
            ),
        ]);
        args.extend(crate::etcd::jump_args(&etcd.offline_tool()));
        args
    }
}

/// Stops the drills' throw-away etcds of a set (by process ID) when dropped, after the
/// set's own clean-up.
#[derive(Debug)]
pub struct DrillReaper(Option<PathBuf>);

impl DrillReaper {
    /// For the set rooted at `root`.
    pub fn new(root: &Path) -> Self {
        DrillReaper(Some(root.to_path_buf()))
    }

    /// Kills the drills' etcds now (killing a sidecar leaves its drill's etcd running).
    pub fn reap(&self) {
        let Some(root) = &self.0 else { return };
        let pattern = format!("data-dir={}/scratch-", root.display());
        let Ok(out) = Command::new("pgrep").args(["-f", &pattern]).output() else {
            return;
        };
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
}

impl Drop for DrillReaper {
    fn drop(&mut self) {
        self.reap();
    }
}

/// A set whose pods back up; derefs to its [`Set`]. Dropped, the set goes first, then the
/// drills' etcds.
pub struct BackedSet {
    set: Set,
    reaper: DrillReaper,
}

impl BackedSet {
    /// Forms `replicas` pods of `steward` and `etcd` with `backups`, and waits (up to
    /// `timeout`) until every one is ready as a voter.
    pub async fn form(
        steward: &str,
        etcd: Etcd,
        replicas: u32,
        backups: &Backups,
        timeout: Duration,
    ) -> Result<BackedSet> {
        let mut set = Set::new(steward, etcd, replicas).await?;
        let reaper = DrillReaper::new(set.root());
        let options = backups.options(set.root(), etcd);
        if backups.init_too {
            set.extra_args.extend(options);
            set.start_all(timeout).await?;
        } else {
            let pods: Vec<u32> = (0..replicas).collect();
            for &o in &pods {
                set.set_dns(o, true)?;
                let common = set.extra_args.clone();
                set.extra_args.extend(options.iter().cloned());
                set.start_sidecar(o)?;
                set.extra_args = common;
                set.start_init(o)?;
            }
            set.wait_ready(&pods, replicas as usize, timeout).await?;
        }
        Ok(BackedSet { set, reaper })
    }

    /// Kills the drills' throw-away etcds now (as dropping the set does).
    pub fn reap_drills(&self) {
        self.reaper.reap();
    }
}

impl Deref for BackedSet {
    type Target = Set;

    fn deref(&self) -> &Set {
        &self.set
    }
}

impl DerefMut for BackedSet {
    fn deref_mut(&mut self) -> &mut Set {
        &mut self.set
    }
}

/// Waits (up to `timeout`) until the `file://` store in `dir` holds a snapshot's manifest:
/// from then on, every write is the archive's.
pub async fn first_snapshot(dir: &Path, timeout: Duration) {
    wait_for(timeout, "the leader's sidecar's first snapshot", || async {
        std::fs::read_dir(dir.join("snapshots")).is_ok_and(|d| {
            d.filter_map(std::result::Result::ok)
                .any(|e| e.path().extension().is_some_and(|x| x == "json"))
        })
    })
    .await;
}
