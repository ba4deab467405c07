//! The archive replay against real parts: etcd 3.5.30 on 127.0.0.1, a `file://` store,
//! segments made from the live member's own watch (`support/archive.rs`). Each replayed
//! file is restored (without a revision jump) into another etcd and its keyspace compared,
//! key by key, with the live member's at the same revision. The archive drill
//! (`backup::drill` with segments continuing the snapshot) on the same parts: a `HashKV`
//! match at the last archived revision (encrypted store, live compacted inside the
//! archive), a corrupted segment named, a live cluster compacted past the archive skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/archive.rs"]
mod archive;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use etcd_client::{Client, GetOptions, PutOptions, Txn, TxnOp};
use etcd_steward::backup::archive::drill::{ArchiveCheck, LeaseCheck};
use etcd_steward::backup::archive::replay::{
    self, EarlyStop, History, Method, ReplaySetup, Replayed, Target,
};
use etcd_steward::backup::archive::segment::{Op, Revision};
use etcd_steward::backup::archive::SegmentManifest;
use etcd_steward::backup::catalog;
use etcd_steward::backup::crypt::{Key, Keys};
use etcd_steward::backup::drill::{self, DrillOutcome, DrillSetup};
use etcd_steward::backup::manifest::DrillRecord;
use etcd_steward::backup::manifest::Manifest;
use etcd_steward::backup::restore;
use etcd_steward::backup::schedule::BackupMetrics;
use etcd_steward::backup::snapshot::{self, EtcdSource, EtcdTarget};
use etcd_steward::backup::store::Store;
use etcd_steward::backup::tool::{EtcdTool, MemberParams};

const RELEASE: harness::Etcd = harness::Etcd::V3_5Current;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One etcd member on 127.0.0.1, killed on drop.
struct Etcd {
    child: Child,
    client: u16,
    peer: u16,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Etcd {
    async fn start(name: &str, data: &Path, peer: u16) -> Etcd {
        Etcd::start_with(name, data, peer, &[]).await
    }

    async fn start_with(name: &str, data: &Path, peer: u16, extra: &[&str]) -> Etcd {
        let client = free_port();
        let peer_url = format!("http://127.0.0.1:{peer}");
        let client_url = format!("http://127.0.0.1:{client}");
        let log = data.with_extension("etcd.log");
        let child = Command::new(RELEASE.bin())
            .arg(format!("--name={name}"))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={name}={peer_url}"))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let etcd = Etcd {
            child,
            client,
            peer,
        };
        harness::wait_for(Duration::from_secs(30), "etcd serves", || async {
            match etcd.try_client().await {
                Ok(mut c) => c.get("probe", None).await.is_ok(),
                Err(_) => false,
            }
        })
        .await;
        etcd
    }

    async fn try_client(&self) -> Result<Client, etcd_client::Error> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(10));
        Client::connect([format!("http://127.0.0.1:{}", self.client)], Some(options)).await
    }

    async fn client(&self) -> Client {
        self.try_client().await.unwrap()
    }

    async fn revision(&self) -> i64 {
        let s = self.client().await.status().await.unwrap();
        s.header().unwrap().revision()
    }

    fn target(&self) -> EtcdTarget {
        EtcdTarget {
            host: "127.0.0.1".into(),
            ip: [127, 0, 0, 1].into(),
            port: self.client,
            tls: None,
            auth: None,
        }
    }
}

/// Every key, as (key, value, create_revision, mod_revision, version, lease), at `at`
/// (`None`: now).
type Kv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

async fn keyspace(c: &mut Client, at: Option<i64>) -> Vec<Kv> {
    let mut options = GetOptions::new().with_all_keys();
    if let Some(r) = at {
        options = options.with_revision(r);
    }
    c.get("", Some(options))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            )
        })
        .collect()
}

fn store(dir: &Path) -> Store {
    Store::open(&format!("file://{}", dir.join("store").display())).unwrap()
}

/// A snapshot of `live` into `store`, downloaded (verified) to a local file.
async fn snapshot_of(live: &Etcd, store: &Store, dir: &Path) -> (Manifest, PathBuf) {
    let source = EtcdSource::connect(&live.target()).await.unwrap();
    let m = snapshot::take(&source, store, SystemTime::now())
        .await
        .unwrap();
    assert!(m.verified);
    let file = dir.join(format!("{}.db", m.name));
    restore::fetch_verified(store, &m, &file).await.unwrap();
    (m, file)
}

fn setup(dir: &Path) -> ReplaySetup {
    ReplaySetup {
        tool: EtcdTool::from_bin(RELEASE.offline_tool()),
        etcd_bin: RELEASE.bin(),
        work_dir: dir.join("replay-work"),
        start_timeout: Duration::from_secs(30),
        auth: None,
        method: Method::default(),
        history: History::Full,
    }
}

/// Restores `file` as it is (no revision jump) and starts etcd on it.
async fn started_from(file: &Path, dir: &Path, name: &str) -> Etcd {
    started_with(file, dir, name, 0).await
}

