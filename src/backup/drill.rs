//! The restore drill: proves a stored snapshot restores. It downloads the snapshot (both
//! checksums), reads its revision and integrity with etcd's tool, restores it into the
//! scratch directory with the same tool and flags a real restore uses, starts a throw-away
//! etcd on it (127.0.0.1, ephemeral ports) and compares its `HashKV` at the snapshot's
//! revision with the live cluster's. With the revision jump (`--bump-revision`), every
//! revision before the jump is compacted away in the restored member, so no hash can be
//! compared; the drill proves instead that the restored revision is the snapshot's plus the
//! jump. `HashKV` does not cover the `lease` bucket, so the restored member's leases are
//! compared too with the live cluster's at the snapshot's revision (the leases its keys
//! name, their granted TTLs and keys: [`super::archive::leases`]), with the jump as
//! without. The outcome is recorded in the snapshot's manifest.
//!
//! The archive drill ([`super::archive::drill`]) runs beside it: on the drilled snapshot
//! when segments continue it (`backup --drill`), and on the snapshot before the newest
//! once a newer one exists ([`drill_archive`]: the periodic drill's, since the newest is
//! drilled as soon as it is taken, before anything continues it). Its outcome goes in the
//! same manifest's drill record (`archive`).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::archive::drill::{self as archive_drill, ArchiveDrill, LeaseCheck};
use super::archive::lease_read::{self, ReadError, Scope};
use super::archive::replay::ReplaySetup;
use super::manifest::{self, DrillRecord, Manifest};
use super::restore::{self, RestoreError};
use super::scratch::Scratch;
use super::snapshot::{self, EtcdSource, EtcdTarget, SnapshotSource, SourceError};
use super::store::{Store, StoreError};
use super::tool::{EtcdTool, Jump};

/// How the restored key-value hash compared with the live cluster's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashCheck {
    Match {
        revision: i64,
        hash: u32,
    },
    Mismatch {
        revision: i64,
        restored: u32,
        live: u32,
    },
    /// Not compared, and why (the revision is compacted away on the live cluster, …).
    Skipped {
        reason: String,
    },
    /// Restored with the revision jump: the restored member serves `revision`, the
    /// snapshot's plus the jump (older revisions are compacted, so no hash compares).
    Jumped {
        snapshot: i64,
        revision: i64,
    },
    /// Restored with the revision jump, but the restored member serves another revision.
    JumpMissed {
        expected: i64,
        revision: i64,
    },
    /// The drill failed before it could compare; the restored etcd's last answer, when
    /// the drill got that far.
    NotRun {
        last_error: Option<String>,
    },
}

impl HashCheck {
    fn word(&self) -> &'static str {
        match self {
            HashCheck::Match { .. } => "match",
            HashCheck::Mismatch { .. } => "mismatch",
            HashCheck::Skipped { .. } => "skipped",
            HashCheck::Jumped { .. } => "jumped",
            HashCheck::JumpMissed { .. } => "jump_missed",
            HashCheck::NotRun { .. } => "not_run",
        }
    }
}

/// One drill's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrillOutcome {
    pub snapshot: String,
    pub passed: bool,
    pub restored_revision: Option<i64>,
    pub total_keys: Option<u64>,
    pub hash: HashCheck,
    /// How the restored member's leases compared with the live cluster's.
    pub leases: LeaseCheck,
    /// A sentence: what was proven, or what failed.
    pub detail: String,
    /// The stored bytes fail their checksum: the snapshot is now marked unverified.
    pub corrupt: bool,
    /// The archive drill of the segments continuing the snapshot, when any do.
    pub archive: Option<ArchiveDrill>,
}

impl DrillOutcome {
    pub fn record(&self, now: SystemTime) -> DrillRecord {
        let (time, time_unix) = manifest::timestamps(now);
        DrillRecord {
            time,
            time_unix,
            passed: self.passed,
            restored_revision: self.restored_revision,
            hash_check: self.hash.word().to_string(),
            detail: self.detail.clone(),
            archive: self.archive.as_ref().map(|a| a.record(now)),
        }
    }

    /// Whether the snapshot and the archive continuing it (when drilled) both passed.
    pub fn passed_all(&self) -> bool {
        self.passed && self.archive.as_ref().is_none_or(|a| a.passed)
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "snapshot": self.snapshot,
            "passed": self.passed,
            "restored_revision": self.restored_revision,
            "total_keys": self.total_keys,
            "hash_check": self.hash.word(),
            "lease_check": self.leases.word(),
            "detail": self.detail,
            "archive": self.archive.as_ref().map(ArchiveDrill::to_json),
        })
    }
}

