//! The continuous archive, written by the leader's sidecar of a real three-pod set on
//! loopback, read back from the store as a restore would (`stored::get`, verified): every
//! revision after the newest snapshot, with no gap, each as it was written (key, value,
//! mod_revision), across a change of leader; a store that fails for a while (failures
//! counted, `/ready` unaffected, the archive catches up); a compaction that outruns the
//! archive (a break: a snapshot now, the chain resumes from it); encrypted segments in S3;
//! leased keys' TTLs. Run under `flock /tmp/steward-it.lock`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use etcd_client::PutOptions;
use etcd_steward::backup::archive::chain::chain;
use etcd_steward::backup::archive::segment::{Op, Revision};
use etcd_steward::backup::archive::stored;
use etcd_steward::backup::crypt::{Key, Keys};
use etcd_steward::backup::{catalog, manifest::Manifest, store::Store};
use harness::loopback::{BackedSet, Backups, Set};
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const FORM: Duration = Duration::from_secs(60);
/// `--archive-interval` of every scenario.
const ARCHIVE_EVERY: Duration = Duration::from_secs(1);
/// How long the archive may take to reach a revision once written (a round every second,
/// the first after the leader's first backup round, which drills the first snapshot).
const CATCH_UP: Duration = Duration::from_secs(40);

/// Three pods formed, their sidecars backing up and archiving to `url` (with `extra`):
/// one snapshot at the start unless `extra` says otherwise (the rest of the history is the
/// archive's), a round every [`ARCHIVE_EVERY`].
async fn formed(etcd: Etcd, url: &str, extra: &[String]) -> BackedSet {
    formed_with(STEWARD, etcd, url, extra).await
}

/// [`formed`] with the agent binary `steward`.
async fn formed_with(steward: &str, etcd: Etcd, url: &str, extra: &[String]) -> BackedSet {
    let mut backups = Backups::at(url).with(extra.iter().cloned()).sidecars_only();
    if !backups.has("--backup-interval") {
        backups = backups.with(["--backup-interval=1h"]);
    }
    if !backups.has("--archive-interval") {
        backups = backups.with([format!("--archive-interval={}s", ARCHIVE_EVERY.as_secs())]);
    }
    BackedSet::form(steward, etcd, 3, &backups, FORM)
        .await
        .unwrap()
}

/// What a scenario wrote, by the revision etcd gave it: the key, and its value (`None`:
/// deleted), and its lease (0: none).
#[derive(Default)]
struct Written(BTreeMap<i64, (String, Option<String>, i64)>);

impl Written {
    fn last(&self) -> i64 {
        self.0.keys().next_back().copied().unwrap_or(0)
    }

