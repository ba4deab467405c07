//! etcd's own offline tool, run as a child process: `etcdutl` (etcd 3.5 and later) or, for
//! etcd 3.4 which has no etcdutl, `etcdctl` with `ETCDCTL_API=3`. The tool is chosen by its
//! file name: a name containing `etcdctl` is run as etcdctl, anything else as etcdutl. Both
//! take the same `snapshot restore` and `snapshot status` arguments.
//!
//! One resolution ([`EtcdTool::resolve`]) serves init's restore, the sidecar's drill and the
//! `backup` command, so a drill that passes proves the restore that matters can run: the
//! tool beside `--etcd-bin` (the same release as the etcd it restores for), else on `PATH`;
//! `--etcdutl-bin` overrides both. [`EtcdTool::check`] runs it once at start and learns
//! whether its `snapshot restore` can move the revision forward (`--bump-revision`).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

/// Which of etcd's tools `bin` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    Etcdutl,
    /// etcd 3.4's etcdctl, run with `ETCDCTL_API=3`.
    Etcdctl,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTool {
    pub bin: PathBuf,
    pub kind: ToolKind,
    /// Where the resolution looked, in order (said when the tool does not run).
    pub looked: Vec<PathBuf>,
    /// `--restore-bump-revision`: how far a restore moves the revision forward (0: not at all).
    pub bump_revision: u64,
    /// Whether this tool's `snapshot restore` takes `--bump-revision` and
    /// `--mark-compacted` (etcdutl 3.5.x recent enough); learned by [`EtcdTool::check`].
    pub can_bump: bool,
    /// The tool's own `version` line, once checked.
    pub version: Option<String>,
}

/// What a restore with this tool does to the revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jump {
    /// `--bump-revision N --mark-compacted`: the restored revision is N above the
    /// snapshot's, and every older revision reads as compacted.
    By(u64),
    /// `--restore-bump-revision 0`: the revision goes back to the snapshot's.
    Off,
    /// Asked for, but this tool cannot: the revision goes back to the snapshot's.
    Unsupported,
}

/// What the log, `status` and docs/operations/backups.md say a restore without the jump needs.
pub const JUMP_NEEDS: &str = "an etcdutl 3.5.x whose snapshot restore has --bump-revision and --mark-compacted (the image ships etcdutl 3.5.30)";

#[derive(Debug, Error)]
pub enum ToolError {
    /// The program could not be started (not found, not executable).
    #[error("cannot run {bin:?}: {error}")]
    Spawn { bin: PathBuf, error: std::io::Error },
    #[error("{bin:?} {what} failed ({status}): {stderr}")]
    Failed {
        bin: PathBuf,
        what: &'static str,
        status: String,
        stderr: String,
    },
    #[error("{bin:?} snapshot status printed something unexpected: {detail}")]
    Output { bin: PathBuf, detail: String },
    #[error("{bin:?} {what} did not finish within {after:?}")]
    TimedOut {
        bin: PathBuf,
        what: &'static str,
        after: Duration,
    },
}

/// How long `version` and `snapshot restore --help` may take at start.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// The member a restored data directory belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberParams {
    pub name: String,
    /// `name=peer-url,…` of every initial member.
    pub initial_cluster: String,
    /// A fresh token for the restored cluster.
    pub token: String,
    pub peer_url: String,
}

/// What `snapshot status` reads from a snapshot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct SnapshotStatus {
    pub hash: u32,
    pub revision: i64,
    #[serde(rename = "totalKey")]
    pub total_key: u64,
    #[serde(rename = "totalSize")]
    pub total_size: u64,
}

impl EtcdTool {
    /// The tool at `bin`, its kind told by its file name; not checked, no revision jump.
    pub fn from_bin(bin: impl Into<PathBuf>) -> Self {
        let bin = bin.into();
        let kind = match bin.file_name().and_then(|n| n.to_str()) {
            Some(n) if n.contains("etcdctl") => ToolKind::Etcdctl,
            _ => ToolKind::Etcdutl,
        };
        EtcdTool {
            looked: vec![bin.clone()],
            bin,
            kind,
            bump_revision: 0,
            can_bump: false,
            version: None,
        }
    }

