//! What one run of `etcd-steward backup` did, as the schedule runners (chaos and disaster) record it.

/// What one run of `etcd-steward backup` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupTaken {
    /// Through which pod.
    pub pod: u32,
    /// Taken after everything was healed (it must succeed), not during the faults.
    pub after_healing: bool,
    /// It exited 0.
    pub exited_ok: bool,
    /// The manifest it printed says the snapshot verified (etcd's SHA-256 trailer matched).
    pub verified: bool,
    /// The cluster ID of the manifest.
    pub cluster: Option<u64>,
    /// Its error output (last line), when it failed.
    pub error: String,
}

impl BackupTaken {
    /// From what `etcd-steward backup` printed: whether it exited 0, its standard output
    /// (the manifest, a JSON line) and error output.
    pub fn from_parts(
        pod: u32,
        after_healing: bool,
        exited_ok: bool,
        stdout: &str,
        stderr: &str,
    ) -> Self {
        let manifest: Option<serde_json::Value> = stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok());
        BackupTaken {
            pod,
            after_healing,
            exited_ok,
            verified: manifest
                .as_ref()
                .and_then(|m| m["verified"].as_bool())
                .unwrap_or(false),
            cluster: manifest
                .as_ref()
                .and_then(|m| m["cluster_id"].as_str())
                .and_then(|c| u64::from_str_radix(c, 16).ok()),
            error: stderr.lines().last().unwrap_or_default().to_string(),
        }
    }

    /// From the process's output, `None` when it did not end within its time-out.
    pub(crate) fn from_output(
        pod: u32,
        after_healing: bool,
        out: Option<std::process::Output>,
    ) -> Self {
        match out {
            Some(out) => BackupTaken::from_parts(
                pod,
                after_healing,
                out.status.success(),
                &String::from_utf8_lossy(&out.stdout),
                &String::from_utf8_lossy(&out.stderr),
            ),
            None => BackupTaken {
                pod,
                after_healing,
                exited_ok: false,
                verified: false,
                cluster: None,
                error: "did not end within its time-out".into(),
            },
        }
    }
}