/// What the drill needs besides the snapshot.
#[derive(Debug, Clone)]
pub struct DrillSetup {
    pub tool: EtcdTool,
    /// The etcd binary the throw-away member runs (the same release as the cluster).
    pub etcd_bin: PathBuf,
    /// The agent's own scratch space: emptied and reused by every drill.
    pub scratch_dir: PathBuf,
    /// How long the throw-away etcd may take to serve.
    pub start_timeout: Duration,
    /// The cluster's etcd credentials: the restored member keeps the snapshot's
    /// authentication, so the drill asks it as the agent asks the cluster.
    pub auth: Option<crate::etcd::Auth>,
}

fn fail(m: &Manifest, restored: Option<i64>, detail: String) -> DrillOutcome {
    DrillOutcome {
        snapshot: m.name.clone(),
        passed: false,
        restored_revision: restored,
        total_keys: None,
        hash: HashCheck::NotRun { last_error: None },
        leases: LeaseCheck::NotRun,
        detail,
        corrupt: false,
        archive: None,
    }
}

impl DrillSetup {
    /// The archive drill's replay: its own directory under the scratch space.
    pub fn replay(&self) -> ReplaySetup {
        ReplaySetup {
            tool: self.tool.clone(),
            etcd_bin: self.etcd_bin.clone(),
            work_dir: self.scratch_dir.join("drill-archive"),
            start_timeout: self.start_timeout,
            auth: self.auth.clone(),
            method: crate::backup::archive::replay::Method::default(),
            // Its hash covers every revision since the snapshot's.
            history: crate::backup::archive::replay::History::Full,
        }
    }
}

/// Drills snapshot `m` against `live` (a member of the running cluster), records the
/// outcome in its manifest, and returns it. A snapshot whose stored bytes fail their
/// checksum is also marked `verified: false`, so no restore ever uses it. An error is
/// returned only when the store cannot be read or written (try again later).
pub async fn drill<L: SnapshotSource>(
    store: &Store,
    m: &Manifest,
    setup: &DrillSetup,
    live: &L,
    now: SystemTime,
) -> Result<DrillOutcome, StoreError> {
    let mut outcome = run(store, m, setup, live).await?;
    // The file downloaded and read back: the archive continuing it is drilled too (the
    // restored copy set aside first: the scratch space holds one at a time).
    let file = work_dir(&setup.scratch_dir).join("snapshot.db");
    if outcome.restored_revision.is_some() && file.exists() {
        let _ = std::fs::remove_dir_all(work_dir(&setup.scratch_dir).join("data"));
        let all = super::archive::stored::list(store).await?;
        let snapshots = super::catalog::list(store).await?;
        let a =
            super::archive::drill::drill(m, &file, &all, &snapshots, store, &setup.replay(), live)
                .await?;
        if a.check != super::archive::drill::ArchiveCheck::Nothing || !a.passed {
            outcome.archive = Some(a);
        }
    }
    let mut updated = m.clone();
    updated.drill = Some(outcome.record(now));
    if outcome.corrupt {
        updated.verified = false;
        updated.unverified_reason = Some(outcome.detail.clone());
    }
    snapshot::write_manifest(store, &updated).await?;
    let _ = std::fs::remove_dir_all(setup.scratch_dir.join("drill"));
    Ok(outcome)
}

