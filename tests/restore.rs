//! Every volume lost: the cluster comes back from its latest backup, its revision moved
//! past every one served before where the tool can (etcd 3.5.30's etcdutl). Real etcd (3.5.1,
//! 3.4.23 and 3.5.30), a real dnsmasq, real `init`, `sidecar` and `backup` processes on loopback, and a
//! `file://` backup store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use harness::loopback::Set;
use harness::{wait_for, wait_for_or, Etcd};

/// The agent under test.
const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");

const FORM: Duration = Duration::from_secs(60);

/// A three-pod set formed with backups configured to `store` (restore `restore`).
async fn formed(etcd: Etcd, store: &Path, restore: &str) -> Set {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec![
        format!("--backup-url=file://{}", store.display()),
        // No --etcdutl-bin: the tool is found beside --etcd-bin (3.5's etcdutl is on no
        // PATH here), as in an image that keeps etcd and its tools in one directory.
        format!(
            "--backup-scratch-dir={}",
            set.root().join("scratch").display()
        ),
        // Periodic backups stay out of the way of the ones the test takes.
        "--backup-interval=1h".into(),
        // These scenarios are about snapshots: what a restore holds is what the newest usable
        // snapshot holds. With the archive on (by default every 5 s), the writes made after
        // it would be restored too whenever a segment happened to be written before the
        // loss; the archive's restores are tests/restore_archive.rs's.
        "--archive-interval=0".into(),
        format!("--restore={restore}"),
    ];
    set.extra_args
        .extend(harness::etcd::jump_args(&etcd.offline_tool()));
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
    the_drill_proved_the_jump(store.path(), etcd).await;
    set.put_keys("k", 100).await.unwrap();
    let older = backup_now(&set, 0).await;
    set.put_keys("k2", 20).await.unwrap();
    let newest = backup_now(&set, 1).await;
    assert_ne!(older, newest);
    // Written after the last backup: a restore cannot have them.
    set.put_keys("late", 5).await.unwrap();
    let mut served = 0;
    for o in 0..3 {
        served = served.max(set.revision(o).await.unwrap());
    }

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
    the_revision_jumped_past(&set, etcd, served).await;
    set.put_keys("after", 3).await.unwrap();
    set.shutdown().await;
}

/// The leader's sidecar drills its first snapshot with the restore's own tool and flags:
/// with etcd 3.5.30's etcdutl, the restored member serves the snapshot's revision plus the
/// jump, and the drill says so.
async fn the_drill_proved_the_jump(store: &Path, etcd: Etcd) {
    if etcd != Etcd::V3_5Current {
        return;
    }
    let drill_of = || {
        let dir = std::fs::read_dir(store.join("snapshots")).ok()?;
        dir.filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .find_map(|m| m.get("drill").filter(|d| !d.is_null()).cloned())
    };
    wait_for(FORM, "the first snapshot's drill", || async {
        drill_of().is_some()
    })
    .await;
    let drill = drill_of().unwrap_or_default();
    assert_eq!(drill["passed"], true, "{drill}");
    assert_eq!(drill["hash_check"], "jumped", "{drill}");
}