/// Restores `file` as a restore does, its revision moved `jump` forward and every earlier
/// one marked compacted (0: as it is), and starts etcd on it.
async fn started_with(file: &Path, dir: &Path, name: &str, jump: u64) -> Etcd {
    let peer = free_port();
    let member = MemberParams {
        name: name.into(),
        initial_cluster: format!("{name}=http://127.0.0.1:{peer}"),
        token: format!("t-{name}"),
        peer_url: format!("http://127.0.0.1:{peer}"),
    };
    let data = dir.join(name);
    let tool = EtcdTool::from_bin(RELEASE.offline_tool())
        .check(Duration::from_secs(10))
        .await
        .unwrap();
    EtcdTool {
        bump_revision: jump,
        ..tool
    }
    .restore(file, &member, &data)
    .await
    .unwrap();
    Etcd::start(name, &data, peer).await
}

const T0: u64 = 1_795_000_000_000;

fn time_of(revision: i64) -> u64 {
    T0 + u64::try_from(revision).unwrap() * 1000
}

/// A live member with 20 keys, a snapshot of it, and then writes of every kind: leased
/// puts (TTL 30 s), overwrites, a delete, a transaction of puts and a delete, a range
/// delete of 11 keys at one revision. Returns the live member, the snapshot, its local
/// file, the segments (`per` revisions each) and the last revision.
async fn written(
    dir: &Path,
    store: &Store,
    per: usize,
) -> (Etcd, Manifest, PathBuf, Vec<SegmentManifest>, i64) {
    let live = Etcd::start("live", &dir.join("live"), free_port()).await;
    let mut c = live.client().await;
    for i in 0..20 {
        c.put(format!("/k/{i}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    let (m, file) = snapshot_of(&live, store, dir).await;
    let lease = c.lease_grant(30, None).await.unwrap().id();
    let leased = Some(PutOptions::new().with_lease(lease));
    c.put("/leased/a", "a", leased.clone()).await.unwrap();
    c.put("/k/1", "overwritten", None).await.unwrap();
    c.put("/leased/b", "b", leased).await.unwrap();
    c.delete("/k/2", None).await.unwrap();
    c.txn(Txn::new().and_then([
        TxnOp::put("/t/x", "x", None),
        TxnOp::delete("/k/3", None),
        TxnOp::put("/t/y", "y", None),
    ]))
    .await
    .unwrap();
    c.delete(
        "/k/1",
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    for i in 0..5 {
        c.put(format!("/after/{i}"), vec![b'x'; 1024], None)
            .await
            .unwrap();
    }
    c.put("/k/2", "back", None).await.unwrap();
    let last = live.revision().await;
    let cluster = u64::from_str_radix(&m.cluster_id, 16).unwrap();
    let segments =
        archive::archive(&mut c, store, cluster, m.revision + 1, last, per, time_of).await;
    (live, m, file, segments, last)
}

async fn replayed(
    store: &Store,
    m: &Manifest,
    file: &Path,
    segments: &[SegmentManifest],
    target: Target,
    dir: &Path,
) -> Replayed {
    let out = dir.join("folded.db");
    let _ = std::fs::remove_file(&out);
    replay::replay(store, file, &m.name, segments, target, &setup(dir), &out)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_replay_brings_back_every_key_at_its_original_revision_and_its_leases_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (live, m, file, segments, last) = written(dir.path(), &store, 3).await;
    let expected = keyspace(&mut live.client().await, None).await;
    let r = replayed(&store, &m, &file, &segments, Target::End, dir.path()).await;
    assert_eq!(r.stopped, None, "{r:?}");
    assert_eq!(r.snapshot_revision, m.revision);
    assert_eq!(r.last_revision, last);
    assert_eq!(r.revisions, u64::try_from(last - m.revision).unwrap());
    assert_eq!(r.last_time_unix_ms, Some(time_of(last)));
    assert_eq!(r.segments.len(), segments.len());
    assert!(
        !dir.path().join("replay-work").exists(),
        "scratch left behind"
    );
    let restored = started_from(&r.file, dir.path(), "restored").await;
    assert_eq!(restored.revision().await, last);
    let mut c = restored.client().await;
    let got = keyspace(&mut c, None).await;
    assert_eq!(got, expected);
    let leased: Vec<&Kv> = got.iter().filter(|kv| kv.5 != 0).collect();
    assert_eq!(leased.len(), 2, "{got:?}");
    for kv in leased {
        let ttl = c.lease_time_to_live(kv.5, None).await.unwrap();
        assert_eq!(ttl.granted_ttl(), 30, "lease {:x}", kv.5);
        assert!(ttl.ttl() > 0, "the lease is alive after the restore");
    }
}

/// `HashKV` of `e` at `revision`.
async fn hash_at(e: &Etcd, revision: i64) -> u32 {
    let mut c = e.client().await;
    c.hash_kv(revision).await.unwrap().hash()
}

/// A snapshot whose `key` bucket is a tree of several levels, then an archive of every
/// kind of change over several levels more: 1 KiB overwrites, values bigger than a page,
/// leased keys on leases granted after the snapshot and on one from before it, deletes of
/// keys from before the snapshot and keys written after it, keys deleted and written
/// again, and transactions of several puts and deletes.
async fn written_large(
    dir: &Path,
    store: &Store,
) -> (Etcd, Manifest, PathBuf, Vec<SegmentManifest>, i64) {
    let live = Etcd::start("live", &dir.join("live"), free_port()).await;
    let mut c = live.client().await;
    let old = c.lease_grant(45, None).await.unwrap().id();
    for i in 0..3000 {
        let lease = (i % 100 == 0).then(|| PutOptions::new().with_lease(old));
        c.put(format!("/old/{i:05}"), vec![b'o'; 100], lease)
            .await
            .unwrap();
    }
    let (m, file) = snapshot_of(&live, store, dir).await;
    let fresh = c.lease_grant(30, None).await.unwrap().id();
    for i in 0..4000u32 {
        match i % 10 {
            0 => {
                c.put(format!("/old/{:05}", i % 3000), format!("again {i}"), None)
                    .await
                    .unwrap();
            }
            1 => {
                c.delete(format!("/old/{:05}", (i * 7) % 3000), None)
                    .await
                    .unwrap();
            }
            2 => {
                let lease = PutOptions::new().with_lease(if i % 20 == 2 { fresh } else { old });
                c.put(format!("/leased/{}", i % 50), format!("l{i}"), Some(lease))
                    .await
                    .unwrap();
            }
            3 if i % 100 == 3 => {
                c.put(
                    format!("/big/{}", i % 7),
                    vec![b'b'; 10_000 + i as usize],
                    None,
                )
                .await
                .unwrap();
            }
            4 => {
                c.txn(Txn::new().and_then([
                    TxnOp::put(format!("/t/{}", i % 40), "x", None),
                    TxnOp::put(format!("/u/{}", i % 40), vec![b'u'; 700], None),
                    TxnOp::delete(format!("/new/{:05}", i - 1), None),
                ]))
                .await
                .unwrap();
            }
            _ => {
                c.put(format!("/new/{i:05}"), vec![b'n'; 1024], None)
                    .await
                    .unwrap();
            }
        }
    }
    let last = live.revision().await;
    let cluster = u64::from_str_radix(&m.cluster_id, 16).unwrap();
    let segments =
        archive::archive(&mut c, store, cluster, m.revision + 1, last, 700, time_of).await;
    (live, m, file, segments, last)
}

/// Replays every segment onto snapshot `m` (its local `file`) with `setup` into `out`:
/// every archived revision up to `last` applied, none stopped.
async fn replayed_to_the_end(
    store: &Store,
    m: &Manifest,
    file: &Path,
    segments: &[SegmentManifest],
    last: i64,
    setup: &ReplaySetup,
    out: &Path,
) -> Replayed {
    let r = replay::replay(store, file, &m.name, segments, Target::End, setup, out)
        .await
        .unwrap();
    assert_eq!((r.last_revision, r.stopped.clone()), (last, None), "{r:?}");
    assert_eq!(r.revisions, u64::try_from(last - m.revision).unwrap());
    r
}

#[tokio::test]
async fn a_replay_written_into_the_snapshots_file_is_what_etcd_itself_made_of_the_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (live, m, file, segments, last) = written_large(dir.path(), &store).await;
    let expected = keyspace(&mut live.client().await, None).await;
    let live_hash = hash_at(&live, last).await;
    for method in [Method::File, Method::Api] {
        let out = dir.path().join(format!("folded-{method:?}.db"));
        let setup = ReplaySetup {
            method,
            ..setup(dir.path())
        };
        let r = replayed_to_the_end(&store, &m, &file, &segments, last, &setup, &out).await;
        assert_eq!(r.method, method, "{r:?}");
        let restored = started_from(&out, dir.path(), &format!("restored-{method:?}")).await;
        assert_eq!(restored.revision().await, last, "{method:?}");
        assert_eq!(
            hash_at(&restored, last).await,
            live_hash,
            "{method:?}: HashKV at {last}"
        );
        let mut c = restored.client().await;
        let got = keyspace(&mut c, None).await;
        assert_eq!(got.len(), expected.len(), "{method:?}");
        assert!(
            got == expected,
            "{method:?}: the keyspace differs from the live one"
        );
        let leased: Vec<&Kv> = got.iter().filter(|kv| kv.5 != 0).collect();
        let leases: std::collections::BTreeSet<i64> = leased.iter().map(|kv| kv.5).collect();
        assert_eq!(
            leases.len(),
            2,
            "keys on the old and the new lease: {leased:?}"
        );
        for kv in leased {
            let ttl = c.lease_time_to_live(kv.5, None).await.unwrap();
            assert!(
                [30, 45].contains(&ttl.granted_ttl()),
                "lease {:x}: {}",
                kv.5,
                ttl.granted_ttl()
            );
            assert!(ttl.ttl() > 0, "the lease is alive after the restore");
        }
    }
}

/// The file a restore that moves the revision forward uses: of each key the archive
/// touches, only its last write. Restored as such a restore does (`--bump-revision
/// --mark-compacted`), it serves the live keyspace key by key (values, creation and
/// modification revisions, versions, leases) at the jumped revision, exactly as the
/// whole-history file does, and it is the smaller of the two.
#[tokio::test]
async fn a_replay_of_last_writes_restored_with_the_jump_serves_what_the_whole_history_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (live, m, file, segments, last) = written_large(dir.path(), &store).await;
    let expected = keyspace(&mut live.client().await, None).await;
    let mut sizes = Vec::new();
    for history in [History::Full, History::Latest] {
        let out = dir.path().join(format!("folded-{history:?}.db"));
        let setup = ReplaySetup {
            history,
            ..setup(dir.path())
        };
        let r = replayed_to_the_end(&store, &m, &file, &segments, last, &setup, &out).await;
        assert_eq!(
            (r.method, r.history, r.last_revision, r.stopped.clone()),
            (Method::File, history, last, None),
            "{r:?}"
        );
        sizes.push(std::fs::metadata(&out).unwrap().len());
        let name = format!("jumped-{history:?}");
        let restored = started_with(&out, dir.path(), &name, 1000).await;
        assert_eq!(restored.revision().await, last + 1000, "{history:?}");
        let mut c = restored.client().await;
        let got = keyspace(&mut c, None).await;
        assert_eq!(got.len(), expected.len(), "{history:?}");
        assert!(
            got == expected,
            "{history:?}: the keyspace differs from the live one"
        );
        let old = c
            .get("/old/00001", Some(GetOptions::new().with_revision(last)))
            .await;
        assert!(
            old.as_ref()
                .is_err_and(|e| e.to_string().contains("compacted")),
            "{history:?}: revision {last} is compacted after the jump: {old:?}"
        );
    }
    assert!(
        sizes[1] < sizes[0],
        "the file of last writes ({} bytes) is smaller than the whole history ({} bytes)",
        sizes[1],
        sizes[0]
    );
}

#[tokio::test]
async fn a_replay_onto_the_snapshot_of_a_member_never_written_goes_into_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let live = Etcd::start("empty", &dir.path().join("empty"), free_port()).await;
    let (m, file) = snapshot_of(&live, &store, dir.path()).await;
    drop(live);
    // etcd's first revision is 1 with no key written: the archive continues at 2.
    assert_eq!(m.revision, 1);
    let revs: Vec<Revision> = (2..=401)
        .map(|r| Revision {
            revision: r,
            time_unix_ms: time_of(r),
            ops: vec![Op::Put {
                key: format!("/k/{:03}", r % 100).into_bytes(),
                value: vec![b'v'; 300],
                lease: 0,
            }],
        })
        .collect();
    let segments = archive::put_segments(&store, 0xc1, &revs, &Default::default(), 150).await;
    let out = dir.path().join("folded.db");
    let r = replay::replay(
        &store,
        &file,
        &m.name,
        &segments,
        Target::End,
        &setup(dir.path()),
        &out,
    )
    .await
    .unwrap();
    assert_eq!(
        (r.method, r.last_revision, r.revisions),
        (Method::File, 401, 400),
        "{r:?}"
    );
    let restored = started_from(&out, dir.path(), "restored").await;
    let got = keyspace(&mut restored.client().await, None).await;
    assert_eq!(got.len(), 100);
    // "/k/001" was written at 101, 201, 301 and 401: created at 101, version 4.
    assert_eq!(
        (got[1].2, got[1].3, got[1].4),
        (101, 401, 4),
        "{:?}",
        got[1]
    );
}

#[tokio::test]
async fn a_replay_to_a_revision_or_to_a_time_stops_at_the_last_revision_not_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (live, m, file, segments, last) = written(dir.path(), &store, 4).await;
    let mid = m.revision + 5;
    assert!(mid < last);
    let expected = keyspace(&mut live.client().await, Some(mid)).await;
    let by_revision = replayed(
        &store,
        &m,
        &file,
        &segments,
        Target::Revision(mid),
        dir.path(),
    )
    .await;
    assert_eq!(
        (by_revision.last_revision, by_revision.stopped),
        (mid, None)
    );
    let restored = started_from(&by_revision.file, dir.path(), "by-revision").await;
    assert_eq!(keyspace(&mut restored.client().await, None).await, expected);
    drop(restored);
    // Half a second after revision `mid` was received: `mid` is the last one at or before.
    let at = Target::Time {
        unix_ms: time_of(mid) + 500,
    };
    let by_time = replayed(&store, &m, &file, &segments, at, dir.path()).await;
    assert_eq!(by_time.last_revision, mid);
    assert_eq!(by_time.last_time_unix_ms, Some(time_of(mid)));
    let restored = started_from(&by_time.file, dir.path(), "by-time").await;
    assert_eq!(keyspace(&mut restored.client().await, None).await, expected);
    // Beyond the archive: said, not silently short.
    let beyond = replayed(
        &store,
        &m,
        &file,
        &segments,
        Target::Revision(last + 10),
        dir.path(),
    )
    .await;
    assert_eq!(
        beyond.stopped,
        Some(EarlyStop::ArchiveEnds {
            last,
            target: last + 10
        })
    );
}

