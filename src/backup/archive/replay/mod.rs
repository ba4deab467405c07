//! Replaying the archive onto a snapshot: the snapshot is restored into a scratch
//! directory *without* the revision jump, a throw-away etcd starts on it (as the drill's
//! does), and every archived revision above the scratch member's is applied as **one**
//! transaction holding that revision's puts and deletes in order, so each key keeps its
//! original `mod_revision`. After each transaction the scratch revision must equal the
//! archived one: a mismatch, a hole or a segment that fails its checks ends the replay
//! there, said in the log and in the result (never a silent hole). The scratch etcd is then
//! snapshotted through the client (etcd's trailer checked) into the file a restore uses.
//!
//! Leases: before a put names a lease, the lease is granted in the scratch etcd with the
//! same ID and its recorded TTL ([`DEFAULT_LEASE_TTL`] when the archiver could not learn
//! it), and every lease of the scratch etcd is kept alive while the replay runs (an expired
//! lease would delete keys and add revisions). Their clocks restart at the restore.
//!
//! Up to a window of transactions are in flight at once; each carries compares
//! ([`guards`]) that let it apply only right after its predecessor and only once, so
//! etcd's order is proven, not assumed, and one that overtook its predecessor (it changed
//! nothing) is simply sent again ([`Pipeline`]).
//!
//! The choice of what to do with each archived revision ([`step`]), the transaction it
//! becomes ([`txn_ops`], [`guards`]), the leases it needs ([`leases_to_grant`]) and what to
//! send next ([`Pipeline`]) are pure.

mod api;
pub mod direct;
pub mod encode;
mod latest;
pub mod lease_history;
mod leases;
mod pipeline;
mod plan;
mod sealed;

pub use pipeline::{Answer, Mismatch, Pipeline, Proofs, Send};
pub use plan::{
    applied_key, guards, leases_to_grant, step, txn_ops, EarlyStop, Step, Target, DEFAULT_LEASE_TTL,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use thiserror::Error;
use tokio::io::AsyncWriteExt;

use super::lease_read::{self, ReadError, Scope};
use super::leases::LeaseView;
use super::segment::Segment;
use super::stored;
use super::{chain, SegmentManifest};
use crate::backup::manifest::Manifest;
use crate::backup::scratch::{self, Scratch};
use crate::backup::snapshot::{KvHash, StreamCheck};
use crate::backup::store::{Store, StoreError};
use crate::backup::tool::{EtcdTool, ToolError};

use leases::Leases;

/// One call to the scratch etcd (a transaction, a grant) gets this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What a replay needs besides the snapshot and the segments.
#[derive(Debug, Clone)]
pub struct ReplaySetup {
    /// etcd's offline tool (its revision jump is not used here).
    pub tool: EtcdTool,
    /// The etcd binary the throw-away member runs (the cluster's release).
    pub etcd_bin: PathBuf,
    /// The agent's own scratch space for this replay: emptied first, removed after.
    pub work_dir: PathBuf,
    /// How long the throw-away etcd may take to serve.
    pub start_timeout: Duration,
    /// The cluster's etcd credentials: a snapshot taken with etcd's authentication on
    /// restores with it on, so the throw-away etcd asks for them too.
    pub auth: Option<crate::etcd::Auth>,
    /// How the revisions reach the scratch member.
    pub method: Method,
    /// What a restore point's file keeps of the replayed revisions.
    pub history: History,
}

/// What a restore point's file keeps of the replayed revisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum History {
    /// Every revision, as etcd holds them: for a restore that keeps the history readable
    /// (no revision jump), and for the drill, whose hash covers it.
    #[default]
    Full,
    /// Of each key the replay touches, only its last write (`latest`): for a restore
    /// that marks every earlier revision compacted, where nothing else is read again.
    /// Written into the file only; through etcd's API the history is whole.
    Latest,
}

impl History {
    /// As the log says it.
    pub fn name(self) -> &'static str {
        match self {
            History::Full => "full",
            History::Latest => "latest",
        }
    }
}

/// How a replay applies the archived revisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Method {
    /// Written into the restored snapshot's file before the throw-away etcd starts
    /// ([`direct`]), which must then serve exactly the last one; through etcd's API when
    /// the file cannot take them.
    #[default]
    File,
    /// One guarded transaction each through the throw-away etcd's API.
    Api,
}

impl Method {
    /// As the log says it.
    pub fn name(self) -> &'static str {
        match self {
            Method::File => "file",
            Method::Api => "api",
        }
    }
}