async fn run<L: SnapshotSource>(
    store: &Store,
    m: &Manifest,
    setup: &DrillSetup,
    live: &L,
) -> Result<DrillOutcome, StoreError> {
    let work = setup.scratch_dir.join("drill");
    if work.exists() {
        if let Err(e) = std::fs::remove_dir_all(&work) {
            return Ok(fail(
                m,
                None,
                format!("cannot empty the scratch directory {work:?}: {e}"),
            ));
        }
    }
    if let Err(e) = std::fs::create_dir_all(&work) {
        return Ok(fail(
            m,
            None,
            format!("cannot create the scratch directory {work:?}: {e}"),
        ));
    }
    let file = work.join("snapshot.db");
    match restore::fetch_verified(store, m, &file).await {
        Ok(()) => {}
        Err(RestoreError::Store(e)) => return Err(e),
        Err(e @ RestoreError::Checksum { .. }) => {
            return Ok(DrillOutcome {
                corrupt: true,
                ..fail(m, None, format!("download: {e}"))
            })
        }
        Err(e) => return Ok(fail(m, None, format!("download: {e}"))),
    }
    let status = match setup.tool.status(&file).await {
        Ok(s) => s,
        Err(e) => return Ok(fail(m, None, format!("integrity: {e}"))),
    };
    // A keyspace never written to holds no revision: etcd serves it as revision 1, the
    // revision a new cluster's manifest records.
    let revision = status.revision.max(1);
    if revision < m.revision {
        return Ok(fail(
            m,
            Some(revision),
            format!(
                "the restored revision {} is older than the manifest's {}",
                revision, m.revision
            ),
        ));
    }
    let scratch = match Scratch::new("drill", &format!("drill-{}", m.name)) {
        Ok(s) => s,
        Err(e) => return Ok(fail(m, Some(revision), format!("no free port: {e}"))),
    };
    let client = scratch.client_port;
    let data = work.join("data");
    if let Err(e) = restore::restore_into(&setup.tool, &file, &m.name, &scratch.member, &data).await
    {
        return Ok(fail(m, Some(revision), format!("restore: {e}")));
    }
    let mut etcd = match scratch.spawn(&setup.etcd_bin, &data, &[], None) {
        Ok(c) => c,
        Err(e) => {
            return Ok(fail(
                m,
                Some(revision),
                format!("cannot start {:?}: {e}", setup.etcd_bin),
            ))
        }
    };
    let hash = match setup.tool.jump() {
        Jump::By(n) => {
            let expected = status
                .revision
                .saturating_add(i64::try_from(n).unwrap_or(i64::MAX));
            jumped(revision, expected, client, setup).await
        }
        Jump::Off | Jump::Unsupported => compare(revision, client, setup, live).await,
    };
    let leases = match &hash {
        HashCheck::Match { .. } | HashCheck::Skipped { .. } => {
            leases_at(revision, revision, client, setup, live).await
        }
        HashCheck::Jumped { revision: r, .. } => leases_at(*r, revision, client, setup, live).await,
        _ => LeaseCheck::NotRun,
    };
    let _ = etcd.kill().await;
    let (passed, mut detail) = match &hash {
        HashCheck::Match { revision, hash } => (
            true,
            format!("restored revision {revision} with {} keys; HashKV {hash:#x} matches the live cluster's", status.total_key),
        ),
        HashCheck::Skipped { reason } => (
            true,
            format!("restored revision {} with {} keys (integrity checked); hash not compared: {reason}", revision, status.total_key),
        ),
        HashCheck::Jumped { snapshot, revision } => (
            true,
            format!("restored revision {snapshot} with {} keys (integrity checked) and moved it forward to {revision} (--bump-revision); hash not compared: older revisions are compacted", status.total_key),
        ),
        HashCheck::JumpMissed { expected, revision } => (
            false,
            format!("restored with --bump-revision, the member serves revision {revision}, below the {expected} the jump promises"),
        ),
        HashCheck::Mismatch { revision, restored, live } => (
            false,
            format!("HashKV at revision {revision}: restored {restored:#x}, live {live:#x}"),
        ),
        HashCheck::NotRun { last_error } => (
            false,
            match last_error {
                Some(e) => format!(
                    "the restored etcd did not serve within {:?}; its last answer: {e}",
                    setup.start_timeout
                ),
                None => format!("the restored etcd did not serve within {:?}", setup.start_timeout),
            },
        ),
    };
    let passed = passed
        && match &leases {
            LeaseCheck::Match { leases } => {
                detail.push_str(&format!(
                    "; the {leases} leases its keys name match the live cluster's at revision {revision} (IDs, granted TTLs, keys)"
                ));
                true
            }
            LeaseCheck::Skipped { reason } => {
                detail.push_str(&format!("; leases not compared: {reason}"));
                true
            }
            LeaseCheck::Mismatch { diff } => {
                detail.push_str(&format!(
                    "; the leases differ from the live cluster's at revision {revision}: {diff}"
                ));
                false
            }
            LeaseCheck::Unread { why } => {
                detail.push_str(&format!("; the restored etcd's leases: {why}"));
                false
            }
            LeaseCheck::NotRun => true,
        };
    Ok(DrillOutcome {
        snapshot: m.name.clone(),
        passed,
        restored_revision: Some(revision),
        total_keys: Some(status.total_key),
        hash,
        leases,
        detail,
        corrupt: false,
        archive: None,
    })
}

/// The periodic archive drill: the archive continuing snapshot `m` (which was drilled
/// before: its record gets the archive part) replayed up to its last archived revision
/// and compared with `live`; `snapshots` is every snapshot's manifest. Recorded in `m`'s
/// manifest whatever the outcome, so each snapshot's archive is drilled once. An error
/// only when the store cannot be read or written (try again later).
pub async fn drill_archive<L: SnapshotSource>(
    store: &Store,
    m: &Manifest,
    snapshots: &[Manifest],
    setup: &DrillSetup,
    live: &L,
    now: SystemTime,
) -> Result<ArchiveDrill, StoreError> {
    let work = work_dir(&setup.scratch_dir);
    let _ = std::fs::remove_dir_all(&work);
    let file = work.join("snapshot.db");
    let fetched = match std::fs::create_dir_all(&work) {
        Ok(()) => restore::fetch_verified(store, m, &file).await,
        Err(e) => Err(RestoreError::Io {
            op: "create",
            path: work.clone(),
            source: e,
        }),
    };
    let outcome = match fetched {
        Ok(()) => {
            let all = super::archive::stored::list(store).await?;
            super::archive::drill::drill(m, &file, &all, snapshots, store, &setup.replay(), live)
                .await?
        }
        Err(RestoreError::Store(e)) => return Err(e),
        Err(e) => ArchiveDrill {
            passed: false,
            from_revision: m.revision,
            last_revision: m.revision,
            target_revision: m.revision,
            segments: Vec::new(),
            revisions: 0,
            check: super::archive::drill::ArchiveCheck::NotRun,
            leases: super::archive::drill::LeaseCheck::NotRun,
            detail: format!("the snapshot the archive continues does not download: {e}"),
        },
    };
    let _ = std::fs::remove_dir_all(&work);
    let mut updated = m.clone();
    if let Some(d) = updated.drill.as_mut() {
        d.archive = Some(outcome.record(now));
    }
    snapshot::write_manifest(store, &updated).await?;
    Ok(outcome)
}