/// After a restore: with a tool that can (etcd 3.5.30's etcdutl), every pod's revision is
/// above the highest the lost cluster `served`, and a read or a watch at that revision fails
/// as compacted (watchers re-list); with one that cannot (the jump turned off, as the agent
/// requires), the log says the revision went back.
async fn the_revision_jumped_past(set: &Set, etcd: Etcd, served: i64) {
    for o in 0..3 {
        let logs = set.logs(o);
        if etcd == Etcd::V3_5Current {
            let now = set.revision(o).await.unwrap();
            assert!(
                now > served,
                "pod {o}: revision {now} is above the {served} served before the loss"
            );
            let (read, watch) = set.compacted_at(o, served).await.unwrap();
            assert!(
                read,
                "pod {o}: a read at revision {served} fails as compacted"
            );
            assert!(
                watch,
                "pod {o}: a watch from revision {served} is cancelled as compacted"
            );
            assert!(logs.contains("revision_after"), "pod {o}: {}", set.dump());
        } else {
            // The tool cannot jump, so the scenario turned the jump off (the agent refuses
            // to start otherwise): each restore says the revision went back.
            assert!(
                logs.contains("--restore-bump-revision 0") && logs.contains("went back"),
                "pod {o} says the restore took the revision back, as asked:\n{}",
                set.dump()
            );
        }
    }
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
    // Still no etcd anywhere and no data formed, watched for 30 s: longer than init's
    // retry back-off (5 s at most), so several decisions were taken meanwhile.
    let watch = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < watch {
        for o in 0..3 {
            assert!(
                set.init_running(o),
                "pod {o}'s init still waits\n{}",
                set.dump()
            );
            assert!(
                !set.data_dir(o).join("member/wal").exists(),
                "pod {o} formed nothing\n{}",
                set.dump()
            );
            assert!(!set.ready(o).await);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    set.shutdown().await;
}

/// A new age key file `name` in `dir`; its path and fingerprint.
fn key_file(dir: &Path, name: &str) -> (std::path::PathBuf, String) {
    let path = dir.join(name);
    std::fs::write(&path, etcd_steward::backup::crypt::Key::generate_file()).unwrap();
    let fingerprint = etcd_steward::backup::crypt::Key::load(&path)
        .unwrap()
        .fingerprint()
        .to_string();
    (path, fingerprint)
}

/// Every volume lost, and the pods restarted with a key that opens no snapshot: they wait,
/// saying the key does not open it (not a checksum failure) and naming the key configured.
/// The operator fixes the key and restarts them on the same volumes: what they remembered
/// held only for the wrong key, so the cluster comes back from the backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_makes_the_pods_wait_and_the_right_key_on_the_same_volumes_restores() {
    let store = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (right, right_fp) = key_file(keys.path(), "right.txt");
    let (wrong, wrong_fp) = key_file(keys.path(), "wrong.txt");
    let mut set = Set::new(STEWARD, Etcd::V3_5, 3).await.unwrap();
    let with_key = |set: &Set, key: &Path| {
        vec![
            format!("--backup-url=file://{}", store.path().display()),
            format!("--etcdutl-bin={}", Etcd::V3_5.offline_tool().display()),
            format!(
                "--backup-scratch-dir={}",
                set.root().join("scratch").display()
            ),
            "--backup-interval=1h".into(),
            "--restore=latest".into(),
            format!("--backup-encryption-key-file={}", key.display()),
            // etcdutl 3.5.1 cannot move the revision forward.
            "--restore-bump-revision=0".into(),
        ]
    };
    set.extra_args = with_key(&set, &right);
    set.start_all(FORM).await.unwrap();
    set.put_keys("k", 40).await.unwrap();
    let snapshot = backup_now(&set, 0).await;

    lose_every_volume(&mut set).await;
    set.extra_args = with_key(&set, &wrong);
    restart_all(&mut set).await;
    let said =
        |set: &Set, o: u32| std::fs::read_to_string(set.log_path(o, "init")).unwrap_or_default();
    wait_for_or(
        Duration::from_secs(30),
        "every pod to wait, saying the configured key does not open the backup",
        || async {
            (0..3).all(|o| {
                let log = said(&set, o);
                log.contains("none is usable")
                    && log.contains(&format!("{snapshot} is encrypted to key {right_fp}"))
                    && log.contains(&format!(
                        "the keys configured now ({wrong_fp}) do not open it"
                    ))
            })
        },
        || set.dump(),
    )
    .await;
    for o in 0..3 {
        let log = said(&set, o);
        let waiting = log
            .lines()
            .rev()
            .find(|l| l.contains("none is usable"))
            .unwrap_or_default();
        assert!(
            !waiting.contains("checksum"),
            "pod {o}: a key that does not open a snapshot is not a checksum failure: {waiting}"
        );
        assert!(set.init_running(o), "pod {o}'s init still waits");
        assert!(
            !set.data_dir(o).join("member/wal").exists(),
            "pod {o} formed nothing"
        );
    }
    // What they wait for is on /ready and in `status` (text and JSON), not only in the log.
    let names_the_keys = |text: &str| {
        text.contains(&format!("{snapshot} is encrypted to key {right_fp}"))
            && text.contains(&format!("the keys configured now ({wrong_fp})"))
    };
    wait_for_or(
        Duration::from_secs(10),
        "every sidecar's /ready to say what init waits for",
        || async {
            let mut all = true;
            for o in 0..3 {
                all &= match set.http(o, "/ready").await {
                    Some((503, body)) => {
                        body.contains("init is waiting: ") && names_the_keys(&body)
                    }
                    _ => false,
                };
            }
            all
        },
        || set.dump(),
    )
    .await;
    let out = set.steward(0, &["status"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    for o in 0..3 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{}: init is waiting", set.member_name(o))))
            .unwrap_or_default();
        assert!(names_the_keys(line), "pod {o} in status:\n{text}");
    }
    let out = set.steward(0, &["status", "-o", "json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    for o in 0..3 {
        let waiting = &json["pods"][o]["waiting"];
        assert_eq!(waiting["kind"], "NoUsableBackup", "pod {o}: {json}");
        assert!(
            names_the_keys(waiting["reason"].as_str().unwrap_or_default()),
            "pod {o}: {json}"
        );
    }

    // The operator fixes the Secret; the pods restart on the volumes they waited with.
    for o in 0..3 {
        set.kill(o).await.unwrap();
        assert!(
            set.data_dir(o)
                .join("member/steward/rejected-snapshots.json")
                .exists(),
            "pod {o} remembered the rejection on its volume"
        );
    }
    set.extra_args = with_key(&set, &right);
    restart_all(&mut set).await;
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "k/").await.unwrap_or(-1),
            40,
            "pod {o}"
        );
        assert!(
            !set.data_dir(o).join("member/steward/waiting.json").exists(),
            "pod {o}: init went on, its waiting note went"
        );
    }
    set.shutdown().await;
}

// A current etcdutl (3.5.30) moves the revision forward: the scenario that shows it.
harness::per_etcd_version!(
    [V3_5Current]: every_volume_lost_the_cluster_comes_back_from_the_latest_backup
);

harness::per_etcd_version!(
    [V3_5, V3_4]:
    every_volume_lost_the_cluster_comes_back_from_the_latest_backup,
    a_corrupted_newest_backup_is_skipped_for_the_one_before,
    restore_never_forms_an_empty_cluster,
    backups_none_of_which_is_usable_mean_waiting_not_an_empty_cluster,
);
