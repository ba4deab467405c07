//! Every volume lost: the cluster comes back from its latest backup. Real etcd (3.5.1 and
//! 3.4.23), a real dnsmasq, real `init`, `sidecar` and `backup` processes on loopback, and a
//! `file://` backup store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use harness::loopback::Set;
use harness::{wait_for, Etcd};

/// The agent under test.
const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");

const FORM: Duration = Duration::from_secs(60);

/// A three-pod set formed with backups configured to `store` (restore `restore`).
async fn formed(etcd: Etcd, store: &Path, restore: &str) -> Set {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec![
        format!("--backup-url=file://{}", store.display()),
        format!("--etcdutl-bin={}", etcd.offline_tool().display()),
        format!(
            "--backup-scratch-dir={}",
            set.root().join("scratch").display()
        ),
        // Periodic backups stay out of the way of the ones the test takes.
        "--backup-interval=1h".into(),
        format!("--restore={restore}"),
    ];
    set.start_all(FORM).await.unwrap();
    if restore != "never" {
        // The leader's sidecar takes the store's first snapshot at once; with a 1 h interval,
        // none after it: the snapshots the test takes are the newest.
        wait_for(FORM, "the leader's sidecar's first snapshot", || async {
            std::fs::read_dir(store.join("snapshots")).is_ok_and(|d| {
                d.filter_map(Result::ok)
                    .any(|e| e.path().extension().is_some_and(|x| x == "json"))
            })
        })
        .await;
    }
    set
}

/// `etcd-steward backup` through pod `o`'s member: one verified snapshot; its name.
async fn backup_now(set: &Set, o: u32) -> String {
    let out = tokio::process::Command::new(STEWARD)
        .arg("backup")
        .args(set.common_args(o))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "backup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(manifest["verified"], true, "{manifest}");
    manifest["name"].as_str().unwrap().to_string()
}

/// Every pod's processes killed and its volume gone.
async fn lose_every_volume(set: &mut Set) {
    for o in 0..3 {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
}

async fn restart_all(set: &mut Set) {
    for o in 0..3 {
        set.start(o).unwrap();
    }
}

async fn every_volume_lost_the_cluster_comes_back_from_the_latest_backup(etcd: Etcd) {
    let store = tempfile::tempdir().unwrap();
    let mut set = formed(etcd, store.path(), "latest").await;
    let old_cluster = set.cluster_id(0).await.unwrap();
    set.put_keys("k", 100).await.unwrap();
    let older = backup_now(&set, 0).await;
    set.put_keys("k2", 20).await.unwrap();
    let newest = backup_now(&set, 1).await;
    assert_ne!(older, newest);
    // Written after the last backup: a restore cannot have them.
    set.put_keys("late", 5).await.unwrap();

    lose_every_volume(&mut set).await;
    restart_all(&mut set).await;
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "k/").await.unwrap_or(-1),
            100,
            "pod {o}"
        );
        assert_eq!(
            set.count_keys_on(o, "k2/").await.unwrap_or(-1),
            20,
            "pod {o}"
        );
        assert_eq!(
            set.count_keys_on(o, "late/").await.unwrap_or(-1),
            0,
            "pod {o}"
        );
        let logs = set.logs(o);
        assert!(
            logs.contains("restored from a backup") && logs.contains(&newest),
            "pod {o} says which snapshot it restored:\n{}",
            set.dump()
        );
    }
    let new_cluster = set.cluster_id(0).await.unwrap();
    for o in 1..3 {
        assert_eq!(set.cluster_id(o).await.unwrap(), new_cluster, "one cluster");
    }
    assert_ne!(
        new_cluster, old_cluster,
        "a restored cluster gets a new identity (a fresh token)"
    );
    set.put_keys("after", 3).await.unwrap();
    set.shutdown().await;
}

async fn a_corrupted_newest_backup_is_skipped_for_the_one_before(etcd: Etcd) {
    let store = tempfile::tempdir().unwrap();
    let mut set = formed(etcd, store.path(), "latest").await;
    set.put_keys("k", 50).await.unwrap();
    let good = backup_now(&set, 0).await;
    set.put_keys("k2", 10).await.unwrap();
    let torn = backup_now(&set, 0).await;
    // Flip one byte in the middle of the newest snapshot's database.
    let db = store.path().join(format!("snapshots/{torn}.db"));
    let mut bytes = std::fs::read(&db).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&db, bytes).unwrap();

    lose_every_volume(&mut set).await;
    restart_all(&mut set).await;
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "k/").await.unwrap_or(-1),
            50,
            "pod {o}"
        );
        assert_eq!(
            set.count_keys_on(o, "k2/").await.unwrap_or(-1),
            0,
            "pod {o}"
        );
        assert!(set.logs(o).contains(&good), "pod {o} restored {good}");
    }
    assert!(
        (0..3).any(|o| set.logs(o).contains("backup fails its checksum")),
        "the corrupt snapshot is named in the log:\n{}",
        set.dump()
    );
    set.shutdown().await;
}

async fn restore_never_forms_an_empty_cluster(etcd: Etcd) {
    let store = tempfile::tempdir().unwrap();
    let mut set = formed(etcd, store.path(), "never").await;
    set.put_keys("k", 10).await.unwrap();
    backup_now(&set, 0).await;
    lose_every_volume(&mut set).await;
    restart_all(&mut set).await;
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    assert_eq!(set.count_keys_on(0, "k/").await.unwrap_or(-1), 0);
    assert!(!set.logs(0).contains("restored from a backup"));
    set.shutdown().await;
}

async fn backups_none_of_which_is_usable_mean_waiting_not_an_empty_cluster(etcd: Etcd) {
    let store = tempfile::tempdir().unwrap();
    let mut set = formed(etcd, store.path(), "latest").await;
    set.put_keys("k", 10).await.unwrap();
    backup_now(&set, 0).await;
    // Every snapshot in the store (the test's, and any the leader's sidecar took) corrupted.
    lose_every_volume(&mut set).await;
    let mut corrupted = 0;
    for entry in std::fs::read_dir(store.path().join("snapshots")).unwrap() {
        let db = entry.unwrap().path();
        if db.extension().is_some_and(|x| x == "db") {
            let mut bytes = std::fs::read(&db).unwrap();
            let last = bytes.len() - 40;
            bytes[last] ^= 0xff;
            std::fs::write(&db, bytes).unwrap();
            corrupted += 1;
        }
    }
    assert!(corrupted >= 1);
    restart_all(&mut set).await;
    wait_for(
        Duration::from_secs(30),
        "every pod to say that no backup is usable",
        || async {
            (0..3).all(|o| {
                set.logs(o).contains("none is usable") || set.logs(o).contains("fails its checksum")
            }) && (0..3).any(|o| set.logs(o).contains("none is usable"))
        },
    )
    .await;
    // Still no etcd anywhere, and no data formed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for o in 0..3 {
        assert!(set.init_running(o), "pod {o}'s init still waits");
        assert!(
            !set.data_dir(o).join("member/wal").exists(),
            "pod {o} formed nothing"
        );
        assert!(!set.ready(o).await);
    }
    set.shutdown().await;
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod etcd_3_5 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Etcd::V3_5).await;
                }
            )*
        }
        mod etcd_3_4 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Etcd::V3_4).await;
                }
            )*
        }
    };
}

scenarios!(
    every_volume_lost_the_cluster_comes_back_from_the_latest_backup,
    a_corrupted_newest_backup_is_skipped_for_the_one_before,
    restore_never_forms_an_empty_cluster,
    backups_none_of_which_is_usable_mean_waiting_not_an_empty_cluster,
);