#[tokio::test]
async fn a_corrupted_segment_ends_the_replay_before_it_and_what_was_verified_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (live, m, file, segments, _) = written(dir.path(), &store, 3).await;
    assert!(segments.len() >= 3, "{segments:?}");
    let bad = &segments[1];
    let path = dir.path().join("store").join(bad.seg_object());
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let r = replayed(&store, &m, &file, &segments, Target::End, dir.path()).await;
    match &r.stopped {
        Some(EarlyStop::BadSegment { name, error }) => {
            assert_eq!(name, &bad.name);
            assert!(error.contains("checksum"), "{error}");
        }
        other => panic!("not stopped by the bad segment: {other:?}"),
    }
    assert_eq!(r.last_revision, segments[0].last_revision);
    assert_eq!(r.segments, vec![segments[0].name.clone()]);
    let expected = keyspace(&mut live.client().await, Some(segments[0].last_revision)).await;
    let restored = started_from(&r.file, dir.path(), "restored").await;
    assert_eq!(keyspace(&mut restored.client().await, None).await, expected);
}

/// Replay speed (BENCHMARKS.md): an empty member's snapshot, then `N` revisions each
/// putting a 1 KiB value (1,000 keys overwritten in turn), in segments of 2,000.
/// `cargo test --release --test archive_replay -- --ignored --nocapture replay_speed`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn replay_speed_with_1_kib_values() {
    let n: i64 = std::env::var("REPLAY_SPEED_REVISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let live = Etcd::start("empty", &dir.path().join("empty"), free_port()).await;
    let (m, file) = snapshot_of(&live, &store, dir.path()).await;
    drop(live);
    let base = m.revision;
    let revs: Vec<Revision> = (1..=n)
        .map(|i| Revision {
            revision: base + i,
            time_unix_ms: time_of(base + i),
            ops: vec![Op::Put {
                key: format!("/bench/{:04}", i % 1000).into_bytes(),
                value: vec![b'v'; 1024],
                lease: 0,
            }],
        })
        .collect();
    let segments = archive::put_segments(&store, 0xc1, &revs, &Default::default(), 2000).await;
    let (cpu_self, cpu_children) = (cpu_seconds("self"), children_cpu_seconds());
    println!("load average before: {}", load_average());
    let method = match std::env::var("REPLAY_SPEED_METHOD").as_deref() {
        Ok("api") => Method::Api,
        _ => Method::File,
    };
    let setup = ReplaySetup {
        method,
        ..setup(dir.path())
    };
    let out = dir.path().join("folded.db");
    let started = std::time::Instant::now();
    let r = replay::replay(&store, &file, &m.name, &segments, Target::End, &setup, &out)
        .await
        .unwrap();
    let total = started.elapsed();
    assert_eq!(r.method, method);
    assert_eq!((r.last_revision, r.stopped.clone()), (base + n, None));
    println!(
        "replay ({:?}): {} revisions applied in {:.2?} = {:.0} revisions/s, {} resent, {} overtaken (whole replay incl. restore, start, snapshot: {:.2?} = {:.0} revisions/s); CPU s: test process {:.2}, etcd and etcdutl {:.2}; load average after: {}",
        r.method,
        r.revisions,
        r.applying,
        r.revisions as f64 / r.applying.as_secs_f64(),
        r.resent,
        r.overtaken,
        total,
        r.revisions as f64 / total.as_secs_f64(),
        cpu_seconds("self") - cpu_self,
        children_cpu_seconds() - cpu_children,
        load_average(),
    );
}