    /// Puts `n` keys `<prefix>/<i>` through any running pod (retrying a put that fails
    /// through an election), then deletes the first; every acknowledged one recorded.
    async fn puts(&mut self, set: &Set, prefix: &str, n: usize, lease: i64) {
        for i in 0..n {
            let (key, value) = (format!("{prefix}/{i:04}"), format!("{prefix}-value-{i}"));
            let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let done = match set.any_client().await {
                    Ok(mut c) => c
                        .put(key.clone(), value.clone(), options.clone())
                        .await
                        .ok(),
                    Err(_) => None,
                };
                if let Some(r) = done {
                    let revision = r.header().unwrap().revision();
                    self.0
                        .insert(revision, (key.clone(), Some(value.clone()), lease));
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "put {key} refused for 30 s"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let key = format!("{prefix}/{:04}", 0);
        let mut c = set.any_client().await.unwrap();
        let r = c.delete(key.clone(), None).await.unwrap();
        self.0
            .insert(r.header().unwrap().revision(), (key, None, 0));
    }
}

/// The archive of cluster `cluster` as a restore would read it: the newest verified
/// snapshot of the cluster, the chain of segments continuing it, and every revision they
/// hold after it (a revision held twice, by overlapping segments, is held identically).
struct Archived {
    snapshot: Manifest,
    last_revision: i64,
    broken: Option<String>,
    revisions: BTreeMap<i64, Revision>,
    leases: BTreeMap<i64, i64>,
    segments: usize,
}

async fn archived(store: &Store, cluster: &str) -> Option<Archived> {
    let snapshot = catalog::list(store)
        .await
        .ok()?
        .into_iter()
        .find(|m| m.verified && m.cluster_id == cluster)?;
    let all = stored::list(store).await.ok()?;
    let c = chain(snapshot.revision, cluster, &all);
    let mut out = Archived {
        last_revision: c.last_revision,
        broken: c.broken.clone(),
        revisions: BTreeMap::new(),
        leases: BTreeMap::new(),
        segments: c.segments.len(),
        snapshot,
    };
    for m in &c.segments {
        let seg = stored::get(store, m)
            .await
            .unwrap_or_else(|e| panic!("segment {} reads back: {e}", m.name));
        out.leases.extend(seg.leases.clone());
        for r in seg.revisions {
            if r.revision <= out.snapshot.revision {
                continue;
            }
            if let Some(before) = out.revisions.get(&r.revision) {
                assert_eq!(
                    before.ops, r.ops,
                    "revision {} archived twice, differently",
                    r.revision
                );
            }
            out.revisions.insert(r.revision, r);
        }
    }
    Some(out)
}

/// Waits until the archive of `cluster` reaches `upto`.
async fn reaches(store: &Store, cluster: &str, upto: i64, set: &Set) -> Archived {
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    loop {
        let a = archived(store, cluster).await;
        if let Some(a) = a.filter(|a| a.last_revision >= upto) {
            return a;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the archive does not reach revision {upto} within {CATCH_UP:?}: {:?}{}",
            archived(store, cluster).await.map(|a| (
                a.snapshot.revision,
                a.last_revision,
                a.broken
            )),
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Every revision after the snapshot up to `upto` is in the archive, and every write the
/// scenario made after the snapshot is there as written, at its revision.
fn no_gap_and_as_written(a: &Archived, upto: i64, written: &Written) {
    let from = a.snapshot.revision;
    let missing: Vec<i64> = (from + 1..=upto)
        .filter(|r| !a.revisions.contains_key(r))
        .collect();
    assert!(
        missing.is_empty(),
        "revisions missing from the archive after snapshot {} (revision {from}): {missing:?}",
        a.snapshot.name
    );
    let mut checked = 0;
    for (revision, (key, value, lease)) in written.0.range(from + 1..) {
        let r = &a.revisions[revision];
        let found = r.ops.iter().any(|op| match (op, value) {
            (
                Op::Put {
                    key: k,
                    value: v,
                    lease: l,
                },
                Some(value),
            ) => k == key.as_bytes() && v == value.as_bytes() && l == lease,
            (Op::Delete { key: k }, None) => k == key.as_bytes(),
            _ => false,
        });
        assert!(
            found,
            "revision {revision}: {key} {value:?} not archived: {r:?}"
        );
        checked += 1;
    }
    assert!(
        checked > 0,
        "nothing written after the snapshot was checked"
    );
}

/// The value of a sample in pod `o`'s `/metrics`.
async fn metric(set: &Set, o: u32, series: &str) -> Option<f64> {
    let (_, text) = set.http(o, "/metrics").await?;
    harness::client::sample(&text, series)
}

/// Waits until pod `o`'s `series` satisfies `ok`; its value.
async fn metric_until(set: &Set, o: u32, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    loop {
        let v = metric(set, o, series).await;
        if let Some(v) = v.filter(|v| ok(*v)) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod {o}'s {series} is {v:?}{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The cluster's ID, hexadecimal, as a pod answers it (asked again for up to 10 s: right
/// after the formation a call may fail once).
async fn cluster_of(set: &Set) -> String {
    for _ in 0..50 {
        for o in 0..3 {
            if let Ok(id) = set.cluster_id(o).await {
                return format!("{id:x}");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no pod tells its cluster ID{}", set.dump())
}

/// The store of a `file://` URL.
fn file_store(dir: &std::path::Path) -> (String, Store) {
    let url = format!("file://{}", dir.display());
    let store = Store::open(&url).unwrap();
    (url, store)
}

/// Under a writer, with a leader change in the middle, the archive holds every revision
/// after the snapshot exactly once in content, as written, leased keys with their TTL.
async fn a_leader_change_mid_archive_leaves_no_gap(etcd: Etcd) {
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = file_store(&dir.path().join("store"));
    let mut set = formed(etcd, &url, &[]).await;
    let cluster = cluster_of(&set).await;
    let leader = set.leader().await.unwrap();

    let mut written = Written::default();
    written.puts(&set, "/before", 40, 0).await;
    let lease = {
        let mut c = set.any_client().await.unwrap();
        c.lease_grant(600, None).await.unwrap().id()
    };
    written.puts(&set, "/leased", 5, lease).await;
    let a = reaches(&store, &cluster, written.last(), &set).await;
    no_gap_and_as_written(&a, written.last(), &written);
    assert_eq!(
        a.leases.get(&lease),
        Some(&600),
        "the lease's TTL is recorded"
    );
    metric_until(&set, leader, "etcd_steward_archive_segments_total", |v| {
        v >= 1.0
    })
    .await;
    metric_until(&set, leader, "etcd_steward_archive_lag_seconds", |v| {
        v == 0.0
    })
    .await;

    // Writes the archive has not caught up with yet, then the leader's pod is killed;
    // writes go on; its successor continues the archive from where the store says.
    written.puts(&set, "/mid", 40, 0).await;
    set.kill(leader).await.unwrap();
    written.puts(&set, "/after", 40, 0).await;
    let a = reaches(&store, &cluster, written.last(), &set).await;
    no_gap_and_as_written(&a, written.last(), &written);
    let new_leader = set.leader().await.unwrap();
    assert_ne!(new_leader, leader);
    let archived_rev = metric_until(
        &set,
        new_leader,
        "etcd_steward_archive_last_revision",
        |v| v >= written.last() as f64,
    )
    .await;
    assert!(archived_rev >= written.last() as f64);
    for o in (0..3).filter(|o| *o != leader && *o != new_leader) {
        assert_eq!(
            metric(&set, o, "etcd_steward_archive_segments_total").await,
            Some(0.0),
            "pod {o} never led: it archived nothing"
        );
    }
    set.shutdown().await;
}

harness::per_etcd_version!(
    [V3_5, V3_5Current, V3_4] by scenario:
    a_leader_change_mid_archive_leaves_no_gap => a_leader_change_mid_archive_leaves_no_gap,
);

/// The store's directory becomes a file: archive rounds fail and are counted, the lag
/// grows, every pod stays ready; once it is back the archive catches up with no gap.
async fn a_store_down_for_a_while_is_caught_up_after(etcd: Etcd) {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let (url, store) = file_store(&store_dir);
    let mut set = formed(etcd, &url, &[]).await;
    let cluster = cluster_of(&set).await;
    let leader = set.leader().await.unwrap();
    let mut written = Written::default();
    written.puts(&set, "/first", 10, 0).await;
    reaches(&store, &cluster, written.last(), &set).await;
    let failures = "etcd_steward_archive_failures_total";
    let before = metric(&set, leader, failures).await.unwrap();

    let aside = dir.path().join("store-aside");
    std::fs::rename(&store_dir, &aside).unwrap();
    std::fs::write(&store_dir, b"not a directory").unwrap();
    written.puts(&set, "/while-down", 20, 0).await;
    metric_until(&set, leader, failures, |v| v >= before + 2.0).await;
    let lag = "etcd_steward_archive_lag_seconds";
    let first = metric_until(&set, leader, lag, |v| v > 0.0).await;
    metric_until(&set, leader, lag, |v| v > first + 1.0).await;
    for o in 0..3 {
        assert!(set.ready(o).await, "pod {o} ready while the store is down");
    }

    std::fs::remove_file(&store_dir).unwrap();
    std::fs::rename(&aside, &store_dir).unwrap();
    written.puts(&set, "/after", 10, 0).await;
    let a = reaches(&store, &cluster, written.last(), &set).await;
    no_gap_and_as_written(&a, written.last(), &written);
    metric_until(&set, leader, lag, |v| v == 0.0).await;
    set.shutdown().await;
}

/// The periodic archive drill, by the leader's sidecar: a snapshot at the start, writes the
/// archive holds, a second snapshot one `--backup-interval` later, and the round drills the
/// archive continuing the first snapshot up to its last archived revision, where the
/// replayed `HashKV` matches the live cluster's: recorded in the first snapshot's manifest
/// and exported in `etcd_steward_backup_drill_archive_last_revision`.
async fn the_leaders_round_drills_the_archive_continuing_the_snapshot_before_the_newest(
    etcd: Etcd,
) {
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = file_store(&dir.path().join("store"));
    let every = ["--backup-interval=20s".to_string()];
    let mut set = formed(etcd, &url, &every).await;
    let cluster = cluster_of(&set).await;
    let mut written = Written::default();
    let lease = {
        let mut c = set.any_client().await.unwrap();
        c.lease_grant(600, None).await.unwrap().id()
    };
    written.puts(&set, "/drilled", 30, 0).await;
    written.puts(&set, "/leased", 5, lease).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let (snapshot, record) = loop {
        let drilled = catalog::list(&store)
            .await
            .unwrap()
            .into_iter()
            .filter(|m| m.cluster_id == cluster)
            .find_map(|m| {
                let a = m.drill.as_ref()?.archive.clone()?;
                Some((m, a))
            });
        if let Some(found) = drilled {
            break found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no archive drill recorded within 120 s{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(record.passed, "{record:?}");
    assert_eq!(record.hash_check, "match", "{record:?}");
    assert!(
        record.last_revision >= written.last() && record.revisions > 0,
        "the drill replays every write (up to {}): {record:?}",
        written.last()
    );
    assert!(record.last_revision > snapshot.revision, "{record:?}");
    let leader = set.leader().await.unwrap();
    metric_until(
        &set,
        leader,
        "etcd_steward_backup_drill_archive_last_revision",
        |v| v >= written.last() as f64,
    )
    .await;
    assert_eq!(
        metric(
            &set,
            leader,
            "etcd_steward_backup_drill_archive_failures_total"
        )
        .await,
        Some(0.0)
    );
    set.shutdown().await;
}

harness::per_etcd_version!(
    [V3_5Current, V3_4] by scenario:
    the_leaders_round_drills_the_archive_continuing_the_snapshot_before_the_newest =>
        the_leaders_round_drills_the_archive_continuing_the_snapshot_before_the_newest,
);

/// While the archiver cannot reach the store, etcd compacts past what it archived: once
/// the store is back, a break is counted, a new snapshot exists, and the archive continues
/// from it with no gap.
async fn a_compaction_that_outruns_the_archive_is_a_break_and_the_chain_resumes(etcd: Etcd) {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let (url, store) = file_store(&store_dir);
    let mut set = formed(etcd, &url, &[]).await;
    let cluster = cluster_of(&set).await;
    let leader = set.leader().await.unwrap();
    let mut written = Written::default();
    written.puts(&set, "/first", 10, 0).await;
    let first = reaches(&store, &cluster, written.last(), &set).await;
    assert_eq!(
        metric(&set, leader, "etcd_steward_archive_breaks_total").await,
        Some(0.0)
    );

    let aside = dir.path().join("store-aside");
    std::fs::rename(&store_dir, &aside).unwrap();
    std::fs::write(&store_dir, b"not a directory").unwrap();
    written.puts(&set, "/unarchived", 20, 0).await;
    let compacted = written.last();
    let mut c = set.any_client().await.unwrap();
    c.compact(
        compacted,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    std::fs::remove_file(&store_dir).unwrap();
    std::fs::rename(&aside, &store_dir).unwrap();

    metric_until(&set, leader, "etcd_steward_archive_breaks_total", |v| {
        v >= 1.0
    })
    .await;
    assert!(
        set.logs(leader).contains("archive break"),
        "the break is logged"
    );
    written.puts(&set, "/resumed", 10, 0).await;
    let a = reaches(&store, &cluster, written.last(), &set).await;
    assert_ne!(a.snapshot.name, first.snapshot.name, "a new snapshot");
    assert!(
        a.snapshot.revision >= compacted,
        "the new snapshot holds the compacted revisions: {}",
        a.snapshot.revision
    );
    no_gap_and_as_written(&a, written.last(), &written);
    set.shutdown().await;
}

harness::per_etcd_version!(
    [V3_5, V3_4] by scenario:
    a_store_down_for_a_while_is_caught_up_after => a_store_down_for_a_while_is_caught_up_after,
    a_compaction_that_outruns_the_archive_is_a_break_and_the_chain_resumes =>
        a_compaction_that_outruns_the_archive_is_a_break_and_the_chain_resumes,
);

/// With `--backup-encryption-key-file`, into S3: every segment is encrypted to the key
/// (its manifest says so, the stored bytes hold no key in the clear), reads back with the
/// key and not without it, leased keys with their TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_segments_in_s3_read_back_only_with_the_key() {
    let work = tempfile::tempdir().unwrap();
    let generated = Command::new(STEWARD)
        .args(["backup", "--generate-key"])
        .output()
        .unwrap();
    assert!(generated.status.success());
    let key_file = work.path().join("key.txt");
    std::fs::write(&key_file, &generated.stdout).unwrap();
    let url = harness::moto::s3_url("archive-encrypted", "etcd");
    let key_arg = format!("--backup-encryption-key-file={}", key_file.display());
    let mut set = formed(Etcd::V3_5, &url, &[key_arg]).await;
    let cluster = cluster_of(&set).await;
    let key = Key::load(&key_file).unwrap();
    let store = Store::open(&url).unwrap().with_keys(Keys {
        write: Some(key.clone()),
        read: vec![],
    });
    let mut written = Written::default();
    let lease = {
        let mut c = set.any_client().await.unwrap();
        c.lease_grant(90, None).await.unwrap().id()
    };
    written.puts(&set, "/secret", 10, lease).await;
    let a = reaches(&store, &cluster, written.last(), &set).await;
    no_gap_and_as_written(&a, written.last(), &written);
    assert_eq!(a.leases.get(&lease), Some(&90));
    assert!(a.segments >= 1);

    let manifests = stored::list(&store).await.unwrap();
    let plain = Store::open(&url).unwrap();
    for m in manifests.iter().filter(|m| m.cluster_id == cluster) {
        assert_eq!(
            m.encryption.as_ref().map(|e| e.key.as_str()),
            Some(key.fingerprint()),
            "{} encrypted to the key",
            m.name
        );
        let raw = plain.get(&m.seg_object()).await.unwrap();
        assert!(
            !raw.windows(7).any(|w| w == b"/secret"),
            "{} in the clear",
            m.name
        );
        let e = stored::get(&plain, m).await.unwrap_err();
        assert!(e.is_bad_segment(), "{} read without the key: {e}", m.name);
    }
    set.shutdown().await;
}

/// Retention follows the snapshots: with one snapshot kept, the segments wholly before it
/// leave the store with the snapshots they continued; the archive after it stays whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_leave_the_store_with_the_snapshots_they_continue() {
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = file_store(&dir.path().join("store"));
    let extra = [
        "--backup-interval=3s".to_string(),
        "--backup-keep=1".to_string(),
    ];
    let mut set = formed(Etcd::V3_5, &url, &extra).await;
    let cluster = cluster_of(&set).await;
    let mut written = Written::default();
    written.puts(&set, "/old", 20, 0).await;
    let old = written.last();
    // The old revisions are archived in segments of their own...
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    while !stored::list(&store)
        .await
        .unwrap()
        .iter()
        .any(|m| m.first_revision <= old && m.last_revision >= old)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "revision {old} never archived"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // ...and once every kept snapshot is past them, their segments are gone, objects too.
    written.puts(&set, "/new", 10, 0).await;
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    loop {
        let oldest = catalog::list(&store)
            .await
            .unwrap()
            .iter()
            .map(|m| m.revision)
            .min()
            .unwrap();
        let objects = store.list("archive").await.unwrap();
        let before: Vec<&String> = objects
            .iter()
            .map(|e| &e.name)
            .filter(|n| {
                let last = n
                    .trim_start_matches("archive/")
                    .split(['-', '.'])
                    .nth(1)
                    .and_then(|l| l.parse::<i64>().ok())
                    .unwrap();
                last < oldest
            })
            .collect();
        if oldest > old && before.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "oldest kept snapshot at revision {oldest}, segments wholly before it still stored: {before:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // What is left still continues the newest snapshot, without a hole.
    written.puts(&set, "/newest", 10, 0).await;
    let a = reaches(&store, &cluster, written.last(), &set).await;
    assert_eq!(a.broken, None);
    set.shutdown().await;
}

/// The leader's sidecar's CPU time (user + system, seconds) and peak RSS (KiB).
fn footprint(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    (ticks as f64 / 100.0, hwm)
}

/// Resets the peak RSS (`VmHWM`) of `pid` to its current RSS (`/proc/PID/clear_refs`, 5).
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

/// The cost of archiving (BENCHMARKS.md): the leader's sidecar's CPU and peak RSS over a
/// minute of `rate` writes/s (1 KiB values: one repeated byte, or seeded pseudo-random
/// bytes that zstd cannot shrink), archiving at the default 5 s and off, and the segments
/// stored (`ARCHIVE_COST_INTERVALS=5s,0`, the default, picks the settings). Peak RSS twice: since the sidecar started (its first backup round and drill
/// included), and over the writes alone (the peak reset once the drill is done).
async fn measure_archive_cost(rate: u32, incompressible: bool) {
    // `ARCHIVE_COST_INTERVALS=5s` measures only with the archive; `ARCHIVE_COST_STEWARD`
    // names another build of the agent (a release build: target/release/etcd-steward).
    let intervals = std::env::var("ARCHIVE_COST_INTERVALS").unwrap_or_else(|_| "5s,0".into());
    let steward = std::env::var("ARCHIVE_COST_STEWARD").unwrap_or_else(|_| STEWARD.into());
    println!("agent: {steward}");
    for interval in intervals.split(',') {
        let dir = tempfile::tempdir().unwrap();
        let (url, store) = file_store(&dir.path().join("store"));
        let extra = [format!("--archive-interval={interval}")];
        let mut set = formed_with(&steward, Etcd::V3_5Current, &url, &extra).await;
        let leader = set.leader().await.unwrap();
        // Past the first backup round and its drill.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let pid = set.sidecar_pid(leader).unwrap();
        let (cpu0, hwm_start) = footprint(pid);
        reset_peak(pid);
        let load0 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let writer = harness::paced::PacedWriter::start(
            vec![set.client_url(leader)],
            rate,
            1024,
            incompressible.then_some(7),
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        let writes = writer.stop().await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        let (cpu1, hwm) = footprint(pid);
        let load1 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let segments = stored::list(&store).await.unwrap();
        let bytes: u64 = segments.iter().map(|m| m.size).sum();
        let plain: u64 = segments.iter().map(|m| m.plain_size).sum();
        println!(
            "archive-interval={interval}, {rate} writes/s ({}): {} of {} writes acknowledged in 60 s ({} failed), {} bytes of keys and values; leader sidecar CPU {:.2} s ({:.1}%), peak RSS {} KiB before the writes (first round and drill), {} KiB at the end; {} segments ({} PUTs, {:.0} an hour), {} bytes stored ({} before zstd), {:.3} bytes archived per byte written; load before {} after {}",
            if incompressible { "incompressible values" } else { "one repeated byte" },
            writes.acked.len(),
            writes.started,
            writes.failures,
            writes.bytes,
            cpu1 - cpu0,
            (cpu1 - cpu0) / 66.0 * 100.0,
            hwm_start,
            hwm,
            segments.len(),
            segments.len() * 2,
            segments.len() as f64 * 2.0 * 3600.0 / 66.0,
            bytes,
            plain,
            bytes as f64 / writes.bytes.max(1) as f64,
            load0.trim(),
            load1.trim(),
        );
        set.shutdown().await;
    }
}

/// `cargo test --test archive -- --ignored --nocapture measure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test"]
async fn measure_archive_cost_at_100_writes_per_second() {
    measure_archive_cost(100, false).await;
}

/// As at 100 writes/s, at 1,000, with values zstd cannot shrink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test"]
async fn measure_archive_cost_at_1000_writes_per_second() {
    measure_archive_cost(1000, true).await;
}