    /// The tool a restore or a drill runs: `--etcdutl-bin` when given (a bare name is looked
    /// up on `path`); otherwise `etcdutl`, else `etcdctl` (etcd 3.4), beside `etcd_bin`
    /// (found on `path` when it is a bare name), then `etcdutl`, else `etcdctl`, on `path`.
    /// When none is an executable file, the first name with every place looked: running it
    /// fails, and [`EtcdTool::check`] says where.
    pub fn resolve(etcdutl_bin: Option<&Path>, etcd_bin: &Path, path: Option<&OsStr>) -> Self {
        let dirs: Vec<PathBuf> = path
            .map(|p| std::env::split_paths(p).collect())
            .unwrap_or_default();
        let on_path = |name: &Path| dirs.iter().map(|d| d.join(name)).collect::<Vec<_>>();
        let (utl, ctl) = (Path::new("etcdutl"), Path::new("etcdctl"));
        let mut candidates = match etcdutl_bin {
            Some(b) if is_bare(b) => on_path(b),
            Some(b) => vec![b.to_path_buf()],
            None => {
                let etcd = if is_bare(etcd_bin) {
                    on_path(etcd_bin).into_iter().find(|p| executable(p))
                } else {
                    Some(etcd_bin.to_path_buf())
                };
                let beside = etcd
                    .as_deref()
                    .and_then(Path::parent)
                    .map(|d| vec![d.join(utl), d.join(ctl)])
                    .unwrap_or_default();
                [beside, on_path(utl), on_path(ctl)].concat()
            }
        };
        let mut seen = std::collections::HashSet::new();
        candidates.retain(|c| seen.insert(c.clone()));
        let bin = match candidates.iter().find(|p| executable(p)) {
            Some(found) => found.clone(),
            None => etcdutl_bin.unwrap_or(utl).to_path_buf(),
        };
        EtcdTool {
            looked: candidates,
            ..EtcdTool::from_bin(bin)
        }
    }

    /// Where the resolution looked, for a message: `a, b, c`.
    pub fn looked_at(&self) -> String {
        let places: Vec<String> = self
            .looked
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        if places.is_empty() {
            "nowhere (PATH is empty)".into()
        } else {
            places.join(", ")
        }
    }

    /// Runs the tool once (`version`, then `snapshot restore --help`, each within
    /// `timeout`) and returns it with its version and whether it can move a restore's
    /// revision forward. An error means restores and drills cannot run with it.
    pub async fn check(mut self, timeout: Duration) -> Result<Self, ToolError> {
        let mut c = self.command();
        c.arg("version");
        let out = self.run_within(c, "version", timeout).await?;
        self.version = String::from_utf8_lossy(&out)
            .lines()
            .next()
            .map(|l| l.trim().to_string());
        let mut c = self.command();
        c.args(["snapshot", "restore", "--help"]);
        let help = self
            .run_within(c, "snapshot restore --help", timeout)
            .await?;
        let help = String::from_utf8_lossy(&help);
        self.can_bump = help.contains("--bump-revision") && help.contains("--mark-compacted");
        Ok(self)
    }

    /// What a restore with this tool does to the revision.
    pub fn jump(&self) -> Jump {
        match (self.bump_revision, self.can_bump) {
            (0, _) => Jump::Off,
            (n, true) => Jump::By(n),
            (_, false) => Jump::Unsupported,
        }
    }

    fn command(&self) -> tokio::process::Command {
        // etcdctl and etcdutl read ETCDCTL_* / ETCDUTL_* variables as flags: nothing else
        // from the agent's environment is meant for them.
        let mut c = clean_command(&self.bin, std::env::var_os("PATH"));
        if self.kind == ToolKind::Etcdctl {
            c.env("ETCDCTL_API", "3");
        }
        c.kill_on_drop(true).stdin(std::process::Stdio::null());
        c
    }