/// Issue 26's restore of "a 1 GiB snapshot plus one hour of 100 writes/s": a member
/// loaded with `REPLAY_LARGE_MIB` MiB (default 1024) of 1 KiB values, its snapshot, then
/// `REPLAY_LARGE_REVISIONS` (default 360,000) archived revisions, each one put of a 1 KiB
/// value over one of the loaded keys; the replay onto the snapshot, timed, by
/// `REPLAY_SPEED_METHOD` (`file`, the default, or `api`). What a restore adds to the
/// snapshot-only restore is this replay (each pod runs it before its restore).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn replay_of_a_large_snapshot_and_an_hour_of_writes() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let mib = env("REPLAY_LARGE_MIB", 1024);
    let revisions = env("REPLAY_LARGE_REVISIONS", 360_000) as i64;
    let keys = mib * 1024;
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let live = Etcd::start_with(
        "large",
        &dir.path().join("large"),
        free_port(),
        &["--quota-backend-bytes=8589934592", "--unsafe-no-fsync"],
    )
    .await;
    let mut c = live.client().await;
    let loading = std::time::Instant::now();
    for chunk in 0..keys.div_ceil(128) {
        let ops: Vec<TxnOp> = (chunk * 128..((chunk + 1) * 128).min(keys))
            .map(|i| TxnOp::put(format!("/load/{i:08}"), vec![b'l'; 1024], None))
            .collect();
        c.txn(Txn::new().and_then(ops)).await.unwrap();
    }
    println!("loaded {keys} keys of 1 KiB in {:.1?}", loading.elapsed());
    let (m, file) = snapshot_of(&live, &store, dir.path()).await;
    drop(live);
    let size = std::fs::metadata(&file).unwrap().len();
    let base = m.revision;
    let revs: Vec<Revision> = (1..=revisions)
        .map(|i| Revision {
            revision: base + i,
            time_unix_ms: time_of(base + i),
            ops: vec![Op::Put {
                key: format!("/load/{:08}", (i as u64 * 7919) % keys).into_bytes(),
                value: vec![b'w'; 1024],
                lease: 0,
            }],
        })
        .collect();
    let segments = archive::put_segments(&store, 0xc1, &revs, &Default::default(), 4000).await;
    drop(revs);
    let method = match std::env::var("REPLAY_SPEED_METHOD").as_deref() {
        Ok("api") => Method::Api,
        _ => Method::File,
    };
    // REPLAY_HISTORY=full|latest: one of the two files; both, one after the other, without.
    let histories = match std::env::var("REPLAY_HISTORY").as_deref() {
        Ok("full") => vec![History::Full],
        Ok("latest") => vec![History::Latest],
        _ => vec![History::Full, History::Latest],
    };
    for history in histories {
        let setup = ReplaySetup {
            method,
            history,
            start_timeout: Duration::from_secs(300),
            ..setup(dir.path())
        };
        let out = dir.path().join(format!("folded-{history:?}.db"));
        println!("load average before: {}", load_average());
        let started = std::time::Instant::now();
        let r = replay::replay(&store, &file, &m.name, &segments, Target::End, &setup, &out)
            .await
            .unwrap();
        let total = started.elapsed();
        assert_eq!(
            (r.method, r.last_revision, r.stopped.clone()),
            (method, base + revisions, None)
        );
        println!(
            "large replay ({:?}, {:?}): snapshot {} MiB at revision {base}, {} revisions in {} segments: applying {:.2?} ({:.0} revisions/s), checking and sealing {:.2?}, whole replay {:.2?} ({:.0} revisions/s); out {} MiB; load average after: {}",
            r.method,
            r.history,
            size >> 20,
            r.revisions,
            r.segments.len(),
            r.applying,
            r.revisions as f64 / r.applying.as_secs_f64(),
            r.sealing,
            total,
            r.revisions as f64 / total.as_secs_f64(),
            std::fs::metadata(&out).unwrap().len() >> 20,
            load_average(),
        );
        let _ = std::fs::remove_file(&out);
    }
}

