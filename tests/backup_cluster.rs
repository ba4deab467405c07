//! Periodic backups by the sidecars of a real three-pod set on loopback (etcd 3.5.1 and
//! 3.4.23), into `file://` and into an S3-compatible server (moto): one snapshot per
//! interval, taken by the leader's sidecar only; a drill that passes; a store that fails →
//! failures counted and retried while the cluster and `/ready` carry on; the leader killed
//! → the next snapshot from the new leader, with neither a duplicate nor a gap.
//! Run under `flock /tmp/steward-it.lock` (the pods use the shared 127.0.N.x networks).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use etcd_steward::backup::manifest::Manifest;
use etcd_steward::backup::{catalog, store::Store};
use harness::loopback::{BackedSet, Backups, Set};
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const FORM: Duration = Duration::from_secs(60);
/// `--backup-interval` of every scenario.
const INTERVAL: Duration = Duration::from_secs(3);
/// How much later than one interval after the previous one a snapshot may come: a round
/// starts at most a second after it is due, and the previous round (snapshot, prune,
/// drill with its throw-away etcd) may still run then.
const LATE: Duration = Duration::from_secs(4);
/// How much earlier: the schedule reads a manifest's time in whole seconds (`time_unix`).
const EARLY: Duration = Duration::from_secs(1);

/// Three pods formed, their sidecars backing up to `url` every [`INTERVAL`] (and given
/// `more` options).
async fn formed(etcd: Etcd, url: &str, more: &[String]) -> BackedSet {
    let backups = Backups::at(url)
        .with(more.iter().cloned())
        .with([format!("--backup-interval={}s", INTERVAL.as_secs())])
        .sidecars_only();
    BackedSet::form(STEWARD, etcd, 3, &backups, FORM)
        .await
        .unwrap()
}

/// The store's manifests, oldest first (an unreadable store lists nothing).
async fn manifests(url: &str) -> Vec<Manifest> {
    let store = Store::open(url).unwrap();
    let mut all = catalog::list(&store).await.unwrap_or_default();
    all.reverse();
    all
}

/// When a snapshot was taken, to the millisecond, from its name (`20261123T033912.123Z-r42`).
fn taken_at(m: &Manifest) -> SystemTime {
    let s = &m.name;
    let rfc = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..19]
    );
    humantime::parse_rfc3339(&rfc).unwrap_or_else(|e| panic!("{rfc}: {e}"))
}

/// The first `Some` that `check` gives within `within`, polled every 200 ms.
async fn poll_some<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn hex_id(id: u64) -> String {
    format!("{id:x}")
}