/// A completed replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// The snapshot of the scratch etcd (etcd's trailer checked): what a restore uses.
    pub file: PathBuf,
    /// The snapshot replayed onto.
    pub snapshot: String,
    /// The revision the snapshot held.
    pub snapshot_revision: i64,
    /// The segments at least one revision was applied from, in order.
    pub segments: Vec<String>,
    /// Revisions applied.
    pub revisions: u64,
    /// The last revision the file holds, and when the archiver received it (None: no
    /// revision was replayed).
    pub last_revision: i64,
    pub last_time_unix_ms: Option<u64>,
    /// Why the replay stopped before its target, when it did.
    pub stopped: Option<EarlyStop>,
    /// How long applying the revisions took.
    pub applying: Duration,
    /// How long checking and sealing the restore point's file took (zero through the API).
    pub sealing: Duration,
    /// Transactions sent again because they (or one before them) reached etcd before
    /// their predecessor.
    pub resent: u64,
    /// Times a transaction reached etcd before its predecessor.
    pub overtaken: u64,
    /// How the revisions were applied ([`Method::Api`] too when the file could not take
    /// them).
    pub method: Method,
    /// What the file keeps of them.
    pub history: History,
}

#[derive(Debug, Error)]
pub enum ReplayError {
    /// A segment could not be read from the store: try again later.
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("restoring snapshot {name} into the replay's scratch directory: {error}")]
    Restore { name: String, error: ToolError },
    #[error("the replay's throw-away etcd: {detail}")]
    Scratch { detail: String },
    #[error("replaying revision {revision} into the throw-away etcd: {detail}")]
    Apply { revision: i64, detail: String },
    #[error("the replay's snapshot of the throw-away etcd: {detail}")]
    Snapshot { detail: String },
    #[error("replay: {op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ReplayError + 'a {
    move |source| ReplayError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn scratch_err(detail: impl std::fmt::Display) -> ReplayError {
    ReplayError::Scratch {
        detail: detail.to_string(),
    }
}

/// Replays `segments` (the chain continuing `snapshot_name`, in order) onto the verified
/// local snapshot file `snapshot` up to `target`, and writes the result to `out`. A
/// segment the store cannot serve is an error (try again); one that fails its checks ends
/// the replay before it ([`Replayed::stopped`]).
pub async fn replay(
    store: &Store,
    snapshot: &Path,
    snapshot_name: &str,
    segments: &[SegmentManifest],
    target: Target,
    setup: &ReplaySetup,
    out: &Path,
) -> Result<Replayed, ReplayError> {
    let finish = Finish::SnapshotTo(out);
    let (done, _) = replay_then(
        store,
        snapshot,
        snapshot_name,
        segments,
        target,
        setup,
        finish,
    )
    .await?;
    Ok(done)
}

/// What becomes of the scratch etcd once the revisions are applied.
#[derive(Debug, Clone, Copy)]
enum Finish<'a> {
    /// Its snapshot, into this file (what a restore uses).
    SnapshotTo(&'a Path),
    /// Its `HashKV` at `revision`, after compacting it to `compact` when that is above its
    /// own compacted revision (what the archive drill compares with the live cluster's).
    HashAt { revision: i64, compact: Option<i64> },
}

/// What the archive drill asks the throw-away etcd once it reached its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtRevision {
    /// Its `HashKV` there.
    pub hash: Result<KvHash, String>,
    /// Its leases there (every lease it holds, with its keys).
    pub leases: Result<LeaseView, String>,
}

/// Replays `segments` onto `snapshot` up to revision `at` (as [`replay`] does, without the
/// revision jump) and, when the scratch etcd reached `at`, returns its `HashKV` and its
/// leases there; first compacted to `compact` (the live cluster's compacted revision) when
/// that is above the snapshot's own, so the two hashes cover the same revisions. No file is
/// written: [`Replayed::file`] is empty. The archive drill's replay.
pub async fn replay_and_hash(
    store: &Store,
    snapshot: &Path,
    snapshot_name: &str,
    segments: &[SegmentManifest],
    at: i64,
    compact: Option<i64>,
    setup: &ReplaySetup,
) -> Result<(Replayed, Option<AtRevision>), ReplayError> {
    let finish = Finish::HashAt {
        revision: at,
        compact,
    };
    replay_then(
        store,
        snapshot,
        snapshot_name,
        segments,
        Target::Revision(at),
        setup,
        finish,
    )
    .await
}