// ---- the archive drill ---------------------------------------------------------------------

fn drill_setup(dir: &Path) -> DrillSetup {
    DrillSetup {
        tool: EtcdTool::from_bin(RELEASE.offline_tool()),
        etcd_bin: RELEASE.bin(),
        scratch_dir: dir.join("drill-scratch"),
        start_timeout: Duration::from_secs(30),
        auth: None,
    }
}

/// Drills snapshot `m` against `live` as the sidecar's round does, and returns the outcome,
/// the drill record the manifest now holds, and what the metrics counted.
async fn drilled(
    store: &Store,
    m: &Manifest,
    live: &Etcd,
    dir: &Path,
) -> (DrillOutcome, DrillRecord, BackupMetrics) {
    let source = EtcdSource::connect(&live.target()).await.unwrap();
    let now = SystemTime::now();
    let outcome = drill::drill(store, m, &drill_setup(dir), &source, now)
        .await
        .unwrap();
    let mut metrics = BackupMetrics::default();
    metrics.drilled(&outcome, now);
    let recorded = catalog::list(store)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.name == m.name)
        .unwrap();
    (outcome, recorded.drill.unwrap(), metrics)
}

#[tokio::test]
async fn the_drill_replays_the_encrypted_archive_and_matches_the_live_hash_at_its_last_revision() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key.txt");
    std::fs::write(&key_file, Key::generate_file()).unwrap();
    let key = Key::load(&key_file).unwrap();
    let store = store(dir.path()).with_keys(Keys {
        write: Some(key),
        read: vec![],
    });
    let (live, m, _, segments, last) = written(dir.path(), &store, 3).await;
    assert!(m.encryption.is_some() && segments.iter().all(|s| s.encryption.is_some()));
    let mut c = live.client().await;
    // Compacted inside the archive: the replayed copy is compacted there too before its hash.
    c.compact(m.revision + 3, None).await.unwrap();
    // Writes not archived yet do not change the hash at the archive's last revision.
    c.put("/not-archived", "x", None).await.unwrap();
    let (outcome, record, metrics) = drilled(&store, &m, &live, dir.path()).await;
    let a = outcome.archive.clone().expect("the archive is drilled");
    assert!(a.passed && outcome.passed_all(), "{a:?}");
    assert!(
        matches!(a.check, ArchiveCheck::Match { revision, .. } if revision == last),
        "{a:?}"
    );
    assert_eq!((a.last_revision, a.segments.len()), (last, segments.len()));
    assert_eq!(a.revisions, u64::try_from(last - m.revision).unwrap());
    assert_eq!(
        a.leases,
        LeaseCheck::Match { leases: 1 },
        "the lease of /leased/a and /leased/b: {a:?}"
    );
    assert!(
        a.detail.contains("the 1 leases the keys at"),
        "{}",
        a.detail
    );
    let recorded = record.archive.expect("recorded in the manifest");
    assert_eq!(
        (
            recorded.passed,
            recorded.hash_check.as_str(),
            recorded.last_revision
        ),
        (true, "match", last)
    );
    assert_eq!(metrics.drill_archive_last_revision, Some(last));
    assert_eq!(
        (metrics.drill_failures, metrics.drill_archive_failures),
        (0, 0)
    );
    assert!(
        !dir.path().join("drill-scratch/drill-archive").exists(),
        "scratch left behind"
    );
}

