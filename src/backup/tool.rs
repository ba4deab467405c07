//! etcd's own offline tool, run as a child process: `etcdutl` (etcd 3.5 and later) or, for
//! etcd 3.4 which has no etcdutl, `etcdctl` with `ETCDCTL_API=3`. The tool is chosen by the
//! file name given to `--etcdutl-bin`: a name containing `etcdctl` is run as etcdctl,
//! anything else as etcdutl. Both take the same `snapshot restore` and `snapshot status`
//! arguments.

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
        // A clean environment: etcdctl and etcdutl read ETCDCTL_* / ETCDUTL_* variables as
        // flags; nothing from the agent's environment is meant for them.
        let mut c = tokio::process::Command::new(&self.bin);
        c.env_clear();
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