async fn replay_then(
    store: &Store,
    snapshot: &Path,
    snapshot_name: &str,
    segments: &[SegmentManifest],
    target: Target,
    setup: &ReplaySetup,
    finish: Finish<'_>,
) -> Result<(Replayed, Option<AtRevision>), ReplayError> {
    let args = (
        store,
        snapshot,
        snapshot_name,
        segments,
        target,
        setup,
        finish,
    );
    if let (Method::File, Finish::SnapshotTo(out)) = (setup.method, finish) {
        let work = &setup.work_dir;
        let mut histories = vec![History::Full];
        if setup.history == History::Latest {
            histories.insert(0, History::Latest);
        }
        for history in histories {
            let file = sealed::File {
                snapshot,
                name: snapshot_name,
                history,
            };
            match sealed::fold(store, file, segments, target, work, out).await? {
                Ok(done) => return Ok((done, None)),
                Err(unfit) => tracing::warn!(reason = %unfit.0, history = history.name(),
                    "the archive replay cannot be written into a copy of the snapshot: trying the next way"),
            }
        }
        tracing::warn!("replaying the archive through etcd's API");
    } else if setup.method == Method::File {
        match attempt(args, Method::File).await? {
            Ok(done) => return Ok(done),
            Err(unfit) => tracing::warn!(reason = %unfit.0,
                "the archive replay cannot be written into the snapshot's file: replaying it through etcd's API instead"),
        }
    }
    match attempt(args, Method::Api).await? {
        Ok(done) => Ok(done),
        Err(unfit) => Err(scratch_err(unfit.0)),
    }
}

type Args<'a> = (
    &'a Store,
    &'a Path,
    &'a str,
    &'a [SegmentManifest],
    Target,
    &'a ReplaySetup,
    Finish<'a>,
);

type Outcome = (Replayed, Option<AtRevision>);

/// One replay from the snapshot, by `method`. `Ok(Err(_))`: the file could not take the
/// revisions, or the throw-away etcd did not serve what was written (nothing of it is
/// used: the caller replays again through the API).
async fn attempt(
    (store, snapshot, snapshot_name, segments, target, setup, finish): Args<'_>,
    method: Method,
) -> Result<Result<Outcome, direct::Unfit>, ReplayError> {
    let work = &setup.work_dir;
    if work.exists() {
        std::fs::remove_dir_all(work).map_err(io("remove", work))?;
    }
    scratch::create_private_dir(work).map_err(io("create", work))?;
    let data = work.join("data");
    let scratch = Scratch::new("replay", &format!("replay-{snapshot_name}"))
        .map_err(|e| scratch_err(format!("no free port: {e}")))?;
    // Restored as it was: the revisions replayed must follow the snapshot's own.
    let tool = EtcdTool {
        bump_revision: 0,
        ..setup.tool.clone()
    };
    tool.restore(snapshot, &scratch.member, &data)
        .await
        .map_err(|error| ReplayError::Restore {
            name: snapshot_name.to_string(),
            error,
        })?;
    let mut written = None;
    if method == Method::File {
        let db = data.join("member").join("snap").join("db");
        let current = match direct::file_revision(&db) {
            Ok(r) => r,
            Err(unfit) => return Ok(Err(unfit)),
        };
        let mut done = Replayed::from_snapshot(snapshot_name, current, finish);
        let kept = work.join("segments");
        let write = direct::append(&db);
        if let Err(unfit) =
            direct::replay_into(store, write, current, segments, target, &kept, &mut done).await?
        {
            return Ok(Err(unfit));
        }
        done.method = Method::File;
        written = Some(done);
    }
    let mut flags = vec![
        // A revision is one transaction, however many keys it changed.
        "--max-txn-ops=1000000".to_string(),
        format!("--max-request-bytes={}", 256 << 20),
        format!("--quota-backend-bytes={}", 8u64 << 30),
    ];
    if scratch::etcd_release(&setup.etcd_bin)
        .await
        .is_some_and(|v| (v.major, v.minor) >= (3, 5))
    {
        // Throw-away data: a crash means replaying again, not a lost write.
        flags.push("--unsafe-no-fsync".into());
    }
    let log = work.join("etcd.log");
    let mut etcd = scratch
        .spawn(&setup.etcd_bin, &data, &flags, Some(&log))
        .map_err(|e| scratch_err(format!("cannot start {:?}: {e}", setup.etcd_bin)))?;
    let result = run(
        store,
        &scratch,
        snapshot_name,
        segments,
        target,
        setup,
        finish,
        written,
    )
    .await;
    let _ = etcd.kill().await;
    let _ = etcd.wait().await;
    match &result {
        Ok(Ok(_)) => {
            let _ = std::fs::remove_dir_all(work);
        }
        Ok(Err(unfit)) => {
            tracing::warn!(reason = %unfit.0, "the archive replay written into the file is not used");
        }
        Err(e) => {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: String = tail.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
            tracing::warn!(error = %e, etcd_log = %tail, "archive replay failed");
        }
    }
    result
}

