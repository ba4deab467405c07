//! Backups against real parts: single-member etcd 3.5.1 and 3.4.23 started here on
//! 127.0.0.1, an S3-compatible server (moto's server mode, on a loopback port) and
//! `file://` stores in temporary directories. Run under the machine-wide lock:
//! `flock /tmp/steward-it.lock cargo test --test backup`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use etcd_client::{Client, ConnectOptions, GetOptions};
use etcd_steward::backup::drill::{self, DrillSetup, HashCheck};
use etcd_steward::backup::manifest::{self, Manifest};
use etcd_steward::backup::restore::{self, Pick, RestoreError, RestoreOutcome, Restored};
use etcd_steward::backup::snapshot::{self, EtcdSource, EtcdTarget, FakeSource};
use etcd_steward::backup::store::Store;
use etcd_steward::backup::tool::{EtcdTool, MemberParams};
use etcd_steward::backup::{catalog, RestoreChoice};

// ---- the parts ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Release {
    V35,
    /// etcd 3.5.30 (`.tools/etcd-v3.5.30`), the newest 3.5 here.
    V3530,
    V34,
}

impl Release {
    fn etcd(self) -> PathBuf {
        match self {
            Release::V35 => Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/etcd-v3.5.1/etcd"),
            Release::V3530 => {
                Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/etcd-v3.5.30/etcd")
            }
            Release::V34 => PathBuf::from("/usr/bin/etcd"),
        }
    }

    fn tool(self) -> EtcdTool {
        match self {
            Release::V35 => EtcdTool::from_bin(
                Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/etcd-v3.5.1/etcdutl"),
            ),
            Release::V3530 => EtcdTool::from_bin(
                Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/etcd-v3.5.30/etcdutl"),
            ),
            Release::V34 => EtcdTool::from_bin("/usr/bin/etcdctl"),
        }
    }
}