#[tokio::test]
async fn a_corrupted_segment_fails_the_archive_drill_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (live, m, _, segments, _) = written(dir.path(), &store, 3).await;
    assert!(segments.len() >= 3, "{segments:?}");
    let bad = &segments[1];
    let path = dir.path().join("store").join(bad.seg_object());
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let (outcome, record, metrics) = drilled(&store, &m, &live, dir.path()).await;
    assert!(outcome.passed, "the snapshot itself restores: {outcome:?}");
    let a = outcome.archive.clone().expect("the archive is drilled");
    assert!(!a.passed && !outcome.passed_all(), "{a:?}");
    assert_eq!(a.check, ArchiveCheck::NotRun);
    assert_eq!(a.last_revision, segments[0].last_revision);
    assert!(a.detail.contains(&bad.name), "{}", a.detail);
    assert!(a.detail.contains("checksum"), "{}", a.detail);
    let recorded = record.archive.expect("recorded in the manifest");
    assert!(!recorded.passed);
    assert!(recorded.detail.contains(&bad.name), "{}", recorded.detail);
    assert_eq!(
        (metrics.drill_failures, metrics.drill_archive_failures),
        (1, 1)
    );
    assert_eq!(metrics.drill_archive_last_revision, None);
    // `backup --drill` says so too, and fails.
    let scratch = dir.path().join("cli-scratch");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_etcd-steward"))
        .args(["backup", "--drill", "--name", "etcd-0", "--replicas", "1"])
        .args(["--listen-ip", "127.0.0.1"])
        .args(["--client-port", &live.client.to_string()])
        .args(["--peer-port", &live.peer.to_string()])
        .arg(format!(
            "--backup-url=file://{}",
            dir.path().join("store").display()
        ))
        .arg(format!("--etcd-bin={}", RELEASE.bin().display()))
        .arg(format!(
            "--etcdutl-bin={}",
            RELEASE.offline_tool().display()
        ))
        .arg(format!("--backup-scratch-dir={}", scratch.display()))
        .env("ETCD_STEWARD_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(line["passed"], true, "the snapshot restores: {line}");
    assert_eq!(line["archive"]["passed"], false, "{line}");
    assert_eq!(line["archive"]["hash_check"], "not_run", "{line}");
    let said = line["archive"]["detail"].as_str().unwrap();
    assert!(said.contains(&bad.name), "{said}");
}