impl Replayed {
    /// Nothing replayed yet onto snapshot `name` at `revision`.
    fn from_snapshot(name: &str, revision: i64, finish: Finish<'_>) -> Replayed {
        Replayed {
            file: match finish {
                Finish::SnapshotTo(out) => out.to_path_buf(),
                Finish::HashAt { .. } => PathBuf::new(),
            },
            snapshot: name.to_string(),
            snapshot_revision: revision,
            segments: Vec::new(),
            revisions: 0,
            last_revision: revision,
            last_time_unix_ms: None,
            stopped: None,
            applying: Duration::ZERO,
            sealing: Duration::ZERO,
            resent: 0,
            overtaken: 0,
            method: Method::Api,
            history: History::Full,
        }
    }
}

/// A fetched segment, or where the replay stops: one the store could not serve is an error
/// (try again later); one that fails its checks ends the replay before it.
fn usable<T>(
    m: &SegmentManifest,
    got: Result<T, stored::SegmentError>,
) -> Result<Result<T, EarlyStop>, ReplayError> {
    match got {
        Ok(t) => Ok(Ok(t)),
        Err(stored::SegmentError::Store(e)) => Err(e.into()),
        Err(e) => Ok(Err(EarlyStop::BadSegment {
            name: m.name.clone(),
            error: e.to_string(),
        })),
    }
}

/// A restore point's file: the segments that continue snapshot `manifest` (the store's
/// chain from its revision) replayed onto its verified local file `base` up to `target`,
/// into `out`. Logs the snapshot, the segments and revisions replayed, the last revision
/// and its time, and why the replay stopped early when it did.
pub async fn fold(
    store: &Store,
    manifest: &Manifest,
    base: &Path,
    target: Target,
    setup: &ReplaySetup,
    out: &Path,
) -> Result<Replayed, ReplayError> {
    let all = stored::list_after(store, manifest.revision).await?;
    let c = chain::chain(manifest.revision, &manifest.cluster_id, &all);
    let r = replay(store, base, &manifest.name, &c.segments, target, setup, out).await?;
    let last_time = r.last_time_unix_ms.map_or_else(
        || "none (no revision replayed)".to_string(),
        super::rfc3339_ms,
    );
    tracing::warn!(snapshot = %r.snapshot, snapshot_revision = r.snapshot_revision,
        segments = r.segments.len(), revisions_replayed = r.revisions,
        last_revision = r.last_revision, last_time = %last_time,
        replay_seconds = r.applying.as_secs_f64(), seal_seconds = r.sealing.as_secs_f64(),
        method = r.method.name(),
        history = r.history.name(),
        "archive replayed onto the snapshot: the restore holds every archived write up to the last revision");
    if let Some(why) = &r.stopped {
        tracing::warn!(snapshot = %r.snapshot, last_revision = r.last_revision, reason = %why,
            "the archive replay stopped before its target: the restore holds what was verified up to the last revision");
    }
    Ok(r)
}

