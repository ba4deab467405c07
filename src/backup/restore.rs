//! Restoring a snapshot into an empty data directory: pick a usable snapshot, download it
//! to a local file checking both its manifest's SHA-256 and etcd's own trailer, run etcd's
//! `snapshot restore` into a staging directory inside the data directory, then move the
//! result into place — `member/snap` first, `member/wal` last. The WAL's arrival is the
//! commit point: before it the volume is still empty to etcd and to `init`.
//!
//! Never over data: a data directory that holds a `*.wal` is refused. Every step can be
//! killed and re-run: the staging directory is the agent's own and is redone or finished;
//! anything else found in the way is renamed aside, never deleted.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::catalog;
use super::compress;
use super::crypt;
use super::fetch;
use super::manifest::Manifest;
use super::store::{Store, StoreError};
use super::tool::{EtcdTool, MemberParams, ToolError};
use super::RestoreChoice;

#[derive(Debug, Error)]
pub enum RestoreError {
    /// The data directory holds a WAL: a restore never writes over data.
    #[error("{path:?} already holds etcd data (a WAL): a restore never writes over data")]
    HasData { path: PathBuf },
    #[error("snapshot {name} fails its checksum: {detail}")]
    Checksum { name: String, detail: String },
    /// Encrypted, and no configured key opens it (or its ciphertext was tampered with).
    #[error(transparent)]
    Decrypt(crypt::CryptError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// etcd's tool cannot run, or refuses the snapshot: the same again at every try.
    #[error("restoring snapshot {name}: {error}")]
    Tool { name: String, error: ToolError },
    #[error("restore: {op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<fetch::FetchError> for RestoreError {
    fn from(e: fetch::FetchError) -> Self {
        match e {
            fetch::FetchError::Store(e) => RestoreError::Store(e),
            fetch::FetchError::Io { op, path, source } => RestoreError::Io { op, path, source },
        }
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RestoreError + 'a {
    move |source| RestoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The staging directory a restore works in, inside the data directory (same file
/// system, so the final moves are renames), beside init's formation marker.
pub fn staging_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("member").join("steward").join("restore")
}

/// Does `data_dir` hold a WAL (what "has data" means to etcd and to init)?
pub fn has_wal(data_dir: &Path) -> Result<bool, RestoreError> {
    let wal = data_dir.join("member").join("wal");
    match std::fs::read_dir(&wal) {
        Ok(entries) => {
            for e in entries {
                let e = e.map_err(io("read", &wal))?;
                if e.file_name().to_string_lossy().ends_with(".wal") {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io("read", &wal)(e)),
    }
}

/// Downloads snapshot `m` to `dest`, streaming, and checks it: the SHA-256 of the whole
/// stored object against the manifest, and etcd's trailer against the database (after
/// decryption and decompression, when the manifest says the object is encrypted or
/// compressed). `dest` appears only once both match (written as `dest.partial` first).
pub async fn fetch_verified(store: &Store, m: &Manifest, dest: &Path) -> Result<(), RestoreError> {
    let checksum = |detail: String| RestoreError::Checksum {
        name: m.name.clone(),
        detail,
    };
    if let Some(other) = m.compression.as_deref().filter(|c| *c != compress::ZSTD) {
        return Err(checksum(format!(
            "it is compressed with {other:?}, which this version cannot read (only {:?})",
            compress::ZSTD
        )));
    }
    let partial = dest.with_extension("partial");
    let fetched = match fetch::download(store, m, &partial).await {
        Ok(f) => f,
        Err(e) => {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(e.into());
        }
    };
    let refused = match (&fetched.stored, fetched.plain) {
        (Some(stored), _) if stored.sha256 != m.sha256 || stored.size != m.size => {
            Some(checksum(format!(
                "the stored object ({} bytes, SHA-256 {}) differs from its manifest ({} bytes, SHA-256 {})",
                stored.size, stored.sha256, m.size, m.sha256
            )))
        }
        (_, Err(fetch::Undecodable::Decrypt(e))) => Some(RestoreError::Decrypt(e)),
        (_, Err(fetch::Undecodable::Decompress(e))) => Some(checksum(format!(
            "the stored object is not the zstd stream its manifest says: {e}"
        ))),
        (_, Ok(Err(detail))) => Some(checksum(detail)),
        (_, Ok(Ok(()))) => None,
    };
    if let Some(e) = refused {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(e);
    }
    if m.encryption.is_none() && !store.keys().is_empty() {
        tracing::warn!(snapshot = %m.name, "snapshot is not encrypted although encryption keys are configured; restoring it as it is");
    }
    tokio::fs::rename(&partial, dest)
        .await
        .map_err(io("rename", dest))?;
    verified().insert(dest.to_path_buf());
    Ok(())
}

/// The files [`fetch_verified`] wrote and checked in this process. They are not synced
/// to disk: a crash can leave one torn under its final name, so a file found there by a
/// later process is not trusted (it is downloaded again).
fn verified() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<PathBuf>> {
    static VERIFIED: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    VERIFIED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Was `path` downloaded and checked by [`fetch_verified`] in this process (and is it
/// still there)?
pub fn verified_here(path: &Path) -> bool {
    verified().contains(path) && path.exists()
}

/// Which snapshot to restore, once looked for.
#[derive(Debug)]
pub enum Pick {
    /// Downloaded and verified to `file`.
    Chosen {
        manifest: Box<Manifest>,
        file: PathBuf,
    },
    /// The store holds no backups at all.
    NoBackups,
    /// Backups exist, but none is usable (each with why): wait, never form an empty cluster.
    NoneUsable { skipped: Vec<(String, String)> },
    /// `--restore never`.
    Disabled,
}

/// Finds the snapshot `choice` names and downloads it into `dir`: `Latest` is the newest
/// verified snapshot whose download passes both checksums, skipping (with a log line)
/// every one that does not. A store that cannot be read is an error (try again later).
pub async fn pick(store: &Store, choice: &RestoreChoice, dir: &Path) -> Result<Pick, RestoreError> {
    let wanted = match choice {
        RestoreChoice::Never => return Ok(Pick::Disabled),
        RestoreChoice::Latest => None,
        RestoreChoice::Named(n) => Some(n.as_str()),
        // A moment needs the archive: init's formation restores it (a restore point).
        RestoreChoice::Revision(_) | RestoreChoice::Time(_) => None,
    };
    let manifests = catalog::list(store).await?;
    if manifests.is_empty() {
        return Ok(Pick::NoBackups);
    }
    create_private_dir(dir)?;
    let mut skipped = Vec::new();
    let candidates = manifests
        .into_iter()
        .filter(|m| wanted.is_none_or(|w| w == m.name));
    for m in candidates {
        if !m.verified {
            let why = format!(
                "not verified when taken: {}",
                m.unverified_reason
                    .as_deref()
                    .unwrap_or("no reason recorded")
            );
            tracing::warn!(snapshot = %m.name, reason = %why, "snapshot skipped for restore");
            skipped.push((m.name.clone(), why));
            continue;
        }
        let file = dir.join(format!("{}.db", m.name));
        match fetch_verified(store, &m, &file).await {
            Ok(()) => {
                return Ok(Pick::Chosen {
                    manifest: Box::new(m),
                    file,
                })
            }
            Err(e @ RestoreError::Checksum { .. })
            | Err(e @ RestoreError::Decrypt(_))
            | Err(e @ RestoreError::Store(StoreError::NotFound { .. })) => {
                tracing::warn!(snapshot = %m.name, reason = %e, "snapshot skipped for restore");
                skipped.push((m.name.clone(), e.to_string()));
            }
            Err(e) => return Err(e),
        }
    }
    if let (Some(w), true) = (wanted, skipped.is_empty()) {
        skipped.push((
            w.to_string(),
            "no snapshot of that name in the store".into(),
        ));
    }
    Ok(Pick::NoneUsable { skipped })
}

/// The outcome of a completed restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restored {
    /// The WAL was moved into place by this call.
    Now,
    /// A previous run had committed (moved the WAL) and was killed before cleaning up:
    /// this call finished the clean-up.
    Earlier,
}

const COMPLETE: &str = "out.complete";

/// Creates `dir` and its parents as etcd wants its directories: owner only.
pub fn create_private_dir(dir: &Path) -> Result<(), RestoreError> {
    super::scratch::create_private_dir(dir).map_err(io("create", dir))
}

/// Makes `dir`'s entries durable (the files created, renamed or removed in it); an error
/// names the directory and the step it was synced after.
fn sync_dir(dir: &Path, after: &'static str) -> Result<(), RestoreError> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io(after, dir))
}

/// Syncs every file and directory under `dir` (etcd's tool wrote them): before the WAL is
/// moved into place, what it points at is on disk.
fn sync_tree(dir: &Path) -> Result<(), RestoreError> {
    for entry in std::fs::read_dir(dir).map_err(io("read", dir))? {
        let path = entry.map_err(io("read", dir))?.path();
        let meta = std::fs::symlink_metadata(&path).map_err(io("read", &path))?;
        if meta.is_dir() {
            sync_tree(&path)?;
        } else if meta.is_file() {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io("fsync the restored file", &path))?;
        }
    }
    sync_dir(dir, "fsync the restored directory")
}

/// Moves `path` aside under `member/steward/set-aside/` (never deletes it), durably; logs
/// where.
fn set_aside(data_dir: &Path, path: &Path, what: &str) -> Result<(), RestoreError> {
    let dir = data_dir.join("member").join("steward").join("set-aside");
    create_private_dir(&dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let to = dir.join(format!("{what}-before-restore-{stamp}"));
    std::fs::rename(path, &to).map_err(io("set aside (rename)", path))?;
    sync_dir(&dir, "fsync after setting aside")?;
    if let Some(from) = path.parent() {
        sync_dir(from, "fsync after setting aside")?;
    }
    tracing::warn!(from = %path.display(), to = %to.display(), "found in the way of the restore, set aside");
    Ok(())
}

/// Does `path` exist? An error (not "no") when that cannot be told.
fn exists(path: &Path) -> Result<bool, RestoreError> {
    path.try_exists().map_err(io("look at", path))
}

/// Restores `snapshot` (a verified local file) into `data_dir` for `member`. Refuses a
/// data directory holding a WAL, unless the WAL is this restore's own committed result
/// (a re-run after a kill), in which case it only finishes the clean-up.
pub async fn restore_into(
    tool: &EtcdTool,
    snapshot: &Path,
    name: &str,
    member: &MemberParams,
    data_dir: &Path,
) -> Result<Restored, RestoreError> {
    let staging = staging_dir(data_dir);
    let complete = staging.join(COMPLETE);
    let member_dir = data_dir.join("member");
    if has_wal(data_dir)? {
        if complete.exists() {
            cleanup(&staging, snapshot)?;
            return Ok(Restored::Earlier);
        }
        return Err(RestoreError::HasData {
            path: data_dir.to_path_buf(),
        });
    }
    create_private_dir(&staging)?;
    let out = staging.join("out");
    if !exists(&complete)? {
        // A partial result of an earlier run: the agent's own scratch, redone.
        if exists(&out)? {
            std::fs::remove_dir_all(&out).map_err(io("remove", &out))?;
        }
        tool.restore(snapshot, member, &out)
            .await
            .map_err(|error| RestoreError::Tool {
                name: name.to_string(),
                error,
            })?;
        // The output on disk before the marker that says it is whole, and the marker on
        // disk (file, then directory) before anything moves: a restore killed after this
        // point finishes the moves, it never runs the tool over half-moved output.
        sync_tree(&out)?;
        crate::volume::write_atomically(&complete, name.as_bytes())
            .map_err(io("write the restore's complete marker", &complete))?;
    }
    for part in ["snap", "wal"] {
        let from = out.join("member").join(part);
        let to = member_dir.join(part);
        if exists(&from)? {
            if exists(&to)? {
                set_aside(data_dir, &to, part)?;
            }
            std::fs::rename(&from, &to).map_err(io("move into place (rename)", &from))?;
            // The WAL's arrival is the commit point: durable before it is reported done.
            sync_dir(&member_dir, "fsync after moving into place")?;
            sync_dir(&out.join("member"), "fsync after moving into place")?;
        }
    }
    cleanup(&staging, snapshot)?;
    Ok(Restored::Now)
}

fn cleanup(staging: &Path, snapshot: &Path) -> Result<(), RestoreError> {
    // Only the agent's own files: the staging output, its marker, and a snapshot file
    // downloaded into the staging directory.
    let out = staging.join("out");
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(io("remove", &out))?;
    }
    if snapshot.starts_with(staging) && snapshot.exists() {
        std::fs::remove_file(snapshot).map_err(io("remove", snapshot))?;
    }
    let complete = staging.join(COMPLETE);
    if complete.exists() {
        std::fs::remove_file(&complete).map_err(io("remove", &complete))?;
    }
    // Tidying only: a staging directory left (not empty) holds nothing a rerun needs.
    if let Err(e) = std::fs::remove_dir(staging) {
        tracing::debug!(staging = %staging.display(), error = %e, "restore staging directory kept");
    }
    Ok(())
}

/// What [`restore`] did.
#[derive(Debug)]
pub enum RestoreOutcome {
    Restored { manifest: Box<Manifest> },
    NoBackups,
    NoneUsable { skipped: Vec<(String, String)> },
    Disabled,
}

/// The restore's log line: the snapshot, its revision and the revision after the jump
/// (a warning of its own when there is no jump: watchers may miss changes).
///
/// `held`: which revision the restored data holds: the snapshot's, or, with the archive
/// replayed onto it, the point's (a point named by a time does not say: the replay's own
/// line does, and no revision after the jump is said here).
/// Returns the revision the restored data holds and the one the cluster starts from after
/// the jump, when the first is known.
pub fn log_restored(
    manifest: &Manifest,
    tool: &EtcdTool,
    what: &str,
    held: Held,
) -> Option<(i64, i64)> {
    use super::tool::{Jump, JUMP_NEEDS};
    let age = std::time::SystemTime::now()
        .duration_since(manifest.time())
        .unwrap_or_default();
    let age = humantime::format_duration(std::time::Duration::from_secs(age.as_secs()));
    let jump = tool.jump();
    let revision = match held {
        Held::Snapshot => Some(manifest.revision),
        Held::Replayed(r) => r,
    };
    let revisions = revision.map(|revision| {
        let after = match jump {
            Jump::By(n) => revision.saturating_add(i64::try_from(n).unwrap_or(i64::MAX)),
            Jump::Off | Jump::Unsupported => revision,
        };
        (revision, after)
    });
    if let Some((revision, after)) = revisions {
        tracing::warn!(snapshot = %manifest.name, revision, revision_after = after,
            bump_revision = tool.bump_revision, tool = %tool.bin.display(),
            taken = %manifest.time, age = %age, "{what}");
    } else {
        tracing::warn!(snapshot = %manifest.name, revision = manifest.revision,
            bump_revision = tool.bump_revision, tool = %tool.bin.display(),
            taken = %manifest.time, age = %age, "{what}");
    }
    match jump {
        Jump::By(_) => {}
        Jump::Off => tracing::warn!(snapshot = %manifest.name, revision = manifest.revision,
            "--restore-bump-revision 0: the restored cluster's revision went back to the snapshot's; clients watching from a later revision miss changes until they re-list (restart the API servers)"),
        Jump::Unsupported => {
            tracing::warn!(snapshot = %manifest.name, revision = manifest.revision,
            tool = %tool.bin.display(), tool_version = tool.version.as_deref().unwrap_or("unknown"),
            "the restored cluster's revision went back to the snapshot's: {} cannot move it forward; a revision jump needs {JUMP_NEEDS} (--etcdutl-bin); restart the API servers", tool.bin.display())
        }
    }
    revisions
}

/// What revision restored data holds, for [`log_restored`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The snapshot's own.
    Snapshot,
    /// The archive was replayed onto the snapshot: up to this revision, when the point
    /// names one.
    Replayed(Option<i64>),
}

/// The member parameters for pod `id.ordinal` of a cluster formed from a snapshot by all
/// `replicas` initial pods: every pod restores the same snapshot with the same (fresh)
/// `token`, so they form one new cluster with new member IDs.
pub fn formation_member(
    id: &crate::identity::Identity,
    replicas: u32,
    token: &str,
) -> MemberParams {
    MemberParams {
        name: id.name(),
        initial_cluster: id.initial_cluster(replicas),
        token: token.to_string(),
        peer_url: id.peer_url(id.ordinal),
    }
}

/// Init's one call: when `data_dir` holds no WAL, pick the snapshot `choice` names,
/// download and verify it into the staging directory, and restore it for `member`.
pub async fn restore(
    store: &Store,
    choice: &RestoreChoice,
    tool: &EtcdTool,
    member: &MemberParams,
    data_dir: &Path,
) -> Result<RestoreOutcome, RestoreError> {
    if has_wal(data_dir)? && !staging_dir(data_dir).join(COMPLETE).exists() {
        return Err(RestoreError::HasData {
            path: data_dir.to_path_buf(),
        });
    }
    let staging = staging_dir(data_dir);
    match pick(store, choice, &staging).await? {
        Pick::Chosen { manifest, file } => {
            restore_into(tool, &file, &manifest.name, member, data_dir).await?;
            log_restored(
                &manifest,
                tool,
                &format!(
                    "restored from a backup into {}: writes after this snapshot are not in it",
                    data_dir.display()
                ),
                Held::Snapshot,
            );
            Ok(RestoreOutcome::Restored { manifest })
        }
        Pick::NoBackups => Ok(RestoreOutcome::NoBackups),
        Pick::NoneUsable { skipped } => Ok(RestoreOutcome::NoneUsable { skipped }),
        Pick::Disabled => Ok(RestoreOutcome::Disabled),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_snapshot_file_this_process_did_not_download_and_check_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}/s", dir.path().display())).unwrap();
        let src = super::super::snapshot::FakeSource::new(&[3u8; 5000], 4);
        let m = super::super::snapshot::take(&src, &store, std::time::SystemTime::UNIX_EPOCH)
            .await
            .unwrap();
        // Left under its final name by an earlier process and torn by a crash (the
        // download is not synced).
        let dest = dir.path().join(format!("{}.db", m.name));
        std::fs::write(&dest, b"torn").unwrap();
        assert!(!verified_here(&dest));
        fetch_verified(&store, &m, &dest).await.unwrap();
        assert!(verified_here(&dest));
        assert_eq!(std::fs::read(&dest).unwrap(), src.stream);
        std::fs::remove_file(&dest).unwrap();
        assert!(!verified_here(&dest), "a file gone is not there to trust");
    }

    /// A stand-in for `etcdutl snapshot restore`: writes a member directory (`snap/db` and
    /// a WAL) under its `--data-dir`.
    fn fake_etcdutl(dir: &Path) -> EtcdTool {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join("etcdutl");
        std::fs::write(
            &bin,
            "#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --data-dir ] && d=\"$2\"; shift; done\n\
             mkdir -p \"$d/member/snap\" \"$d/member/wal\" && echo db > \"$d/member/snap/db\" && \
             echo wal > \"$d/member/wal/0000000000000000-0000000000000000.wal\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        EtcdTool::from_bin(bin)
    }

    /// `restore_into`, again while the fake tool is "text file busy" (a test thread that
    /// forked while the script was being written still holds it open).
    async fn restore_with(
        tool: &EtcdTool,
        snapshot: &Path,
        data: &Path,
    ) -> Result<Restored, RestoreError> {
        let member = MemberParams {
            name: "etcd-0".into(),
            initial_cluster: "etcd-0=http://x:2380".into(),
            token: "t".into(),
            peer_url: "http://x:2380".into(),
        };
        for _ in 0..50 {
            match restore_into(tool, snapshot, "s", &member, data).await {
                Err(RestoreError::Tool {
                    error: ToolError::Spawn { error, .. },
                    ..
                }) if error.raw_os_error() == Some(26) => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await
                }
                other => return other,
            }
        }
        Err(RestoreError::HasData {
            path: "text file busy".into(),
        })
    }

    /// The restore's own writes and moves are checked: a `complete` marker that cannot be
    /// written, or a move into place that fails, is an error naming the file, the volume
    /// stays empty to etcd (no WAL), and run again once the obstacle is gone the restore
    /// finishes.
    #[tokio::test]
    async fn a_restore_whose_marker_or_move_fails_is_an_error_and_run_again_it_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let (snapshot, data) = (dir.path().join("s.db"), dir.path().join("data"));
        std::fs::write(&snapshot, b"a snapshot").unwrap();
        let tool = fake_etcdutl(dir.path());
        let staging = staging_dir(&data);
        // The marker's temporary file cannot be created: a directory holds its name.
        std::fs::create_dir_all(staging.join("out.tmp/x")).unwrap();
        let e = restore_with(&tool, &snapshot, &data).await.unwrap_err();
        assert!(
            matches!(e, RestoreError::Io { .. }) && e.to_string().contains("complete marker"),
            "{e}"
        );
        assert!(!has_wal(&data).unwrap(), "nothing committed");
        assert!(!staging.join(COMPLETE).exists());
        std::fs::remove_dir_all(staging.join("out.tmp")).unwrap();
        // Old files in the way of `member/snap`, and a file where they go aside.
        std::fs::create_dir_all(data.join("member/snap")).unwrap();
        std::fs::write(data.join("member/snap/old"), b"old").unwrap();
        let set_aside = data.join("member/steward/set-aside");
        std::fs::write(&set_aside, b"in the way").unwrap();
        let e = restore_with(&tool, &snapshot, &data).await.unwrap_err();
        assert!(e.to_string().contains("set-aside"), "{e}");
        assert!(!has_wal(&data).unwrap(), "nothing committed");
        assert!(staging.join(COMPLETE).exists(), "the whole output is kept");
        // The file moved away: run again, it finishes.
        std::fs::rename(&set_aside, dir.path().join("moved")).unwrap();
        assert_eq!(
            restore_with(&tool, &snapshot, &data).await.unwrap(),
            Restored::Now
        );
        assert!(has_wal(&data).unwrap());
        assert_eq!(std::fs::read(data.join("member/snap/db")).unwrap(), b"db\n");
        let aside: Vec<_> = std::fs::read_dir(&set_aside).unwrap().collect();
        assert_eq!(aside.len(), 1, "the old snap/ went aside, not away");
        assert!(!staging.exists(), "the staging directory is cleaned up");
    }

    #[tokio::test]
    async fn a_restore_tool_that_cannot_run_is_said_once_in_the_error_chain() {
        let dir = tempfile::tempdir().unwrap();
        let (snapshot, data) = (dir.path().join("s.db"), dir.path().join("data"));
        std::fs::write(&snapshot, b"not read").unwrap();
        let member = MemberParams {
            name: "etcd-0".into(),
            initial_cluster: "etcd-0=http://x:2380".into(),
            token: "t".into(),
            peer_url: "http://x:2380".into(),
        };
        let tool = EtcdTool::from_bin(dir.path().join("no-such-etcdutl"));
        let e = restore_into(&tool, &snapshot, "s", &member, &data)
            .await
            .unwrap_err();
        assert!(matches!(e, RestoreError::Tool { .. }), "{e}");
        // What `{:#}` (anyhow, the log) prints: each error in the chain, joined.
        let mut chain = e.to_string();
        let mut next = std::error::Error::source(&e);
        while let Some(cause) = next {
            chain.push_str(&format!(": {cause}"));
            next = cause.source();
        }
        assert_eq!(
            chain.matches("No such file or directory").count(),
            1,
            "{chain}"
        );
        assert_eq!(chain.matches("cannot run").count(), 1, "{chain}");
    }
}