/// A port no other listener of this machine holds, below the kernel's ephemeral range
/// (32768 and up), so neither another test's `bind(0)` nor an outgoing connection's
/// source port can take it between this check and etcd's own bind. Each test process
/// starts from its own place in 20000–32000 and never hands out the same port twice.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicU32::new((std::process::id() * 97) % SPAN));
    loop {
        let port = (LOW + next.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// One etcd member on 127.0.0.1, killed on drop.
struct Etcd {
    child: Child,
    client: u16,
    peer: u16,
}

impl Etcd {
    /// Starts a member named `name` on `data` (new, or restored for `peer`).
    async fn start(release: Release, name: &str, data: &Path, peer: Option<u16>) -> Etcd {
        let client = free_port();
        let peer = peer.unwrap_or_else(free_port);
        let peer_url = format!("http://127.0.0.1:{peer}");
        let client_url = format!("http://127.0.0.1:{client}");
        let log = data.with_extension("etcd.log");
        let child = Command::new(release.etcd())
            .arg(format!("--name={name}"))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={name}={peer_url}"))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut etcd = Etcd {
            child,
            client,
            peer,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = etcd.try_client().await {
                if c.get("probe", None).await.is_ok() {
                    return etcd;
                }
            }
            if let Some(exit) = etcd.child.try_wait().unwrap() {
                panic!("etcd {name} exited ({exit}): {}", tail(&log));
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "etcd {name} did not serve in 30 s: {}",
                tail(&log)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn try_client(&self) -> Result<Client, etcd_client::Error> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(5));
        Client::connect([format!("http://127.0.0.1:{}", self.client)], Some(options)).await
    }

    async fn client(&self) -> Client {
        self.try_client().await.unwrap()
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

    async fn source(&self) -> EtcdSource {
        EtcdSource::connect(&self.target()).await.unwrap()
    }

    /// Writes `n` keys `<prefix>NNNN`; returns the last revision.
    async fn put_keys(&self, prefix: &str, n: usize) -> i64 {
        let mut c = self.client().await;
        let mut rev = 0;
        for i in 0..n {
            let r = c
                .put(format!("{prefix}{i:04}"), format!("value-{i}"), None)
                .await
                .unwrap();
            rev = r.header().unwrap().revision();
        }
        rev
    }

    async fn keys(&self, prefix: &str) -> Vec<(String, String)> {
        let mut c = self.client().await;
        let r = c
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        r.kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key_str().unwrap().to_string(),
                    kv.value_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

/// The last lines etcd wrote to `log`, for a failure message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh bucket on the moto server; the URL of a prefix in it.
fn s3_url(bucket: &str) -> String {
    harness::moto::s3_url(bucket, "etcd/backups")
}

fn file_url(dir: &Path) -> String {
    format!("file://{}/store", dir.display())
}

fn member(name: &str, peer: u16) -> MemberParams {
    let peer_url = format!("http://127.0.0.1:{peer}");
    MemberParams {
        name: name.into(),
        initial_cluster: format!("{name}={peer_url}"),
        token: "restored-token".into(),
        peer_url,
    }
}

// ---- round trips ---------------------------------------------------------------------------

/// Keys written → snapshot into the store → restore into an empty directory → an etcd
/// started on it holds every key.
async fn round_trip(release: Release, url: String) {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(release, "live", &work.path().join("live"), None).await;
    let rev = live.put_keys("/k/", 200).await;
    let store = Store::open(&url).unwrap();
    let m = snapshot::take(&live.source().await, &store, SystemTime::now())
        .await
        .unwrap();
    assert!(m.verified, "{m:?}");
    assert_eq!(m.revision, rev);
    assert_eq!(catalog::list(&store).await.unwrap(), vec![m.clone()]);
    let written = live.keys("/k/").await;
    drop(live);

    let data = work.path().join("restored");
    std::fs::create_dir_all(data.join("member/steward")).unwrap();
    std::fs::write(data.join("member/steward/formation.json"), "{}").unwrap();
    let peer = free_port();
    let outcome = restore::restore(
        &store,
        &RestoreChoice::Latest,
        &release.tool(),
        &member("restored", peer),
        &data,
    )
    .await
    .unwrap();
    match outcome {
        RestoreOutcome::Restored { manifest } => assert_eq!(manifest.name, m.name),
        other => panic!("expected a restore, got {other:?}"),
    }
    assert!(restore::has_wal(&data).unwrap());
    assert!(
        data.join("member/steward/formation.json").exists(),
        "init's formation marker is kept"
    );
    assert!(!restore::staging_dir(&data).exists(), "staging cleaned up");
    let restored = Etcd::start(release, "restored", &data, Some(peer)).await;
    assert_eq!(restored.keys("/k/").await, written);
    assert_eq!(written.len(), 200);
}

#[tokio::test]
async fn snapshot_round_trip_restores_every_key_on_file_store_with_etcd_3_5() {
    let dir = tempfile::tempdir().unwrap();
    round_trip(Release::V35, file_url(dir.path())).await;
}

#[tokio::test]
async fn snapshot_round_trip_restores_every_key_on_file_store_with_etcd_3_4() {
    let dir = tempfile::tempdir().unwrap();
    round_trip(Release::V34, file_url(dir.path())).await;
}

#[tokio::test]
async fn snapshot_round_trip_restores_every_key_on_s3_with_etcd_3_5() {
    round_trip(Release::V35, s3_url("round-trip-35")).await;
}

#[tokio::test]
async fn snapshot_round_trip_restores_every_key_on_s3_with_etcd_3_4() {
    round_trip(Release::V34, s3_url("round-trip-34")).await;
}

// ---- choosing what to restore ---------------------------------------------------------------

/// Takes a snapshot of `live` dated `secs` after the epoch (so names order as wanted).
async fn take_at(live: &Etcd, store: &Store, secs: u64) -> Manifest {
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs);
    snapshot::take(&live.source().await, store, at)
        .await
        .unwrap()
}

fn flip_a_byte(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x55;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn a_corrupted_newest_snapshot_is_skipped_for_the_next_newest() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    live.put_keys("/a/", 20).await;
    let url = file_url(work.path());
    let store = Store::open(&url).unwrap();
    let older = take_at(&live, &store, 0).await;
    live.put_keys("/b/", 20).await;
    let newest = take_at(&live, &store, 60).await;
    flip_a_byte(
        &work.path().join("store").join(newest.db_object()),
        newest.size / 2,
    );
    let dir = work.path().join("download");
    match restore::pick(&store, &RestoreChoice::Latest, &dir)
        .await
        .unwrap()
    {
        Pick::Chosen { manifest, file } => {
            assert_eq!(manifest.name, older.name);
            assert!(file.exists());
        }
        other => panic!("expected the older snapshot, got {other:?}"),
    }
    // Asked for by name, the corrupted one is refused: backups exist, none usable.
    match restore::pick(&store, &RestoreChoice::Named(newest.name.clone()), &dir)
        .await
        .unwrap()
    {
        Pick::NoneUsable { skipped } => {
            assert_eq!(skipped.len(), 1);
            assert!(skipped[0].1.contains("checksum"), "{skipped:?}");
        }
        other => panic!("expected none usable, got {other:?}"),
    }
}

#[tokio::test]
async fn backups_that_all_fail_their_checksum_are_none_usable_not_no_backups() {
    let work = tempfile::tempdir().unwrap();
    let store = Store::open(&file_url(work.path())).unwrap();
    let dir = work.path().join("download");
    assert!(matches!(
        restore::pick(&store, &RestoreChoice::Latest, &dir)
            .await
            .unwrap(),
        Pick::NoBackups
    ));
    let mut bad = FakeSource::new(&[1u8; 4096], 9);
    bad.stream[100] ^= 1;
    snapshot::take(&bad, &store, SystemTime::UNIX_EPOCH)
        .await
        .unwrap();
    assert!(matches!(
        restore::pick(&store, &RestoreChoice::Latest, &dir)
            .await
            .unwrap(),
        Pick::NoneUsable { .. }
    ));
    assert!(matches!(
        restore::pick(&store, &RestoreChoice::Never, &dir)
            .await
            .unwrap(),
        Pick::Disabled
    ));
}

#[tokio::test]
async fn an_incomplete_upload_without_manifest_is_ignored_then_pruned() {
    let work = tempfile::tempdir().unwrap();
    let store = Store::open(&file_url(work.path())).unwrap();
    let orphan = manifest::db_object("20231114T221320.000Z-r5");
    store.put(&orphan, vec![0u8; 64]).await.unwrap();
    let src = FakeSource::new(&[2u8; 1000], 7);
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let m = snapshot::take(&src, &store, at).await.unwrap();
    assert_eq!(catalog::list(&store).await.unwrap(), vec![m.clone()]);
    let dir = work.path().join("download");
    match restore::pick(&store, &RestoreChoice::Latest, &dir)
        .await
        .unwrap()
    {
        Pick::Chosen { manifest, .. } => assert_eq!(manifest.name, m.name),
        other => panic!("{other:?}"),
    }
    assert_eq!(catalog::prune(&store, 5).await.unwrap(), vec![orphan]);
    let left: Vec<String> = store
        .list(manifest::DIR)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

#[tokio::test]
async fn retention_keeps_n_and_never_the_newest_verified_on_s3() {
    let store = Store::open(&s3_url("retention")).unwrap();
    let good = FakeSource::new(&[3u8; 2000], 1);
    let mut bad = good.clone();
    bad.stream[0] ^= 1;
    let at = |i: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + i * 60);
    let mut names = Vec::new();
    for i in 0..4 {
        names.push(snapshot::take(&good, &store, at(i)).await.unwrap().name);
    }
    for i in 4..6 {
        let m = snapshot::take(&bad, &store, at(i)).await.unwrap();
        assert!(!m.verified);
        names.push(m.name);
    }
    let deleted = catalog::prune(&store, 1).await.unwrap();
    assert_eq!(deleted.len(), 8, "{deleted:?}");
    let kept: Vec<String> = catalog::list(&store)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    // The newest (unverified) and the newest verified one.
    assert_eq!(kept, vec![names[5].clone(), names[3].clone()]);
    assert!(catalog::prune(&store, 1).await.unwrap().is_empty());
}

// ---- restore safety -------------------------------------------------------------------------

#[tokio::test]
async fn restore_refuses_a_volume_holding_a_wal() {
    let work = tempfile::tempdir().unwrap();
    let store = Store::open(&file_url(work.path())).unwrap();
    let src = FakeSource::new(&[4u8; 100], 1);
    snapshot::take(&src, &store, SystemTime::UNIX_EPOCH)
        .await
        .unwrap();
    let data = work.path().join("data");
    std::fs::create_dir_all(data.join("member/wal")).unwrap();
    let wal = data.join("member/wal/0000000000000000-0000000000000000.wal");
    std::fs::write(&wal, b"precious").unwrap();
    let err = restore::restore(
        &store,
        &RestoreChoice::Latest,
        &Release::V35.tool(),
        &member("m", 1),
        &data,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RestoreError::HasData { .. }), "{err}");
    assert_eq!(std::fs::read(&wal).unwrap(), b"precious");
    assert!(!restore::staging_dir(&data).exists(), "nothing written");
}

/// A restore killed after each of its steps finishes on a re-run, and the result holds
/// every key.
#[tokio::test]
async fn a_restore_killed_midway_completes_on_rerun() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    live.put_keys("/k/", 50).await;
    let written = live.keys("/k/").await;
    let store = Store::open(&file_url(work.path())).unwrap();
    let m = take_at(&live, &store, 0).await;
    drop(live);
    let tool = Release::V35.tool();
    let snapshot_file = work.path().join("snap.db");
    restore::fetch_verified(&store, &m, &snapshot_file)
        .await
        .unwrap();

    for killed_after in ["tool-partial", "tool-done", "snap-moved", "wal-moved"] {
        let data = work.path().join(format!("data-{killed_after}"));
        let staging = restore::staging_dir(&data);
        let peer = free_port();
        let params = member("restored", peer);
        // Leave the state that step leaves.
        std::fs::create_dir_all(&staging).unwrap();
        let out = staging.join("out");
        if killed_after == "tool-partial" {
            std::fs::create_dir_all(out.join("member/snap")).unwrap();
            std::fs::write(out.join("member/snap/db"), b"half").unwrap();
        } else {
            tool.restore(&snapshot_file, &params, &out).await.unwrap();
            std::fs::write(staging.join("out.complete"), &m.name).unwrap();
            if killed_after != "tool-done" {
                std::fs::rename(out.join("member/snap"), data.join("member/snap")).unwrap();
            }
            if killed_after == "wal-moved" {
                std::fs::rename(out.join("member/wal"), data.join("member/wal")).unwrap();
            }
        }
        let done = restore::restore_into(&tool, &snapshot_file, &m.name, &params, &data)
            .await
            .unwrap_or_else(|e| panic!("re-run after {killed_after}: {e}"));
        let expect = if killed_after == "wal-moved" {
            Restored::Earlier
        } else {
            Restored::Now
        };
        assert_eq!(done, expect, "after {killed_after}");
        assert!(!staging.exists(), "staging cleaned up after {killed_after}");
        assert!(
            snapshot_file.exists(),
            "the caller's snapshot file is not removed"
        );
        let restored = Etcd::start(Release::V35, "restored", &data, Some(peer)).await;
        assert_eq!(restored.keys("/k/").await, written, "after {killed_after}");
    }
}

// ---- the drill -----------------------------------------------------------------------------

fn drill_setup(release: Release, scratch: &Path) -> DrillSetup {
    DrillSetup {
        tool: release.tool(),
        etcd_bin: release.etcd(),
        scratch_dir: scratch.to_path_buf(),
        start_timeout: Duration::from_secs(30),
        auth: None,
    }
}

#[tokio::test]
async fn the_drill_passes_on_a_good_snapshot_and_records_it() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    let rev = live.put_keys("/k/", 30).await;
    let store = Store::open(&file_url(work.path())).unwrap();
    let m = take_at(&live, &store, 0).await;
    // Writes after the snapshot do not change the hash at the snapshot's revision.
    live.put_keys("/later/", 5).await;
    let source = live.source().await;
    let setup = drill_setup(Release::V35, &work.path().join("scratch"));
    let outcome = drill::drill(&store, &m, &setup, &source, SystemTime::now())
        .await
        .unwrap();
    assert!(outcome.passed, "{outcome:?}");
    assert_eq!(outcome.restored_revision, Some(rev));
    assert!(
        matches!(outcome.hash, HashCheck::Match { revision, .. } if revision == rev),
        "{outcome:?}"
    );
    let recorded = catalog::list(&store).await.unwrap().remove(0);
    assert!(recorded.drill.unwrap().passed);
    assert!(recorded.verified);
    assert!(!drill::work_dir(&setup.scratch_dir).exists());
}

/// A snapshot taken with etcd's authentication on restores with it on: the drill asks the
/// throw-away etcd with the cluster's credentials and compares hashes; without them it
/// fails, and says the restored etcd refused it rather than only that it was slow.
#[tokio::test]
async fn the_drill_of_a_snapshot_with_etcd_authentication_on_asks_with_the_credentials() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    let rev = live.put_keys("/k/", 10).await;
    let mut c = live.client().await;
    c.user_add("root", "s3cret", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.auth_enable().await.unwrap();
    let auth = Some(etcd_steward::etcd::Auth {
        username: "root".into(),
        password: "s3cret".into(),
    });
    let source = EtcdSource::connect(&EtcdTarget {
        auth: auth.clone(),
        ..live.target()
    })
    .await
    .unwrap();
    let store = Store::open(&file_url(work.path())).unwrap();
    let m = snapshot::take(&source, &store, SystemTime::now())
        .await
        .unwrap();
    let mut setup = drill_setup(Release::V35, &work.path().join("scratch"));
    setup.start_timeout = Duration::from_secs(5);
    let refused = drill::drill(&store, &m, &setup, &source, SystemTime::now())
        .await
        .unwrap();
    assert!(!refused.passed, "{refused:?}");
    assert!(
        refused.detail.contains("user name is empty"),
        "the drill says the restored etcd refused it: {refused:?}"
    );
    setup.auth = auth;
    let outcome = drill::drill(&store, &m, &setup, &source, SystemTime::now())
        .await
        .unwrap();
    assert!(outcome.passed, "{outcome:?}");
    assert!(
        matches!(outcome.hash, HashCheck::Match { revision, .. } if revision >= rev),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn the_drill_fails_on_a_corrupted_snapshot_and_marks_it_unverified() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V34, "live", &work.path().join("live"), None).await;
    live.put_keys("/k/", 30).await;
    let store = Store::open(&file_url(work.path())).unwrap();
    let m = take_at(&live, &store, 0).await;
    flip_a_byte(&work.path().join("store").join(m.db_object()), m.size / 2);
    let source = live.source().await;
    let setup = drill_setup(Release::V34, &work.path().join("scratch"));
    let outcome = drill::drill(&store, &m, &setup, &source, SystemTime::now())
        .await
        .unwrap();
    assert!(!outcome.passed, "{outcome:?}");
    assert!(outcome.corrupt);
    let recorded = catalog::list(&store).await.unwrap().remove(0);
    assert!(!recorded.verified);
    assert!(!recorded.drill.unwrap().passed);
}

#[tokio::test]
async fn the_drill_with_etcd_3_4_compares_hashes() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V34, "live", &work.path().join("live"), None).await;
    live.put_keys("/k/", 10).await;
    let store = Store::open(&file_url(work.path())).unwrap();
    let m = take_at(&live, &store, 0).await;
    let source = live.source().await;
    let setup = drill_setup(Release::V34, &work.path().join("scratch"));
    let outcome = drill::drill(&store, &m, &setup, &source, SystemTime::now())
        .await
        .unwrap();
    assert!(outcome.passed, "{outcome:?}");
    assert!(
        matches!(outcome.hash, HashCheck::Match { .. }),
        "{outcome:?}"
    );
}

