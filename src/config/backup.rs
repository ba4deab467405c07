//! Backups: `BackupArgs` into a [`BackupConfig`](crate::backup::BackupConfig), the store
//! and keys checked at start.

use std::path::Path;
use std::time::Duration;

use super::parse::duration_at_least;
use super::BackupArgs;

impl BackupArgs {
    /// The typed backup options, or `None` without `--backup-url`; adds every broken
    /// constraint to `problems`. `etcd_bin` is where the restore tool is looked for first.
    pub fn validate(
        &self,
        etcd_bin: &Path,
        problems: &mut Vec<String>,
    ) -> Option<crate::backup::BackupConfig> {
        use crate::backup::{BackupConfig, EtcdTool, RestoreChoice};
        let before = problems.len();
        let url = self.backup_url.as_deref().filter(|u| !u.is_empty());
        if let Some(u) = url {
            if let Err(why) = crate::backup::store::check_url(u) {
                problems.push(format!("--backup-url {u:?}: {why}"));
            }
        }
        let interval = duration_at_least(
            "backup-interval",
            &self.backup_interval,
            Duration::from_secs(1),
            "30m",
            problems,
        )
        .unwrap_or_default();
        // `0` (or `0s`) turns archiving off; otherwise at least a second.
        let archive_interval = match self.archive_interval.trim() {
            "0" | "0s" => None,
            value => duration_at_least(
                "archive-interval",
                value,
                Duration::from_secs(1),
                "5s (or 0 to turn archiving off)",
                problems,
            ),
        };
        let keep = match self.backup_keep.parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => {
                problems.push(format!(
                    "--backup-keep must be a whole number of at least 1, got {:?}",
                    self.backup_keep
                ));
                0
            }
        };
        // Below i64::MAX with room: etcd's revisions are signed 64-bit.
        let bump_revision = match self.restore_bump_revision.parse::<u64>() {
            Ok(n) if n <= 1 << 62 => n,
            _ => {
                problems.push(format!(
                    "--restore-bump-revision must be a whole number from 0 to 2^62, got {:?}",
                    self.restore_bump_revision
                ));
                0
            }
        };
        if self.backup_scratch_dir.is_relative() {
            problems.push(format!(
                "--backup-scratch-dir must be an absolute path, got {:?}",
                self.backup_scratch_dir
            ));
        }
        let restore = match self.restore.as_deref() {
            None | Some("latest") => RestoreChoice::Latest,
            Some("never") => RestoreChoice::Never,
            Some(r) if r.starts_with("revision:") => match r["revision:".len()..].parse::<i64>() {
                Ok(n) if n >= 1 => RestoreChoice::Revision(n),
                _ => {
                    problems.push(format!(
                        "--restore revision:N needs a revision of at least 1, got {r:?}"
                    ));
                    RestoreChoice::Never
                }
            },
            Some(r) if r.starts_with("time:") => {
                match crate::units::parse_moment(&r["time:".len()..]) {
                    Ok(ms) => RestoreChoice::Time(ms),
                    Err(why) => {
                        problems.push(format!("--restore time:T {why}"));
                        RestoreChoice::Never
                    }
                }
            }
            Some(name)
                if !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) =>
            {
                RestoreChoice::Named(name.to_string())
            }
            Some(other) => {
                problems.push(format!(
                    "--restore must be latest, never, revision:N, time:RFC3339 or a snapshot name, got {other:?}"
                ));
                RestoreChoice::Never
            }
        };
        let compression = crate::backup::compress::Compression::parse(&self.backup_compression)
            .unwrap_or_else(|| {
                problems.push(format!(
                    "--backup-compression must be zstd or none, got {:?}",
                    self.backup_compression
                ));
                crate::backup::compress::Compression::default()
            });
        let mut keys = crate::backup::crypt::Keys::default();
        if let Some(path) = &self.backup_encryption_key_file {
            match crate::backup::crypt::Key::load(path) {
                Ok(k) => keys.write = Some(k),
                Err(e) => problems.push(e.to_string()),
            }
        }
        for path in &self.backup_decryption_key_file {
            match crate::backup::crypt::Key::load(path) {
                Ok(k) => keys.read.push(k),
                Err(e) => problems.push(e.to_string()),
            }
        }
        if url.is_none() {
            if !keys.is_empty() {
                problems.push(
                    "--backup-encryption-key-file and --backup-decryption-key-file need --backup-url"
                        .into(),
                );
            }
            if let Some(r) = self.restore.as_deref().filter(|r| *r != "never") {
                problems.push(format!(
                    "--restore {r:?} needs --backup-url (where the snapshots are)"
                ));
            }
            return None;
        }
        if problems.len() > before {
            return None;
        }
        Some(BackupConfig {
            url: url.unwrap_or_default().to_string(),
            interval,
            archive_interval,
            keep,
            tool: EtcdTool {
                bump_revision,
                ..EtcdTool::resolve(
                    self.etcdutl_bin.as_deref(),
                    etcd_bin,
                    std::env::var_os("PATH").as_deref(),
                )
            },
            scratch_dir: self.backup_scratch_dir.clone(),
            restore,
            keys,
            compression,
        })
    }
}