/// The throw-away etcd on `client_port`, once it answers `ask` (bounded by `start_timeout`).
pub(crate) async fn ask_restored<T, F, Fut>(
    client_port: u16,
    setup: &DrillSetup,
    ask: F,
) -> Result<T, String>
where
    F: Fn(EtcdSource) -> Fut,
    Fut: std::future::Future<Output = Result<T, SourceError>>,
{
    let target = EtcdTarget {
        host: "127.0.0.1".into(),
        ip: [127, 0, 0, 1].into(),
        port: client_port,
        tls: None,
        auth: setup.auth.clone(),
    };
    let deadline = tokio::time::Instant::now() + setup.start_timeout;
    loop {
        let attempt = async { ask(EtcdSource::connect(&target).await?).await };
        match attempt.await {
            Ok(answer) => return Ok(answer),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(error = %e, "the drill's throw-away etcd did not serve in time");
                return Err(e.to_string());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// With the revision jump: does the restored member serve the snapshot's revision plus the
/// jump?
async fn jumped(snapshot: i64, expected: i64, client_port: u16, setup: &DrillSetup) -> HashCheck {
    let served = ask_restored(client_port, setup, |src| async move {
        src.info().await.map(|i| i.revision)
    })
    .await;
    match served {
        Err(e) => HashCheck::NotRun {
            last_error: Some(e),
        },
        Ok(revision) if revision >= expected => HashCheck::Jumped { snapshot, revision },
        Ok(revision) => HashCheck::JumpMissed { expected, revision },
    }
}

async fn compare<L: SnapshotSource>(
    revision: i64,
    client_port: u16,
    setup: &DrillSetup,
    live: &L,
) -> HashCheck {
    let restored = ask_restored(client_port, setup, |src| async move {
        src.hash_kv(revision).await
    })
    .await;
    let restored = match restored {
        Ok(r) => r,
        Err(e) => {
            return HashCheck::NotRun {
                last_error: Some(e),
            }
        }
    };
    match live.hash_kv(revision).await {
        Ok(l) if l.compact_revision != restored.compact_revision => HashCheck::Skipped {
            reason: format!(
                "the live cluster compacted to revision {} since the snapshot (at {})",
                l.compact_revision, restored.compact_revision
            ),
        },
        Ok(l) if l.hash == restored.hash => HashCheck::Match {
            revision,
            hash: l.hash,
        },
        Ok(l) => HashCheck::Mismatch {
            revision,
            restored: restored.hash,
            live: l.hash,
        },
        Err(SourceError::Compacted { .. }) => HashCheck::Skipped {
            reason: format!("revision {revision} is compacted away on the live cluster"),
        },
        Err(e) => HashCheck::Skipped {
            reason: format!("the live cluster's HashKV is unavailable: {e}"),
        },
    }
}

/// The restored member's leases (it serves `restored`, the snapshot's revision or past it
/// with the jump: its keys are the snapshot's) compared with the live cluster's at the
/// snapshot's revision `snapshot`.
async fn leases_at<L: SnapshotSource>(
    restored: i64,
    snapshot: i64,
    client_port: u16,
    setup: &DrillSetup,
    live: &L,
) -> LeaseCheck {
    let live = live.leases_at(snapshot).await;
    let ours = ask_restored(client_port, setup, |src| async move {
        let timeout = setup.start_timeout;
        lease_read::read(&src.client(), restored, Scope::All, timeout)
            .await
            .map_err(|e| SourceError::Other {
                endpoint: src.endpoint().to_string(),
                detail: match e {
                    ReadError::Compacted => format!("revision {restored} is compacted away"),
                    ReadError::Failed(why) => why,
                },
            })
    })
    .await;
    archive_drill::lease_check(snapshot, &live, Some(&ours))
}

/// The scratch path a drill uses (for logs and tests).
pub fn work_dir(scratch: &Path) -> PathBuf {
    scratch.join("drill")
}