// ---- the command -----------------------------------------------------------------------------

fn steward(live: &Etcd, url: &str, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_etcd-steward"));
    c.arg("backup")
        .args([
            "--name",
            "etcd-0",
            "--replicas",
            "1",
            "--listen-ip",
            "127.0.0.1",
        ])
        .args(["--client-port", &live.client.to_string()])
        .args(["--peer-port", &live.peer.to_string()])
        .args(["--backup-url", url])
        .args(extra)
        .env("ETCD_STEWARD_LOG", "warn")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[tokio::test]
async fn backup_command_prints_the_manifest_and_list_prints_newest_first() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    let url = file_url(work.path());
    let mut taken = Vec::new();
    for i in 0..2 {
        let rev = live.put_keys(&format!("/{i}/"), 5).await;
        let out = steward(&live, &url, &[], &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(stdout.lines().count(), 1, "{stdout}");
        let m: Manifest = serde_json::from_str(stdout.trim()).unwrap();
        assert!(m.verified);
        assert_eq!(m.revision, rev);
        taken.push(m);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = steward(&live, &url, &["--list"], &[]);
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["name"], taken[1].name.as_str());
    assert_eq!(lines[1]["name"], taken[0].name.as_str());
    for (line, m) in lines.iter().zip(taken.iter().rev()) {
        assert_eq!(line["revision"], m.revision);
        assert_eq!(line["sha256"], m.sha256.as_str());
        assert_eq!(line["size"], m.size);
        assert_eq!(line["verified"], true);
        assert_eq!(line["cluster_id"], m.cluster_id.as_str());
        assert_eq!(line["time"], m.time.as_str());
    }
    let etcd_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/etcd-v3.5.1");
    let scratch = work.path().join("scratch");
    let out = steward(
        &live,
        &url,
        &[
            "--drill",
            "--etcdutl-bin",
            etcd_dir.join("etcdutl").to_str().unwrap(),
            "--etcd-bin",
            etcd_dir.join("etcd").to_str().unwrap(),
            "--backup-scratch-dir",
            scratch.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome: serde_json::Value =
        serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    assert_eq!(outcome["passed"], true, "{outcome}");
    assert_eq!(outcome["hash_check"], "match", "{outcome}");
}

#[tokio::test]
async fn the_list_shows_how_far_each_snapshot_restores_through_the_archive() {
    use etcd_steward::backup::archive::segment::{Op, Revision, Segment};
    use etcd_steward::backup::archive::stored;
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    let url = file_url(work.path());
    live.put_keys("/a/", 3).await;
    let out = steward(&live, &url, &[], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: Manifest = serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    // Three revisions archived after the snapshot, of the same cluster.
    let store = Store::open(&url).unwrap();
    let cluster = u64::from_str_radix(&m.cluster_id, 16).unwrap();
    let segment = Segment {
        revisions: (1..=3)
            .map(|i| Revision {
                revision: m.revision + i,
                time_unix_ms: 1_795_000_000_000 + u64::try_from(i).unwrap(),
                ops: vec![Op::Delete {
                    key: format!("/a/{i}").into_bytes(),
                }],
            })
            .collect(),
        leases: Default::default(),
    };
    stored::put(&store, cluster, segment).await.unwrap();
    let out = steward(&live, &url, &["--list"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    assert_eq!(line["restorable"]["from_revision"], m.revision, "{line}");
    assert_eq!(line["restorable"]["to_revision"], m.revision + 3, "{line}");
    assert_eq!(line["restorable"]["segments"], 1, "{line}");
    let out = steward(&live, &url, &["--list", "-o", "text"], &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    let expected = format!(
        "restorable: revision {} ({}) to revision {} (2026-11-18T11:06:40.003Z)",
        m.revision,
        m.time,
        m.revision + 3
    );
    assert!(text.starts_with(&expected), "{expected:?} in {text}");
}

#[tokio::test]
async fn an_unreachable_store_is_a_clear_error_and_touches_nothing() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    live.put_keys("/k/", 10).await;
    let closed = free_port();
    let endpoint = format!("http://127.0.0.1:{closed}");
    let env = [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
    ];
    let started = std::time::Instant::now();
    let out = steward(&live, "s3://nowhere/etcd", &[], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("backup store s3://nowhere/etcd"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    // The cluster is unaffected: it still serves every key and takes writes.
    assert_eq!(live.keys("/k/").await.len(), 10);
    live.put_keys("/after/", 1).await;
}

// ---- the sidecar's periodic step ------------------------------------------------------------

#[tokio::test]
async fn the_leader_takes_one_snapshot_per_interval_and_a_new_leader_keeps_the_schedule() {
    use etcd_steward::backup::schedule::BackupMetrics;
    use etcd_steward::backup::{BackupConfig, Backups};
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    live.put_keys("/k/", 10).await;
    let cfg = BackupConfig {
        url: file_url(work.path()),
        interval: Duration::from_secs(60),
        archive_interval: None,
        keep: 2,
        tool: Release::V35.tool(),
        scratch_dir: work.path().join("scratch"),
        restore: RestoreChoice::Latest,
        keys: Default::default(),
        compression: Default::default(),
    };
    // Two sidecars (two pods) sharing one store.
    let a = Backups::new(&cfg, Release::V35.etcd()).unwrap();
    let b = Backups::new(&cfg, Release::V35.etcd()).unwrap();
    let src = live.source().await;
    let (mut ma, mut mb) = (BackupMetrics::default(), BackupMetrics::default());
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let at = |s: u64| t0 + Duration::from_secs(s);

    let first = a.tick(&src, true, t0, &mut ma).await.unwrap();
    let taken = first
        .taken
        .expect("the first tick of a leader takes a snapshot");
    let drilled = first.drilled.expect("a new snapshot is drilled");
    assert!(drilled.passed, "{drilled:?}");
    assert_eq!(ma.last_success, Some(1_800_000_000.0));
    assert_eq!(ma.verified_revision, Some(taken.revision));
    assert!(ma.drill_last_success.is_some());

    // A follower never takes one, however late.
    let r = b.tick(&src, false, at(500), &mut mb).await.unwrap();
    assert!(r.taken.is_none() && r.drilled.is_none());
    // The leader again, within the interval: nothing (and no second drill).
    let r = a.tick(&src, true, at(30), &mut ma).await.unwrap();
    assert!(r.taken.is_none() && r.drilled.is_none());
    // Leadership moves to b at 40: it follows the store's schedule — nothing before 60…
    let r = b.tick(&src, true, at(40), &mut mb).await.unwrap();
    assert!(r.taken.is_none());
    // …and one at 60.
    live.put_keys("/more/", 3).await;
    let r = b.tick(&src, true, at(61), &mut mb).await.unwrap();
    assert!(r.taken.is_some());
    assert_eq!(mb.failures, 0);
    assert_eq!(mb.last_success, Some(1_800_000_061.0));
    // A third one: retention keeps the newest two.
    let r = b.tick(&src, true, at(125), &mut mb).await.unwrap();
    assert!(r.taken.is_some());
    assert_eq!(r.pruned.len(), 2, "{:?}", r.pruned);
    let names: Vec<String> = catalog::list(&a.store)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(names.len(), 2);
    assert!(!names.contains(&taken.name));
}

/// What init does when every volume is lost: every initial pod restores the same snapshot
/// with the same fresh token; the three form one cluster holding every key.
#[tokio::test]
async fn three_members_restored_from_one_snapshot_form_one_cluster_with_every_key() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    live.put_keys("/k/", 100).await;
    let written = live.keys("/k/").await;
    let old_cluster = live.source().await;
    let old_id = etcd_steward::backup::snapshot::SnapshotSource::info(&old_cluster)
        .await
        .unwrap()
        .cluster_id;
    let store = Store::open(&file_url(work.path())).unwrap();
    let m = take_at(&live, &store, 0).await;
    drop(live);

    let peers: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let initial_cluster = (0..3)
        .map(|i| format!("etcd-{i}=http://127.0.0.1:{}", peers[i]))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::new();
    for (i, peer) in peers.iter().enumerate() {
        let data = work.path().join(format!("pod-{i}"));
        let params = MemberParams {
            name: format!("etcd-{i}"),
            initial_cluster: initial_cluster.clone(),
            token: "fresh-token".into(),
            peer_url: format!("http://127.0.0.1:{peer}"),
        };
        let outcome = restore::restore(
            &store,
            &RestoreChoice::Named(m.name.clone()),
            &Release::V35.tool(),
            &params,
            &data,
        )
        .await
        .unwrap();
        assert!(matches!(outcome, RestoreOutcome::Restored { .. }));
        members.push((format!("etcd-{i}"), data, *peer));
    }
    // Started together (etcd waits for its peers' quorum before serving).
    let starts = members
        .iter()
        .map(|(name, data, peer)| Etcd::start(Release::V35, name, data, Some(*peer)));
    let running = futures_util::future::join_all(starts).await;
    let mut c = running[2].client().await;
    assert_eq!(c.member_list().await.unwrap().members().len(), 3);
    for e in &running {
        assert_eq!(e.keys("/k/").await, written);
    }
    let new_id = etcd_steward::backup::snapshot::SnapshotSource::info(&running[0].source().await)
        .await
        .unwrap()
        .cluster_id;
    assert_ne!(new_id, old_id, "a restore forms a new cluster");
}

// ---- encryption (issue 15) ---------------------------------------------------------------

/// A new key file in `dir`, loaded.
fn new_key(dir: &Path, name: &str) -> etcd_steward::backup::crypt::Key {
    let path = dir.join(name);
    std::fs::write(&path, etcd_steward::backup::crypt::Key::generate_file()).unwrap();
    etcd_steward::backup::crypt::Key::load(&path).unwrap()
}

fn keys(
    write: Option<&etcd_steward::backup::crypt::Key>,
    read: &[&etcd_steward::backup::crypt::Key],
) -> etcd_steward::backup::crypt::Keys {
    etcd_steward::backup::crypt::Keys {
        write: write.cloned(),
        read: read.iter().map(|k| (*k).clone()).collect(),
    }
}

/// The stored object of `m` in a `file://` store under `work`.
fn stored_object(work: &Path, m: &Manifest) -> PathBuf {
    work.join("store").join(m.db_object())
}

/// A marker value no encryption would leave readable.
const SECRET: &str = "kubernetes-secret-value-d3adb33f";

async fn encrypted_round_trip(url: String, work: &Path) {
    let live = Etcd::start(Release::V35, "live", &work.join("live"), None).await;
    let mut c = live.client().await;
    for i in 0..50 {
        c.put(format!("/secret/{i}"), SECRET, None).await.unwrap();
    }
    let key = new_key(work, "key.txt");
    let store = Store::open(&url).unwrap().with_keys(keys(Some(&key), &[]));
    let m = snapshot::take(&live.source().await, &store, SystemTime::now())
        .await
        .unwrap();
    assert!(
        m.verified,
        "etcd's trailer still proves the plaintext: {m:?}"
    );
    let enc = m
        .encryption
        .clone()
        .expect("the manifest says it is encrypted");
    assert_eq!(enc.scheme, "age-x25519");
    assert_eq!(enc.key, key.fingerprint(), "and which key, by fingerprint");
    assert_eq!(
        m.compression.as_deref(),
        Some("zstd"),
        "compressed, then encrypted"
    );
    assert!(!serde_json::to_string(&m)
        .unwrap()
        .contains("AGE-SECRET-KEY"));
    // The bytes as stored, read past the agent's decryption: on disk for file://, through
    // a store opened without keys for S3.
    let object = if url.starts_with("file://") {
        std::fs::read(stored_object(work, &m)).unwrap()
    } else {
        Store::open(&url)
            .unwrap()
            .get(&m.db_object())
            .await
            .unwrap()
    };
    assert!(
        !object.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
        "nothing readable leaves the pod ({url})"
    );
    assert!(object.starts_with(b"age-encryption.org/v1"), "{url}");
    drop(live);
    let data = work.join("restored");
    let peer = free_port();
    match restore::restore(
        &store,
        &RestoreChoice::Latest,
        &Release::V35.tool(),
        &member("restored", peer),
        &data,
    )
    .await
    .unwrap()
    {
        RestoreOutcome::Restored { manifest } => assert_eq!(manifest.name, m.name),
        other => panic!("expected a restore, got {other:?}"),
    }
    let restored = Etcd::start(Release::V35, "restored", &data, Some(peer)).await;
    let back = restored.keys("/secret/").await;
    assert_eq!(back.len(), 50);
    assert!(back.iter().all(|(_, v)| v == SECRET));
}

#[tokio::test]
async fn an_encrypted_snapshot_round_trips_on_file_store() {
    let work = tempfile::tempdir().unwrap();
    encrypted_round_trip(file_url(work.path()), work.path()).await;
}

#[tokio::test]
async fn an_encrypted_snapshot_round_trips_on_s3() {
    let work = tempfile::tempdir().unwrap();
    encrypted_round_trip(s3_url("encrypted"), work.path()).await;
}

/// One encrypted snapshot in a file store under `work`, taken with `key`.
async fn one_encrypted(work: &Path, key: &etcd_steward::backup::crypt::Key) -> (String, Manifest) {
    let live = Etcd::start(Release::V35, "live", &work.join("live"), None).await;
    live.put_keys("/k/", 10).await;
    let url = file_url(work);
    let store = Store::open(&url).unwrap().with_keys(keys(Some(key), &[]));
    let m = take_at(&live, &store, 0).await;
    (url, m)
}

#[tokio::test]
async fn a_wrong_or_missing_key_is_a_clear_refusal_naming_the_snapshot_and_key() {
    let work = tempfile::tempdir().unwrap();
    let right = new_key(work.path(), "right.txt");
    let wrong = new_key(work.path(), "wrong.txt");
    let (url, m) = one_encrypted(work.path(), &right).await;
    let dir = work.path().join("download");
    for (store, says) in [
        (
            Store::open(&url)
                .unwrap()
                .with_keys(keys(Some(&wrong), &[])),
            "none of the configured keys",
        ),
        (
            Store::open(&url).unwrap(),
            "no --backup-encryption-key-file",
        ),
    ] {
        match restore::pick(&store, &RestoreChoice::Latest, &dir)
            .await
            .unwrap()
        {
            Pick::NoneUsable { skipped } => {
                let why = &skipped[0].1;
                assert_eq!(skipped[0].0, m.name);
                assert!(why.contains(says), "{why}");
                assert!(
                    why.contains(&m.name) && why.contains(right.fingerprint()),
                    "{why}"
                );
            }
            other => panic!("a snapshot that cannot be decrypted is never restored: {other:?}"),
        }
    }
}

#[tokio::test]
async fn tampered_ciphertext_is_refused_even_with_a_matching_manifest() {
    let work = tempfile::tempdir().unwrap();
    let key = new_key(work.path(), "key.txt");
    let (url, mut m) = one_encrypted(work.path(), &key).await;
    // Whoever can write the bucket flips a byte and rewrites the manifest's checksum to
    // match: the authenticated encryption still refuses it.
    let object = stored_object(work.path(), &m);
    flip_a_byte(&object, m.size / 2);
    let bytes = std::fs::read(&object).unwrap();
    m.sha256 = etcd_steward::backup::snapshot::hex(&<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    std::fs::write(
        work.path().join("store").join(m.json_object()),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    let store = Store::open(&url).unwrap().with_keys(keys(Some(&key), &[]));
    match restore::fetch_verified(&store, &m, &work.path().join("out.db")).await {
        Err(RestoreError::Decrypt(e)) => assert!(e.to_string().contains(&m.name), "{e}"),
        other => panic!("expected a decryption failure, got {other:?}"),
    }
    assert!(
        !work.path().join("out.db").exists(),
        "nothing half-written left for a restore"
    );
}

#[tokio::test]
async fn after_a_key_rotation_old_snapshots_restore_with_the_old_key_and_new_ones_use_the_new() {
    let work = tempfile::tempdir().unwrap();
    let old = new_key(work.path(), "old.txt");
    let new = new_key(work.path(), "new.txt");
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    live.put_keys("/k/", 10).await;
    let url = file_url(work.path());
    let before = take_at(
        &live,
        &Store::open(&url).unwrap().with_keys(keys(Some(&old), &[])),
        0,
    )
    .await;
    let rotated = Store::open(&url)
        .unwrap()
        .with_keys(keys(Some(&new), &[&old]));
    let after = take_at(&live, &rotated, 60).await;
    assert_eq!(before.encryption.as_ref().unwrap().key, old.fingerprint());
    assert_eq!(after.encryption.as_ref().unwrap().key, new.fingerprint());
    let dir = work.path().join("download");
    std::fs::create_dir_all(&dir).unwrap();
    for m in [&before, &after] {
        restore::fetch_verified(&rotated, m, &dir.join(format!("{}.db", m.name)))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", m.name));
    }
    // Without the old key, the old snapshot is skipped for... nothing older: none usable.
    let only_new = Store::open(&url).unwrap().with_keys(keys(Some(&new), &[]));
    match restore::pick(&only_new, &RestoreChoice::Named(before.name.clone()), &dir)
        .await
        .unwrap()
    {
        Pick::NoneUsable { .. } => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_unencrypted_store_still_restores_with_a_key_configured() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    live.put_keys("/k/", 10).await;
    let url = file_url(work.path());
    let plain = take_at(&live, &Store::open(&url).unwrap(), 0).await;
    assert!(plain.encryption.is_none());
    let key = new_key(work.path(), "key.txt");
    let store = Store::open(&url).unwrap().with_keys(keys(Some(&key), &[]));
    restore::fetch_verified(&store, &plain, &work.path().join("plain.db"))
        .await
        .unwrap();
    assert!(work.path().join("plain.db").exists());
}

#[tokio::test]
async fn the_backup_command_encrypts_with_the_key_file_and_generates_keys() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    live.put_keys("/k/", 5).await;
    let generated = Command::new(env!("CARGO_BIN_EXE_etcd-steward"))
        .args(["backup", "--generate-key"])
        .output()
        .unwrap();
    assert!(generated.status.success());
    let key_file = work.path().join("key.txt");
    std::fs::write(&key_file, &generated.stdout).unwrap();
    let url = file_url(work.path());
    let key_arg = format!("--backup-encryption-key-file={}", key_file.display());
    let out = steward(&live, &url, &[&key_arg], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(m["encryption"]["scheme"], "age-x25519");
    let listed = steward(&live, &url, &["--list", &key_arg], &[]);
    let line: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(line["encrypted"], true);
    assert_eq!(line["key"], m["encryption"]["key"]);
    // A key file that is not one is a configuration error naming the file (exit 64).
    std::fs::write(&key_file, "garbage").unwrap();
    let bad = steward(&live, &url, &[&key_arg], &[]);
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("key.txt"));
}

// ---- compression -----------------------------------------------------------------------------

/// zstd's frame magic number, as the first bytes of a compressed object.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Writes `n` keys with 1 KiB values that compress as a Kubernetes object does (repeated
/// field names around a few varying bytes); returns the last revision.
async fn put_compressible(live: &Etcd, n: usize) -> i64 {
    let mut c = live.client().await;
    let mut rev = 0;
    for i in 0..n {
        let value = format!(
            "{{\"kind\":\"ConfigMap\",\"index\":{i},\"data\":\"{}\"}}",
            "x".repeat(980)
        );
        let r = c.put(format!("/c/{i:05}"), value, None).await.unwrap();
        rev = r.header().unwrap().revision();
    }
    rev
}

/// A compressed snapshot (the default) taken from `release`, restored into an empty
/// directory with that release's tool and started, then drilled against the live member.
async fn compressed_round_trip_and_drill(release: Release) {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(release, "live", &work.path().join("live"), None).await;
    let rev = put_compressible(&live, 400).await;
    let store = Store::open(&file_url(work.path())).unwrap();
    let m = take_at(&live, &store, 0).await;
    assert!(m.verified, "{m:?}");
    assert_eq!(m.compression.as_deref(), Some("zstd"));
    let object = std::fs::read(stored_object(work.path(), &m)).unwrap();
    assert!(object.starts_with(&ZSTD_MAGIC), "the stored object is zstd");
    assert_eq!(
        object.len() as u64,
        m.size,
        "the manifest's size is the stored object's"
    );
    let plain = Store::open(&file_url(&work.path().join("plain")))
        .unwrap()
        .with_compression(etcd_steward::backup::compress::Compression::None);
    let uncompressed = take_at(&live, &plain, 1).await;
    assert!(
        m.size * 4 < uncompressed.size,
        "compressed {} bytes against {} plain",
        m.size,
        uncompressed.size
    );
    let written = live.keys("/c/").await;

    let source = live.source().await;
    let setup = drill_setup(release, &work.path().join("scratch"));
    let outcome = drill::drill(&store, &m, &setup, &source, SystemTime::now())
        .await
        .unwrap();
    assert!(outcome.passed, "{outcome:?}");
    assert!(
        matches!(outcome.hash, HashCheck::Match { revision, .. } if revision == rev),
        "{outcome:?}"
    );
    drop(source);
    drop(live);

    let data = work.path().join("restored");
    let peer = free_port();
    match restore::restore(
        &store,
        &RestoreChoice::Latest,
        &release.tool(),
        &member("restored", peer),
        &data,
    )
    .await
    .unwrap()
    {
        RestoreOutcome::Restored { manifest } => assert_eq!(manifest.name, m.name),
        other => panic!("expected a restore, got {other:?}"),
    }
    let restored = Etcd::start(release, "restored", &data, Some(peer)).await;
    assert_eq!(restored.keys("/c/").await, written);
    assert_eq!(written.len(), 400);
}

#[tokio::test]
async fn a_compressed_snapshot_restores_and_drills_with_etcd_3_5_1() {
    compressed_round_trip_and_drill(Release::V35).await;
}

#[tokio::test]
async fn a_compressed_snapshot_restores_and_drills_with_etcd_3_5_30() {
    compressed_round_trip_and_drill(Release::V3530).await;
}

#[tokio::test]
async fn a_compressed_snapshot_restores_with_etcd_3_4() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V34, "live", &work.path().join("live"), None).await;
    put_compressible(&live, 50).await;
    let store = Store::open(&file_url(work.path())).unwrap();
    let m = take_at(&live, &store, 0).await;
    assert_eq!(m.compression.as_deref(), Some("zstd"));
    let written = live.keys("/c/").await;
    drop(live);
    let data = work.path().join("restored");
    let peer = free_port();
    restore::restore(
        &store,
        &RestoreChoice::Latest,
        &Release::V34.tool(),
        &member("restored", peer),
        &data,
    )
    .await
    .unwrap();
    let restored = Etcd::start(Release::V34, "restored", &data, Some(peer)).await;
    assert_eq!(restored.keys("/c/").await, written);
}

#[tokio::test]
async fn a_store_written_before_compression_still_restores() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    put_compressible(&live, 50).await;
    let url = file_url(work.path());
    // What an agent without compression wrote: the plain database, and a manifest
    // without the field.
    let old = Store::open(&url)
        .unwrap()
        .with_compression(etcd_steward::backup::compress::Compression::None);
    let m = take_at(&live, &old, 0).await;
    let json = std::fs::read_to_string(work.path().join("store").join(m.json_object())).unwrap();
    assert!(!json.contains("compression"), "{json}");
    let object = stored_object(work.path(), &m);
    assert!(!std::fs::read(&object).unwrap().starts_with(&ZSTD_MAGIC));
    let status = Release::V35.tool().status(&object).await.unwrap();
    assert!(
        status.revision > 0,
        "the stored object is etcd's database as it is"
    );
    let written = live.keys("/c/").await;
    drop(live);
    // Read by an agent that compresses (the default).
    let store = Store::open(&url).unwrap();
    let data = work.path().join("restored");
    let peer = free_port();
    match restore::restore(
        &store,
        &RestoreChoice::Latest,
        &Release::V35.tool(),
        &member("restored", peer),
        &data,
    )
    .await
    .unwrap()
    {
        RestoreOutcome::Restored { manifest } => assert_eq!(manifest.name, m.name),
        other => panic!("expected a restore, got {other:?}"),
    }
    let restored = Etcd::start(Release::V35, "restored", &data, Some(peer)).await;
    assert_eq!(restored.keys("/c/").await, written);
}

#[tokio::test]
async fn backup_compression_none_stores_the_plain_database_and_zstd_is_the_default() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    put_compressible(&live, 50).await;
    let url = file_url(work.path());
    let take = |extra: &[&str], env: &[(&str, &str)]| -> Manifest {
        let out = steward(&live, &url, extra, env);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap()
    };
    let zstd = take(&[], &[]);
    assert_eq!(zstd.compression.as_deref(), Some("zstd"));
    assert!(std::fs::read(stored_object(work.path(), &zstd))
        .unwrap()
        .starts_with(&ZSTD_MAGIC));
    tokio::time::sleep(Duration::from_millis(20)).await;
    for (extra, env) in [
        (&["--backup-compression=none"][..], &[][..]),
        (&[][..], &[("ETCD_STEWARD_BACKUP_COMPRESSION", "none")][..]),
    ] {
        let plain = take(extra, env);
        assert_eq!(plain.compression, None, "{extra:?} {env:?}");
        let object = stored_object(work.path(), &plain);
        Release::V35
            .tool()
            .status(&object)
            .await
            .unwrap_or_else(|e| panic!("etcdutl reads the stored object as it is: {e}"));
        assert!(plain.size > zstd.size * 4);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = steward(&live, &url, &["--backup-compression=gzip"], &[]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--backup-compression must be zstd or none, got \"gzip\""),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_flipped_byte_in_a_compressed_snapshot_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let live = Etcd::start(Release::V35, "live", &work.path().join("live"), None).await;
    put_compressible(&live, 100).await;
    let url = file_url(work.path());
    let store = Store::open(&url).unwrap();
    let mut m = take_at(&live, &store, 0).await;
    assert_eq!(m.compression.as_deref(), Some("zstd"));
    let object = stored_object(work.path(), &m);
    flip_a_byte(&object, m.size / 2);
    let dest = work.path().join("out.db");
    // The manifest as written: the stored object differs from it.
    match restore::fetch_verified(&store, &m, &dest).await {
        Err(RestoreError::Checksum { name, detail }) => {
            assert_eq!(name, m.name);
            assert!(detail.contains("differs from its manifest"), "{detail}");
        }
        other => panic!("expected a checksum failure, got {other:?}"),
    }
    assert!(!dest.exists() && !dest.with_extension("partial").exists());
    // The manifest rewritten to match the flipped object (the byte flipped before it was
    // hashed): zstd's frame or etcd's trailer still refuses it.
    let bytes = std::fs::read(&object).unwrap();
    m.sha256 = snapshot::hex(&<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    match restore::fetch_verified(&store, &m, &dest).await {
        Err(RestoreError::Checksum { detail, .. }) => assert!(
            detail.contains("zstd") || detail.contains("trailer"),
            "{detail}"
        ),
        other => panic!("expected a checksum failure, got {other:?}"),
    }
    assert!(!dest.exists() && !dest.with_extension("partial").exists());
}