/// Waits until the store holds more than `n` snapshots; returns them, oldest first.
async fn more_than(url: &str, n: usize, within: Duration, set: &Set) -> Vec<Manifest> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let all = manifests(url).await;
        if all.len() > n {
            return all;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no snapshot beyond {n} within {within:?}: {:?}{}",
            all.iter().map(|m| &m.name).collect::<Vec<_>>(),
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Consecutive snapshots are one interval apart: never closer (a duplicate), never much
/// later (a gap).
fn one_per_interval(all: &[Manifest]) {
    for pair in all.windows(2) {
        let gap = taken_at(&pair[1])
            .duration_since(taken_at(&pair[0]))
            .unwrap_or_default();
        assert!(
            gap >= INTERVAL - EARLY && gap <= INTERVAL + LATE,
            "{} then {}: {gap:?} apart, not one interval",
            pair[0].name,
            pair[1].name
        );
    }
}

/// The value of a sample in pod `o`'s `/metrics`.
async fn metric(set: &Set, o: u32, series: &str) -> Option<f64> {
    let (_, text) = set.http(o, "/metrics").await?;
    harness::client::sample(&text, series)
}

/// The whole life of file:// backups on one release.
async fn backups_follow_the_leader_survive_a_failing_store_and_pass_the_drill(etcd: Etcd) {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let url = format!("file://{}", store_dir.display());
    // The sidecars post their Events to the fake Kubernetes API.
    let api =
        harness::fake_kube::FakeKube::start("127.0.0.1:0".parse().unwrap(), "default", "etcd")
            .await
            .unwrap();
    let mut set = formed(
        etcd,
        &url,
        &[format!("--kube-api-url=http://{}", api.addr())],
    )
    .await;
    let leader = set.leader().await.unwrap();
    let leader_id = hex_id(set.member_id(leader).await.unwrap());

    // One per interval, each by the leader, each verified; the newest drilled and passing.
    let all = more_than(&url, 2, INTERVAL * 4 + LATE, &set).await;
    one_per_interval(&all);
    for m in &all {
        assert_eq!(m.member_id, leader_id, "{} taken by the leader", m.name);
        assert!(m.verified, "{} verified", m.name);
    }
    let drilled = poll_some(Duration::from_secs(20), || async {
        manifests(&url)
            .await
            .iter()
            .rev()
            .find_map(|m| m.drill.clone())
    })
    .await
    .expect("a drill recorded in a manifest");
    assert!(drilled.passed, "the drill passed: {drilled:?}");
    assert!(
        metric(&set, leader, "etcd_steward_backup_verified_revision")
            .await
            .is_some(),
        "the leader exports the drill's revision"
    );
    for o in (0..3).filter(|o| *o != leader) {
        assert_eq!(
            metric(
                &set,
                o,
                "etcd_steward_backup_last_success_timestamp_seconds"
            )
            .await,
            None,
            "pod {o} never led a round"
        );
        assert!(set.logs(o).contains("sidecar serving"), "pod {o} runs");
    }

    // The store fails (its directory is now a file): rounds fail, are counted and retried;
    // the cluster takes writes and every pod stays ready.
    let before = metric(&set, leader, "etcd_steward_backup_failures_total")
        .await
        .unwrap();
    let aside = dir.path().join("store-aside");
    std::fs::rename(&store_dir, &aside).unwrap();
    std::fs::write(&store_dir, b"not a directory").unwrap();
    let failing = poll_some(Duration::from_secs(15), || async {
        let n = metric(&set, leader, "etcd_steward_backup_failures_total").await?;
        (n >= before + 2.0).then_some(n)
    })
    .await;
    assert!(
        failing.is_some(),
        "failures counted and retried{}",
        set.dump()
    );
    // A new failure is a BackupFailing Event on the leader's pod (the failure that repeats
    // with the same error is logged and posted once).
    let leader_pod = format!("etcd-{leader}");
    let backup_failing = || {
        api.events()
            .into_iter()
            .filter(|e| e["reason"] == "BackupFailing")
            .collect::<Vec<_>>()
    };
    harness::wait_for(Duration::from_secs(10), "a BackupFailing Event", || async {
        !backup_failing().is_empty()
    })
    .await;
    for e in backup_failing() {
        assert_eq!(e["regarding"]["name"], leader_pod.as_str(), "{e:#}");
        assert_eq!(e["type"], "Warning", "{e:#}");
    }
    set.put_keys("during-failure", 5).await.unwrap();
    // A failing store never makes a member unready (an election meanwhile may, for a tick).
    for o in 0..3 {
        harness::wait_for(
            Duration::from_secs(10),
            &format!("pod {o} ready while the store fails"),
            || set.ready(o),
        )
        .await;
    }

    // The store is back: the next snapshot comes at the next round.
    std::fs::remove_file(&store_dir).unwrap();
    std::fs::rename(&aside, &store_dir).unwrap();
    let had = manifests(&url).await.len();
    more_than(&url, had, INTERVAL + LATE, &set).await;

    // The leader is killed: the next snapshot comes from the new leader, one interval
    // after the old leader's last one (no duplicate, no gap).
    let had = manifests(&url).await.len();
    set.kill(leader).await.unwrap();
    let all = more_than(&url, had, INTERVAL * 2 + LATE * 2, &set).await;
    let new_leader = set.leader().await.unwrap();
    assert_ne!(new_leader, leader);
    let new_id = hex_id(set.member_id(new_leader).await.unwrap());
    let first_new = all.iter().position(|m| m.member_id == new_id).unwrap();
    let old_last = &all[first_new - 1];
    assert_eq!(old_last.member_id, leader_id);
    let gap = taken_at(&all[first_new])
        .duration_since(taken_at(old_last))
        .unwrap_or_default();
    assert!(
        gap >= INTERVAL - EARLY && gap <= INTERVAL * 2 + LATE,
        "the new leader's first snapshot {gap:?} after the old leader's last"
    );
    // Readiness needs a linearizable read through the member: right after the election it
    // may still be failing ("leader changed"), and the sidecar looks again each second.
    for o in (0..3).filter(|o| *o != leader) {
        harness::wait_for(
            Duration::from_secs(10),
            &format!("pod {o} ready after the leader change"),
            || set.ready(o),
        )
        .await;
    }
    set.shutdown().await;
}

mod etcd_3_5 {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn backups_follow_the_leader_survive_a_failing_store_and_pass_the_drill() {
        super::backups_follow_the_leader_survive_a_failing_store_and_pass_the_drill(
            super::Etcd::V3_5,
        )
        .await;
    }
}

mod etcd_3_4 {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn backups_follow_the_leader_survive_a_failing_store_and_pass_the_drill() {
        super::backups_follow_the_leader_survive_a_failing_store_and_pass_the_drill(
            super::Etcd::V3_4,
        )
        .await;
    }
}

/// A fresh bucket on the moto server (whose `AWS_*` variables every sidecar inherits); the
/// URL of a prefix in it.
fn bucket(name: &str) -> String {
    harness::moto::s3_url(name, "etcd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_backs_up_into_s3_one_snapshot_per_interval() {
    let url = bucket("sidecar-backups");
    let set = formed(Etcd::V3_5, &url, &[]).await;
    let leader = set.leader().await.unwrap();
    let leader_id = hex_id(set.member_id(leader).await.unwrap());
    let all = more_than(&url, 1, INTERVAL * 3 + LATE, &set).await;
    one_per_interval(&all);
    assert!(all.iter().all(|m| m.member_id == leader_id && m.verified));
    let size = poll_some(Duration::from_secs(10), || async {
        metric(&set, leader, "etcd_steward_backup_size_bytes").await
    })
    .await;
    assert!(size.is_some_and(|s| s > 0.0), "size exported");
    assert_eq!(
        metric(&set, leader, "etcd_steward_backup_failures_total").await,
        Some(0.0)
    );
    let mut set = set;
    set.shutdown().await;
}
