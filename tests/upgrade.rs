//! Upgrades against real etcd on loopback pods: a rolling upgrade 3.4.23 → 3.5.30 under
//! writes (no acknowledged write lost, every voter on 3.5 at the end), and a downgrade
//! attempt (a 3.4.23 binary into a 3.5 cluster) that waits with its reason instead of
//! crash-looping while the cluster keeps serving. With backups, a snapshot of the 3.4
//! cluster is stored before the first 3.5 member starts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use etcd_client::GetOptions;
use harness::client::http_get;
use harness::loopback::Set;
use harness::writer::{write_key, Writer};
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const WAIT: Duration = Duration::from_secs(60);

/// Polls `check` for up to WAIT, restarting exited etcd containers meanwhile (as kubelet
/// does: a crash loop would show as restarts).
async fn until<F, Fut>(set: &mut Set, what: &str, mut check: F)
where
    F: FnMut(&Set) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        set.restart_exited().unwrap();
        if check(set).await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {WAIT:?}\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until pod `o` serves on `version` and all three voters serve quorum reads.
async fn back_on(set: &mut Set, o: u32, version: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        set.restart_exited().unwrap();
        if version_of(set, o).await.as_deref() == Some(version)
            && set.all_linearizable(&[0, 1, 2], 3).await
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod {o} back on {version} within {WAIT:?}\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The cluster version pod `o`'s etcd reports at `/version` (`etcdcluster`).
async fn cluster_version(set: &Set, o: u32) -> Option<String> {
    let addr = std::net::SocketAddr::new(set.pod(o).ip.into(), 2379);
    let (code, body) = http_get(addr, "/version", Duration::from_secs(2), 4096).await?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    (code == 200).then(|| v["etcdcluster"].as_str().map(str::to_string))?
}

async fn version_of(set: &Set, o: u32) -> Option<String> {
    set.status(o).await.ok().map(|s| s.version().to_string())
}

/// Writes `w/0 .. w/acked` all present on pod `o`'s own copy.
async fn acknowledged_writes_on(set: &Set, o: u32, acked: u64) -> i64 {
    let mut c = set.client(o).await.unwrap();
    let opts = GetOptions::new()
        .with_range(write_key(acked))
        .with_count_only()
        .with_serializable();
    c.get(write_key(0), Some(opts)).await.unwrap().count()
}

/// Pods formed on `from`, restarted one by one on `to` (3.5.30) under a writer.
async fn a_rolling_upgrade_loses_no_acknowledged_write(from: Etcd) {
    let mut set = Set::new(STEWARD, from, 3).await.unwrap();
    set.start_all(WAIT).await.unwrap();
    set.put_keys("k", 50).await.unwrap();
    let writer = Writer::start((0..3).map(|o| set.client_url(o)).collect());
    writer.wait_progress(20, WAIT, "before the upgrade").await;
    for o in [2, 1, 0] {
        set.kill(o).await.unwrap();
        set.set_pod_etcd(o, Etcd::V3_5Current);
        set.start(o).unwrap();
        back_on(&mut set, o, "3.5.30").await;
        writer
            .wait_progress(20, WAIT, &format!("after pod {o} upgraded"))
            .await;
    }
    let report = writer.stop().await;
    assert!(report.acked > 60, "{report:?}");
    for o in 0..3 {
        assert_eq!(version_of(&set, o).await.as_deref(), Some("3.5.30"));
        assert_eq!(set.count_keys_on(o, "k/").await.unwrap(), 50);
        assert_eq!(
            acknowledged_writes_on(&set, o, report.acked).await,
            report.acked as i64,
            "pod {o} lost an acknowledged write\n{}",
            set.dump()
        );
    }
    let members = set.members(0).await.unwrap();
    assert_eq!(members.len(), 3);
    assert!(members.iter().all(|m| !m.is_learner()), "{members:?}");
    // No restart was held: every pod started etcd on its first round's decision path.
    for o in 0..3 {
        assert!(!set.logs(o).contains("cannot join"), "{}", set.dump());
    }
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_3_4_to_3_5_loses_no_acknowledged_write() {
    a_rolling_upgrade_loses_no_acknowledged_write(Etcd::V3_4).await;
}

/// 3.5.0–3.5.2 have a known data-inconsistency bug: off 3.5.1 to a current 3.5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_3_5_1_to_3_5_30_loses_no_acknowledged_write() {
    a_rolling_upgrade_loses_no_acknowledged_write(Etcd::V3_5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3_4_binary_in_a_3_5_cluster_waits_with_its_reason() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Current, 3).await.unwrap();
    set.start_all(WAIT).await.unwrap();
    set.put_keys("k", 30).await.unwrap();
    // etcd reports 3.0 until its leader settles the cluster version (with every member up).
    harness::wait_for_or(
        WAIT,
        "the cluster version settled at 3.5",
        || async { cluster_version(&set, 0).await.as_deref() == Some("3.5.0") },
        || set.dump(),
    )
    .await;

    set.kill(2).await.unwrap();
    set.set_pod_etcd(2, Etcd::V3_4);
    set.start(2).unwrap();
    until(&mut set, "pod 2 says why it waits", |s| {
        let said = s
            .logs(2)
            .contains("etcd 3.4.23 cannot join a cluster at version 3.5");
        async move { said }
    })
    .await;
    // It keeps waiting (no exit, so no crash loop), etcd 3.4 never started on the data.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(set.init_running(2), "init still waits\n{}", set.dump());
    assert!(set.status(2).await.is_err(), "no etcd serves on pod 2");
    // The cluster keeps serving on two voters.
    let mut c = set.client(0).await.unwrap();
    for i in 0..10 {
        c.put(format!("during/{i}"), "v", None).await.unwrap();
    }
    assert!(set.all_linearizable(&[0, 1], 3).await);

    // Back on the cluster's release, the pod restarts on its data.
    set.kill(2).await.unwrap();
    set.set_pod_etcd(2, Etcd::V3_5Current);
    set.start(2).unwrap();
    back_on(&mut set, 2, "3.5.30").await;
    assert_eq!(set.count_keys_on(2, "k/").await.unwrap(), 30);
    set.shutdown().await;
}

/// etcd's upgrade notes call 3.4 → 3.5 with authentication on unsafe (a mixed cluster checks
/// requests against each member's own auth revision). A pod restarted on 3.5.30 beside 3.4
/// members with auth on waits and says why; once the operator disables auth it goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3_5_binary_beside_3_4_members_with_auth_on_waits_until_auth_is_disabled() {
    let mut set = Set::new(STEWARD, Etcd::V3_4, 3).await.unwrap();
    set.start_all(WAIT).await.unwrap();
    set.put_keys("k", 30).await.unwrap();
    let mut c = set.client(0).await.unwrap();
    c.user_add("root", "s3cret", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.auth_enable().await.unwrap();
    let password = set.root().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    set.extra_args = vec![
        "--auth-username=root".into(),
        format!("--auth-password-file={}", password.display()),
    ];

    set.kill(2).await.unwrap();
    set.set_pod_etcd(2, Etcd::V3_5Current);
    set.start(2).unwrap();
    until(&mut set, "pod 2 says why it waits", |s| {
        let said = s
            .logs(2)
            .contains("runs etcd 3.4.23 with authentication on");
        async move { said }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(set.init_running(2), "init still waits\n{}", set.dump());
    assert!(set.status(2).await.is_err(), "no etcd serves on pod 2");

    // The operator's step: auth off (as root), then the upgrade goes on by itself.
    let opts = set
        .client_options(Duration::from_secs(2))
        .with_user("root", "s3cret");
    let mut root = etcd_client::Client::connect([set.client_url(0)], Some(opts))
        .await
        .unwrap();
    root.auth_disable().await.unwrap();
    back_on(&mut set, 2, "3.5.30").await;
    assert_eq!(set.count_keys_on(2, "k/").await.unwrap(), 30);
    set.shutdown().await;
}

/// Starts pod `o`: its sidecar without options of its own, its init with `init_args`.
fn start_with(set: &mut Set, o: u32, init_args: &[String]) {
    set.set_dns(o, true).unwrap();
    set.extra_args = Vec::new();
    set.start_sidecar(o).unwrap();
    set.extra_args = init_args.to_vec();
    set.start_init(o).unwrap();
    set.extra_args = Vec::new();
}

/// The store's verified snapshots: (Unix time, etcd release of the member it came from).
async fn stored(url: &str) -> Vec<(u64, String)> {
    use etcd_steward::backup::{catalog, store::Store};
    let store = Store::open(url).unwrap();
    catalog::list(&store)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.verified)
        .map(|m| (m.time_unix, m.etcd_version))
        .collect()
}

/// With `--backup-url`, the first pod restarted on 3.5.30 takes a snapshot of the cluster
/// (still at 3.4) through a live member before its etcd starts, and the next pod (3.5
/// already runs) takes none. Only `init` gets the store: a sidecar's periodic snapshot
/// taken less than a minute before would count as fresh, and this scenario is about init's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_backups_a_snapshot_of_the_3_4_cluster_is_stored_before_the_first_3_5_member_starts() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("store").display());
    let mut init_args = vec![format!("--backup-url={url}")];
    init_args.extend(harness::etcd::jump_args(&Etcd::V3_4.offline_tool()));
    let mut set = Set::new(STEWARD, Etcd::V3_4, 3).await.unwrap();
    for o in 0..3 {
        start_with(&mut set, o, &init_args);
    }
    set.wait_ready(&[0, 1, 2], 3, WAIT).await.unwrap();
    set.put_keys("k", 30).await.unwrap();
    harness::wait_for_or(
        WAIT,
        "the cluster version settled at 3.4",
        || async { cluster_version(&set, 0).await.as_deref() == Some("3.4.0") },
        || set.dump(),
    )
    .await;
    assert_eq!(stored(&url).await, vec![], "no snapshot before the upgrade");

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    set.kill(2).await.unwrap();
    set.set_pod_etcd(2, Etcd::V3_5Current);
    start_with(&mut set, 2, &init_args);
    back_on(&mut set, 2, "3.5.30").await;
    let taken = stored(&url).await;
    assert!(
        taken.len() == 1 && taken[0].0 >= before && taken[0].1.starts_with("3.4."),
        "one snapshot of a 3.4 member taken at the upgrade: {taken:?}\n{}",
        set.dump()
    );
    // Taken before etcd 3.5 started: this start decided `snapshot` before its first
    // `restart` (etcd restarted later, as kubelet would, restarts on its data).
    let decided = harness::logs::decisions(&set.read_logs(2, "init"));
    let first_start = decided.iter().position(|d| d == "restart");
    assert!(
        first_start.is_some_and(|i| decided[..i].contains(&"snapshot".to_string())),
        "pod 2's decisions at its upgrade: {decided:?}\n{}",
        set.dump()
    );

    // The second pod on 3.5: 3.5 already runs beside it, no snapshot.
    set.kill(1).await.unwrap();
    set.set_pod_etcd(1, Etcd::V3_5Current);
    start_with(&mut set, 1, &init_args);
    back_on(&mut set, 1, "3.5.30").await;
    assert_eq!(stored(&url).await.len(), 1, "{}", set.dump());
    assert_eq!(set.count_keys_on(2, "k/").await.unwrap(), 30);
    set.shutdown().await;
}

/// The flag table `init` trusts (`init::releases::FLAGS`) against the real etcd of every
/// release this machine has: each flag the table says the release accepts is in its
/// `etcd --help`, each it says the release does not know is absent. (3.6 and 3.7 have no
/// binary here: the table's word for them comes from etcd's changelogs and upgrade guides.)
#[test]
fn the_flag_table_matches_each_real_etcds_help() {
    use etcd_steward::facts::EtcdVersion;
    use etcd_steward::init::releases::{accepts, FLAGS};
    for etcd in [Etcd::V3_4, Etcd::V3_5, Etcd::V3_5Current] {
        let bin = etcd.bin();
        let version = std::process::Command::new(&bin)
            .arg("--version")
            .output()
            .unwrap();
        let release = EtcdVersion::parse(&String::from_utf8_lossy(&version.stdout))
            .unwrap_or_else(|| panic!("{} --version", bin.display()));
        let help = std::process::Command::new(&bin)
            .arg("--help")
            .output()
            .unwrap();
        let help = format!(
            "{}{}",
            String::from_utf8_lossy(&help.stdout),
            String::from_utf8_lossy(&help.stderr)
        );
        for f in FLAGS {
            let listed = help.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with(&format!("--{} ", f.name))
                    || l.starts_with(&format!("--{}=", f.name))
                    || l == format!("--{}", f.name)
                    || l.starts_with(&format!("--{}\t", f.name))
            });
            assert_eq!(
                listed,
                accepts(release, f.name) == Some(true),
                "etcd {release}: --{} is {} in its --help, the table says otherwise",
                f.name,
                if listed { "listed" } else { "not listed" }
            );
        }
    }
}