#[tokio::test]
async fn a_live_cluster_compacted_past_the_archive_skips_the_archive_hash_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let (live, m, _, _, last) = written(dir.path(), &store, 4).await;
    let mut c = live.client().await;
    c.put("/after-the-archive", "1", None).await.unwrap();
    c.put("/after-the-archive", "2", None).await.unwrap();
    c.compact(last + 2, None).await.unwrap();
    let (outcome, record, metrics) = drilled(&store, &m, &live, dir.path()).await;
    let a = outcome.archive.clone().expect("the archive is drilled");
    assert!(a.passed, "a skip is not a failure: {a:?}");
    assert_eq!(a.last_revision, last, "every segment still replayed");
    match &a.check {
        ArchiveCheck::Skipped { reason } => {
            assert!(
                reason.contains(&format!("revision {last} is compacted away")),
                "{reason}"
            )
        }
        other => panic!("not skipped: {other:?}"),
    }
    let recorded = record.archive.expect("recorded in the manifest");
    assert_eq!(
        (recorded.passed, recorded.hash_check.as_str()),
        (true, "skipped")
    );
    assert!(
        recorded.detail.contains("compacted away"),
        "{}",
        recorded.detail
    );
    assert_eq!(metrics.drill_archive_failures, 0);
}

#[tokio::test]
async fn an_archive_whose_lease_ttl_differs_from_the_live_one_fails_the_drill_naming_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let live = Etcd::start("live", &dir.path().join("live"), free_port()).await;
    let mut c = live.client().await;
    c.put("/k/0", "v", None).await.unwrap();
    let (m, _) = snapshot_of(&live, &store, dir.path()).await;
    let lease = c.lease_grant(40, None).await.unwrap().id();
    let leased = Some(PutOptions::new().with_lease(lease));
    c.put("/leased/a", "a", leased.clone()).await.unwrap();
    c.put("/k/1", "v", None).await.unwrap();
    c.put("/leased/b", "b", leased).await.unwrap();
    let last = live.revision().await;
    let (revs, mut leases) = archive::revisions(&mut c, m.revision + 1, last, time_of).await;
    assert_eq!(leases.get(&lease), Some(&40), "the archiver's record");
    // The archive says another TTL than the lease was granted: the replay grants that one,
    // the keys (and so `HashKV`) are the same.
    leases.insert(lease, 90);
    let cluster = u64::from_str_radix(&m.cluster_id, 16).unwrap();
    archive::put_segments(&store, cluster, &revs, &leases, 2).await;
    let (outcome, record, metrics) = drilled(&store, &m, &live, dir.path()).await;
    assert!(outcome.passed, "the snapshot itself restores: {outcome:?}");
    let a = outcome.archive.clone().expect("the archive is drilled");
    assert!(!a.passed && !outcome.passed_all(), "{a:?}");
    assert!(
        matches!(a.check, ArchiveCheck::Match { revision, .. } if revision == last),
        "the hash does not see the lease bucket: {a:?}"
    );
    assert_eq!(a.leases.word(), "mismatch", "{a:?}");
    let said =
        format!("lease {lease:x} is granted 90 s in the replayed etcd, 40 s on the live cluster");
    assert!(a.detail.contains(&said), "{}", a.detail);
    let recorded = record.archive.expect("recorded in the manifest");
    assert!(
        !recorded.passed && recorded.detail.contains(&said),
        "{recorded:?}"
    );
    assert_eq!(metrics.drill_archive_failures, 1);
}