    async fn run(
        &self,
        mut c: tokio::process::Command,
        what: &'static str,
    ) -> Result<Vec<u8>, ToolError> {
        let out = c.output().await.map_err(|error| ToolError::Spawn {
            bin: self.bin.clone(),
            error,
        })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stderr: String = stderr.trim().chars().rev().take(600).collect();
            return Err(ToolError::Failed {
                bin: self.bin.clone(),
                what,
                status: out.status.to_string(),
                stderr: stderr.chars().rev().collect(),
            });
        }
        Ok(out.stdout)
    }

    async fn run_within(
        &self,
        c: tokio::process::Command,
        what: &'static str,
        after: Duration,
    ) -> Result<Vec<u8>, ToolError> {
        tokio::time::timeout(after, self.run(c, what))
            .await
            .map_err(|_| ToolError::TimedOut {
                bin: self.bin.clone(),
                what,
                after,
            })?
    }

    /// `snapshot restore` of `snapshot` into `data_dir`, which must not exist or be empty,
    /// with `--bump-revision N --mark-compacted` when [`EtcdTool::jump`] says so.
    /// The tool checks etcd's SHA-256 trailer itself.
    pub async fn restore(
        &self,
        snapshot: &Path,
        member: &MemberParams,
        data_dir: &Path,
    ) -> Result<(), ToolError> {
        let mut c = self.restore_command(snapshot, member, data_dir);
        if let Jump::By(n) = self.jump() {
            c.arg("--bump-revision")
                .arg(n.to_string())
                .arg("--mark-compacted");
        }
        self.run(c, "snapshot restore").await.map(drop)
    }

    /// `snapshot restore --skip-hash-check` of a member's database file (a copy of
    /// `member/snap/db`, which has no SHA-256 trailer) into `data_dir`, keeping its
    /// revisions as they are (never a jump: its hash is compared at its own revision).
    pub async fn restore_db_file(
        &self,
        db: &Path,
        member: &MemberParams,
        data_dir: &Path,
    ) -> Result<(), ToolError> {
        let mut c = self.restore_command(db, member, data_dir);
        c.arg("--skip-hash-check");
        self.run(c, "snapshot restore").await.map(drop)
    }

    fn restore_command(
        &self,
        snapshot: &Path,
        member: &MemberParams,
        data_dir: &Path,
    ) -> tokio::process::Command {
        let mut c = self.command();
        c.arg("snapshot")
            .arg("restore")
            .arg(snapshot)
            .arg("--name")
            .arg(&member.name)
            .arg("--initial-cluster")
            .arg(&member.initial_cluster)
            .arg("--initial-cluster-token")
            .arg(&member.token)
            .arg("--initial-advertise-peer-urls")
            .arg(&member.peer_url)
            .arg("--data-dir")
            .arg(data_dir);
        c
    }

    /// `snapshot status -w json`: revision, key count and hash of a snapshot file.
    pub async fn status(&self, snapshot: &Path) -> Result<SnapshotStatus, ToolError> {
        let mut c = self.command();
        c.arg("snapshot")
            .arg("status")
            .arg(snapshot)
            .arg("-w")
            .arg("json");
        let out = self.run(c, "snapshot status").await?;
        serde_json::from_slice(&out).map_err(|e| ToolError::Output {
            bin: self.bin.clone(),
            detail: format!("{e}: {}", String::from_utf8_lossy(&out).trim()),
        })
    }
}

fn is_bare(p: &Path) -> bool {
    p.components().count() == 1 && !p.is_absolute()
}

fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A command for one of etcd's programs with a clean environment but for `path` as its
/// `PATH` (the agent's). Without a PATH, a bare name such as the default `etcdutl` would be
/// looked up only in the C library's default path (/bin:/usr/bin), which misses the image's
/// /usr/local/bin: every restore would fail with "No such file or directory".
pub(crate) fn clean_command(bin: &Path, path: Option<OsString>) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(bin);
    c.env_clear();
    if let Some(path) = path {
        c.env("PATH", path);
    }
    c
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bare_tool_name_is_found_on_the_agents_path_in_a_clean_environment() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("etcdutl-on-path-only");
        std::fs::write(&tool, "#!/bin/sh\necho \"found, FOO=$FOO\"\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path =
            std::env::join_paths([dir.path(), Path::new("/usr/bin"), Path::new("/bin")]).unwrap();
        let out = clean_command(Path::new("etcdutl-on-path-only"), Some(path))
            .env("FOO", "set-here-only")
            .output()
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "found, FOO=set-here-only"
        );
        let missing = clean_command(Path::new("etcdutl-on-path-only"), None)
            .output()
            .await;
        assert!(
            missing.is_err(),
            "without a PATH the bare name is not found"
        );
    }

    #[test]
    fn the_tool_kind_follows_the_file_name() {
        assert_eq!(EtcdTool::from_bin("etcdutl").kind, ToolKind::Etcdutl);
        assert_eq!(
            EtcdTool::from_bin("/usr/local/bin/etcdutl").kind,
            ToolKind::Etcdutl
        );
        assert_eq!(
            EtcdTool::from_bin("/usr/bin/etcdctl").kind,
            ToolKind::Etcdctl
        );
        assert_eq!(EtcdTool::from_bin("etcdctl-3.4").kind, ToolKind::Etcdctl);
    }

    /// An executable file `name` in `dir`.
    fn tool_in(dir: &Path, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn the_tool_beside_etcd_bin_is_found_before_the_one_on_path() {
        let (etcd_dir, on_path) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let etcd = tool_in(etcd_dir.path(), "etcd");
        let beside = tool_in(etcd_dir.path(), "etcdutl");
        tool_in(on_path.path(), "etcdutl");
        let path = on_path.path().as_os_str();
        let t = EtcdTool::resolve(None, &etcd, Some(path));
        assert_eq!(t.bin, beside);
        assert_eq!(t.kind, ToolKind::Etcdutl);
        // A bare --etcd-bin is found on PATH first, and its directory searched.
        let t = EtcdTool::resolve(None, Path::new("etcd"), Some(etcd_dir.path().as_os_str()));
        assert_eq!(t.bin, beside);
    }

    #[test]
    fn etcd_3_4s_etcdctl_beside_etcd_bin_is_found_when_there_is_no_etcdutl() {
        let (etcd_dir, on_path) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let etcd = tool_in(etcd_dir.path(), "etcd");
        let ctl = tool_in(etcd_dir.path(), "etcdctl");
        let t = EtcdTool::resolve(None, &etcd, Some(on_path.path().as_os_str()));
        assert_eq!((t.bin, t.kind), (ctl, ToolKind::Etcdctl));
    }

    #[test]
    fn without_a_tool_beside_etcd_bin_the_one_on_path_is_used() {
        let (etcd_dir, a, b) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let etcd = tool_in(etcd_dir.path(), "etcd");
        tool_in(a.path(), "etcdctl");
        let utl = tool_in(b.path(), "etcdutl");
        let path = std::env::join_paths([a.path(), b.path()]).unwrap();
        // etcdutl anywhere on PATH comes before etcdctl.
        let t = EtcdTool::resolve(None, &etcd, Some(&path));
        assert_eq!(t.bin, utl);
    }

    #[test]
    fn etcdutl_bin_overrides_both_and_a_bare_name_is_looked_up_on_path() {
        let (etcd_dir, on_path, other) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let etcd = tool_in(etcd_dir.path(), "etcd");
        tool_in(etcd_dir.path(), "etcdutl");
        let mine = tool_in(other.path(), "my-etcdutl");
        let path = on_path.path().as_os_str();
        let t = EtcdTool::resolve(Some(&mine), &etcd, Some(path));
        assert_eq!(t.bin, mine);
        let named = tool_in(on_path.path(), "etcdctl-3.4");
        let t = EtcdTool::resolve(Some(Path::new("etcdctl-3.4")), &etcd, Some(path));
        assert_eq!((t.bin, t.kind), (named, ToolKind::Etcdctl));
    }

    #[tokio::test]
    async fn a_tool_found_nowhere_fails_its_check_and_says_where_it_looked() {
        let (etcd_dir, on_path) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let etcd = tool_in(etcd_dir.path(), "etcd");
        let t = EtcdTool::resolve(None, &etcd, Some(on_path.path().as_os_str()));
        assert_eq!(t.bin, Path::new("etcdutl"));
        let looked = t.looked_at();
        assert!(
            looked.contains(&etcd_dir.path().join("etcdutl").display().to_string()),
            "{looked}"
        );
        assert!(
            looked.contains(&on_path.path().join("etcdctl").display().to_string()),
            "{looked}"
        );
        let e = t.check(CHECK_TIMEOUT).await.unwrap_err();
        assert!(matches!(e, ToolError::Spawn { .. }), "{e}");
        // Said once: the error is not also its own source.
        assert!(std::error::Error::source(&e).is_none());
    }

    #[tokio::test]
    async fn the_check_learns_whether_the_tool_can_jump_the_revision() {
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, help: &str| {
            use std::os::unix::fs::PermissionsExt;
            let p = dir.path().join(name);
            let body = format!(
                "#!/bin/sh\nif [ \"$1\" = version ]; then echo \"etcdutl version: 3.5.x\"; else echo \"{help}\"; fi\n"
            );
            std::fs::write(&p, body).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            EtcdTool {
                bump_revision: 1000,
                ..EtcdTool::from_bin(p)
            }
        };
        let new = script("etcdutl-new", "--bump-revision uint --mark-compacted")
            .check(CHECK_TIMEOUT)
            .await
            .unwrap();
        assert_eq!(new.version.as_deref(), Some("etcdutl version: 3.5.x"));
        assert_eq!(new.jump(), Jump::By(1000));
        let old = script("etcdutl-old", "--data-dir string")
            .check(CHECK_TIMEOUT)
            .await
            .unwrap();
        assert_eq!(old.jump(), Jump::Unsupported);
        let off = EtcdTool {
            bump_revision: 0,
            ..new
        };
        assert_eq!(off.jump(), Jump::Off);
    }

    #[tokio::test]
    async fn a_tool_that_hangs_fails_its_check_within_the_timeout() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("etcdutl");
        std::fs::write(&p, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = EtcdTool::from_bin(p)
            .check(Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(e, ToolError::TimedOut { .. }), "{e}");
    }

    #[test]
    fn snapshot_status_json_parses() {
        let s: SnapshotStatus = serde_json::from_str(
            r#"{"hash":3838250470,"revision":12,"totalKey":11,"totalSize":20480}"#,
        )
        .unwrap();
        assert_eq!(s.revision, 12);
        assert_eq!(s.total_key, 11);
    }
}