async fn connect(
    scratch: &Scratch,
    timeout: Duration,
    auth: Option<&crate::etcd::Auth>,
) -> Result<(Client, i64), ReplayError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let url = format!("http://127.0.0.1:{}", scratch.client_port);
    loop {
        let attempt = async {
            let mut options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
            if let Some(a) = auth {
                options = options
                    .with_user(a.username.clone(), a.password.clone())
                    .with_auto_token_refresh(true);
            }
            let mut c = Client::connect([url.clone()], Some(options)).await?;
            let s = c.status().await?;
            Ok::<_, etcd_client::Error>((c, s.header().map(|h| h.revision()).unwrap_or(0)))
        };
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(ok)) => return Ok(ok),
            Ok(Err(e)) if tokio::time::Instant::now() >= deadline => {
                return Err(scratch_err(format!(
                    "did not serve within {timeout:?}: {e}"
                )))
            }
            Err(_) if tokio::time::Instant::now() >= deadline => {
                return Err(scratch_err(format!("did not serve within {timeout:?}")))
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run(
    store: &Store,
    scratch: &Scratch,
    snapshot_name: &str,
    segments: &[SegmentManifest],
    target: Target,
    setup: &ReplaySetup,
    finish: Finish<'_>,
    written: Option<Replayed>,
) -> Result<Result<Outcome, direct::Unfit>, ReplayError> {
    let (client, served) = connect(scratch, setup.start_timeout, setup.auth.as_ref()).await?;
    // Every lease is kept alive until the snapshot or the hash is taken: an expiring one
    // would delete keys and add revisions.
    let mut leases = Leases::start(client.clone()).await?;
    let done = match written {
        Some(done) if served != done.last_revision => {
            return Ok(Err(direct::Unfit(format!(
            "the throw-away etcd serves revision {served} from the file written up to revision {}",
            done.last_revision
        ))))
        }
        Some(done) => done,
        None => {
            let done = Replayed::from_snapshot(snapshot_name, served, finish);
            api::apply_through_api(store, &client, &mut leases, segments, target, done).await?
        }
    };
    let outcome = match finish {
        Finish::SnapshotTo(out) => {
            snapshot_to(&client, out).await?;
            (done, None)
        }
        Finish::HashAt { revision, compact } if done.last_revision >= revision => {
            let hash = hash_at(&client, revision, compact).await;
            // The scratch etcd serves exactly `revision`: its whole lease list is that
            // revision's.
            let leases = lease_read::read(&client, revision, Scope::All, CALL_TIMEOUT)
                .await
                .map_err(|e| match e {
                    ReadError::Compacted => format!("its revision {revision} is compacted away"),
                    ReadError::Failed(why) => why,
                });
            (done, Some(AtRevision { hash, leases }))
        }
        Finish::HashAt { .. } => (done, None),
    };
    drop(leases);
    Ok(Ok(outcome))
}

/// The scratch etcd's `HashKV` at `revision`, compacted first to `compact` when that is
/// above its own compacted revision (physically: the hash then sees what the live
/// cluster's sees).
async fn hash_at(client: &Client, revision: i64, compact: Option<i64>) -> Result<KvHash, String> {
    let ask = || async {
        let mut m = client.maintenance_client();
        match tokio::time::timeout(CALL_TIMEOUT, m.hash_kv(revision)).await {
            Ok(Ok(r)) => Ok(KvHash {
                hash: r.hash(),
                compact_revision: r.compact_version(),
            }),
            Ok(Err(e)) => Err(format!("HashKV at revision {revision}: {e}")),
            Err(_) => Err(format!(
                "HashKV at revision {revision}: no answer within {CALL_TIMEOUT:?}"
            )),
        }
    };
    let first = ask().await?;
    match compact {
        Some(c) if c > first.compact_revision && c <= revision => {
            let options = etcd_client::CompactionOptions::new().with_physical();
            let mut kv = client.kv_client();
            match tokio::time::timeout(CALL_TIMEOUT, kv.compact(c, Some(options))).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(format!("compacting to revision {c}: {e}")),
                Err(_) => {
                    return Err(format!(
                        "compacting to revision {c}: no answer within {CALL_TIMEOUT:?}"
                    ))
                }
            }
            ask().await
        }
        _ => Ok(first),
    }
}

/// The scratch etcd's snapshot into `out` (as `out.partial` first), etcd's trailer checked.
async fn snapshot_to(client: &Client, out: &Path) -> Result<(), ReplayError> {
    let partial = out.with_extension("partial");
    let failed = |detail: String| ReplayError::Snapshot { detail };
    let mut maintenance = client.maintenance_client();
    let mut stream = maintenance
        .snapshot()
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut file = tokio::fs::File::create(&partial)
        .await
        .map_err(io("create", &partial))?;
    let mut check = StreamCheck::trailer_only();
    while let Some(resp) = stream.message().await.map_err(|e| failed(e.to_string()))? {
        check.update(resp.blob());
        file.write_all(resp.blob())
            .await
            .map_err(io("write", &partial))?;
    }
    file.sync_all().await.map_err(io("sync", &partial))?;
    drop(file);
    if let Err(why) = check.finish().trailer {
        let _ = std::fs::remove_file(&partial);
        return Err(failed(why));
    }
    std::fs::rename(&partial, out).map_err(io("rename", out))
}