#[tokio::test]
async fn the_restore_drill_compares_the_restored_leases_with_the_live_ones_at_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let live = Etcd::start("live", &dir.path().join("live"), free_port()).await;
    let mut c = live.client().await;
    let lease = c.lease_grant(40, None).await.unwrap().id();
    let leased = Some(PutOptions::new().with_lease(lease));
    c.put("/leased/a", "a", leased.clone()).await.unwrap();
    c.put("/leased/b", "b", leased).await.unwrap();
    let (m, _) = snapshot_of(&live, &store, dir.path()).await;
    // After the snapshot: another key on the lease, and a lease the snapshot never saw.
    let later = c.lease_grant(50, None).await.unwrap().id();
    c.put("/leased/c", "c", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    c.put("/later", "x", Some(PutOptions::new().with_lease(later)))
        .await
        .unwrap();
    let (outcome, record, _) = drilled(&store, &m, &live, dir.path()).await;
    assert!(outcome.passed, "{outcome:?}");
    assert_eq!(
        outcome.leases,
        LeaseCheck::Match { leases: 1 },
        "{outcome:?}"
    );
    assert!(
        record
            .detail
            .contains("the 1 leases its keys name match the live cluster's"),
        "{}",
        record.detail
    );
}

/// CPU seconds (user + system) of process `pid` ("self": this one), from `/proc`.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// CPU seconds of this process's reaped children (the scratch etcd, etcdutl).
fn children_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[13].parse::<f64>().unwrap() + fields[14].parse::<f64>().unwrap();
    ticks / 100.0
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default()
}

/// The ceiling of etcd itself (BENCHMARKS.md, archive replay speed): one member started as
/// the replay's scratch etcd is (`--unsafe-no-fsync`), `clients` concurrent clients each
/// sending single-put transactions of 1 KiB one after another (no guard), over
/// `connections` HTTP/2 connections, for 3 s each.
/// `cargo test --test archive_replay -- --ignored --nocapture etcd_ceiling`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn etcd_ceiling_for_single_put_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start_with(
        "ceiling",
        &dir.path().join("ceiling"),
        free_port(),
        &["--unsafe-no-fsync"],
    )
    .await;
    let etcd_pid = etcd.child.id().to_string();
    println!("load average before: {}", load_average());
    for (clients, connections) in [
        (1, 1),
        (8, 1),
        (32, 1),
        (64, 1),
        (128, 1),
        (64, 4),
        (64, 16),
    ] {
        let mut conns = Vec::new();
        for _ in 0..connections {
            conns.push(etcd.client().await.kv_client());
        }
        let (cpu_self, cpu_etcd) = (cpu_seconds("self"), cpu_seconds(&etcd_pid));
        let started = std::time::Instant::now();
        let until = started + Duration::from_secs(3);
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..clients {
            let mut kv = conns[c % connections].clone();
            tasks.spawn(async move {
                let mut n = 0u64;
                while std::time::Instant::now() < until {
                    let key = format!("/ceiling/{c}/{}", n % 100);
                    let txn = Txn::new().and_then([TxnOp::put(key, vec![b'v'; 1024], None)]);
                    kv.txn(txn).await.unwrap();
                    n += 1;
                }
                n
            });
        }
        let mut total = 0;
        while let Some(n) = tasks.join_next().await {
            total += n.unwrap();
        }
        let took = started.elapsed().as_secs_f64();
        println!(
            "ceiling: {clients:>3} clients over {connections:>2} connections: {:>6.0} transactions/s; CPU s per 1,000: test process {:.3}, etcd {:.3}",
            total as f64 / took,
            (cpu_seconds("self") - cpu_self) * 1000.0 / total as f64,
            (cpu_seconds(&etcd_pid) - cpu_etcd) * 1000.0 / total as f64,
        );
    }
    println!("load average after: {}", load_average());
}
