//! etcd's own offline tool, run as a child process: `etcdutl` (etcd 3.5 and later) or, for
//! etcd 3.4 which has no etcdutl, `etcdctl` with `ETCDCTL_API=3`. The tool is chosen by the
//! file name given to `--etcdutl-bin`: a name containing `etcdctl` is run as etcdctl,
//! anything else as etcdutl. Both take the same `snapshot restore` and `snapshot status`
//! arguments.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

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
}

#[derive(Debug, Error)]
pub enum ToolError {
    #[error("cannot run {bin:?}: {source}")]
    Spawn {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("{bin:?} {what} failed ({status}): {stderr}")]
    Failed {
        bin: PathBuf,
        what: &'static str,
        status: String,
        stderr: String,
    },
    #[error("{bin:?} snapshot status printed something unexpected: {detail}")]
    Output { bin: PathBuf, detail: String },
}

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
    /// The tool at `bin`, its kind told by its file name.
    pub fn from_bin(bin: impl Into<PathBuf>) -> Self {
        let bin = bin.into();
        let kind = match bin.file_name().and_then(|n| n.to_str()) {
            Some(n) if n.contains("etcdctl") => ToolKind::Etcdctl,
            _ => ToolKind::Etcdutl,
        };
        EtcdTool { bin, kind }
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
        let out = c.output().await.map_err(|source| ToolError::Spawn {
            bin: self.bin.clone(),
            source,
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

    /// `snapshot restore` of `snapshot` into `data_dir`, which must not exist or be empty.
    /// The tool checks etcd's SHA-256 trailer itself.
    pub async fn restore(
        &self,
        snapshot: &Path,
        member: &MemberParams,
        data_dir: &Path,
    ) -> Result<(), ToolError> {
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
        self.run(c, "snapshot restore").await.map(drop)
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
