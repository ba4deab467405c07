//! The acts `init` takes become Kubernetes Events on the pod that acted: `init` journals
//! them and execs etcd, the sidecar beside it posts them (src/sidecar/init_events.rs).
//! Real etcd, a real dnsmasq, real `init` and `sidecar` processes on loopback pods, and the
//! fake Kubernetes API (`harness::fake_kube`), which keeps the Events it is sent: the API
//! is up from the first start (a real one would need the pods' etcd first) and can be made
//! to hang (`init` never waits on it). A lost volume's Events against a real API server, on
//! a real Pod object, are tests/kube_calls.rs. Run one scenario per process (each takes the
//! network `STEWARD_TEST_NET`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use harness::fake_kube::FakeKube;
use harness::loopback::Set;
use harness::{wait_for, wait_for_or, Etcd};
use serde_json::Value;

/// The agent under test.
const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");

const FORM: Duration = Duration::from_secs(60);
const HEAL: Duration = Duration::from_secs(90);

async fn api() -> FakeKube {
    FakeKube::start("127.0.0.1:0".parse().unwrap(), "default", "etcd")
        .await
        .unwrap()
}

fn kube_arg(api: &FakeKube) -> String {
    format!("--kube-api-url=http://{}", api.addr())
}

/// The Events regarding pod `o`, with reason `reason`.
fn on(api: &FakeKube, o: u32, reason: &str) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| e["reason"] == reason && e["regarding"]["name"] == format!("etcd-{o}").as_str())
        .collect()
}

/// Waits until pod `o` has an Event `reason` whose note contains `words`; returns it.
async fn event_on(api: &FakeKube, o: u32, reason: &str, words: &str) -> Value {
    wait_for_or(
        HEAL,
        &format!("a {reason} Event on etcd-{o}"),
        || async { on(api, o, reason).iter().any(|e| note(e).contains(words)) },
        || format!("{:#?}", api.events()),
    )
    .await;
    on(api, o, reason)
        .into_iter()
        .find(|e| note(e).contains(words))
        .unwrap()
}

fn note(e: &Value) -> &str {
    e["note"].as_str().unwrap_or_default()
}

/// Pod `o`'s sidecar killed and started again; the Events stay as they were.
async fn restart_sidecar_changes_no_event(set: &mut Set, api: &FakeKube, o: u32) {
    let before = api.events().len();
    set.kill_sidecar(o).await;
    set.start_sidecar(o).unwrap();
    wait_for(FORM, "the restarted sidecar serves", || async {
        set.http(o, "/healthz").await.is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        api.events().len(),
        before,
        "a restarted sidecar posts no entry again: {:#?}",
        api.events()
    );
}

/// A formed set: each pod bootstrapped; then pod 2's volume is lost (its stale member is
/// replaced, it joins as a learner) and pod 1's member is removed while it is down (its
/// data is set aside, it joins anew). Each act is an Event on the pod that took it, once.
async fn a_lost_volume_and_a_removed_member_are_events_on_the_pods_that_acted(etcd: Etcd) {
    let api = api().await;
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec![kube_arg(&api)];
    set.start_all(FORM).await.unwrap();
    for o in 0..3 {
        let e = event_on(&api, o, "Bootstrapped", "form a new cluster").await;
        assert_eq!(e["type"], "Normal");
        assert_eq!(e["reportingController"], "etcd-steward");
        assert_eq!(e["reportingInstance"], format!("etcd-{o}").as_str());
    }
    set.put_keys("k", 20).await.unwrap();

    let stale = format!("{:x}", set.member_id(2).await.unwrap());
    set.kill(2).await.unwrap();
    set.wipe(2).unwrap();
    set.start(2).unwrap();
    set.wait_ready(&[0, 1, 2], 3, HEAL).await.unwrap();
    let replaced = event_on(&api, 2, "MemberReplaced", &stale).await;
    assert_eq!(replaced["type"], "Warning");
    assert!(
        note(&replaced).contains("joins as a new learner"),
        "{replaced}"
    );
    event_on(&api, 2, "JoinedAsLearner", "join as a learner").await;
    for o in [0, 1] {
        assert!(
            on(&api, o, "MemberReplaced").is_empty(),
            "{:#?}",
            api.events()
        );
    }
    restart_sidecar_changes_no_event(&mut set, &api, 2).await;

    let removed = set.member_id(1).await.unwrap();
    set.kill(1).await.unwrap();
    // etcd refuses to remove a voter while the cluster looks unhealthy without it (pod 2
    // joined moments ago): asked again until it agrees.
    wait_for(HEAL, "member 1 removed", || async {
        let Ok(mut c) = set.client(0).await else {
            return false;
        };
        c.member_remove(removed).await.is_ok()
    })
    .await;
    set.start(1).unwrap();
    set.wait_ready(&[0, 1, 2], 3, HEAL).await.unwrap();
    let aside = event_on(&api, 1, "DataSetAside", "removed-member/member").await;
    assert_eq!(aside["type"], "Warning");
    assert!(note(&aside).contains("renamed, not deleted"), "{aside}");
    let to = note(&aside).split_whitespace().nth(4).unwrap();
    assert!(
        set.data_dir(1).join(to).join("wal").is_dir(),
        "the note names where the data went: {to}"
    );
    event_on(&api, 1, "JoinedAsLearner", "join as a learner").await;
    assert_eq!(on(&api, 1, "DataSetAside").len(), 1, "{:#?}", api.events());
    set.shutdown().await;
}

/// Every volume lost, backups configured: each pod is restored from the newest snapshot
/// and says so on its pod, naming the snapshot and the revisions around the jump.
async fn every_volume_lost_each_pod_shows_restored_from_backup_naming_the_snapshot(etcd: Etcd) {
    let api = api().await;
    let store = tempfile::tempdir().unwrap();
    let (mut set, snapshot) = backed_up_then_every_volume_lost(&api, store.path(), etcd).await;
    for o in 0..3 {
        set.start(o).unwrap();
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    for o in 0..3 {
        let e = event_on(&api, o, "RestoredFromBackup", &snapshot).await;
        assert_eq!(e["type"], "Warning");
        assert!(
            note(&e).contains("before the jump") || note(&e).contains("no jump"),
            "{e}"
        );
    }
    set.shutdown().await;
}

/// A formed set with backups into `store` (restore `latest`), one snapshot taken (its name),
/// then every pod's processes killed and its volume gone.
async fn backed_up_then_every_volume_lost(
    api: &FakeKube,
    store: &Path,
    etcd: Etcd,
) -> (Set, String) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec![
        kube_arg(api),
        format!("--backup-url=file://{}", store.display()),
        format!(
            "--backup-scratch-dir={}",
            set.root().join("scratch").display()
        ),
        "--backup-interval=1h".into(),
        "--restore=latest".into(),
    ];
    set.extra_args
        .extend(harness::etcd::jump_args(&etcd.offline_tool()));
    set.start_all(FORM).await.unwrap();
    set.put_keys("k", 20).await.unwrap();
    let snapshot = backup_now(&set, 0, store).await;
    for o in 0..3 {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    (set, snapshot)
}

/// Every volume lost and every snapshot in the store corrupted: the pods wait, and say so
/// on their pods as `RestoreHeld`, one Event each however many rounds they wait.
async fn no_usable_backup_is_restore_held_on_the_waiting_pods(etcd: Etcd) {
    let api = api().await;
    let store = tempfile::tempdir().unwrap();
    let (mut set, _) = backed_up_then_every_volume_lost(&api, store.path(), etcd).await;
    for entry in std::fs::read_dir(store.path().join("snapshots")).unwrap() {
        let db = entry.unwrap().path();
        if db.extension().is_some_and(|x| x == "db") {
            let mut bytes = std::fs::read(&db).unwrap();
            let last = bytes.len() - 40;
            bytes[last] ^= 0xff;
            std::fs::write(&db, bytes).unwrap();
        }
    }
    for o in 0..3 {
        set.start(o).unwrap();
    }
    let held = event_on(&api, 0, "RestoreHeld", "none is usable").await;
    assert_eq!(held["type"], "Warning");
    // Looked at again every 30 s while the wait lasts: the same Event's count grows.
    wait_for_or(
        HEAL,
        "RestoreHeld's series to count a second look",
        || async {
            on(&api, 0, "RestoreHeld")
                .iter()
                .any(|e| e["series"]["count"].as_i64() >= Some(2))
        },
        || format!("{:#?}", api.events()),
    )
    .await;
    assert_eq!(
        on(&api, 0, "RestoreHeld").len(),
        1,
        "one Event while the wait lasts: {:#?}",
        api.events()
    );
    let formed: usize = (0..3).map(|o| on(&api, o, "Bootstrapped").len()).sum();
    // Only the first formation (a pod whose volume was wiped before its sidecar posted its
    // Bootstrapped never posts it: the journal went with the volume).
    assert!(
        (1..=3).contains(&formed),
        "only the first formation: {:#?}",
        api.events()
    );
    assert!(
        api.events()
            .iter()
            .all(|e| e["reason"] != "RestoredFromBackup"),
        "{:#?}",
        api.events()
    );
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_usable_backup_is_restore_held_on_the_waiting_pods_3_5_current() {
    no_usable_backup_is_restore_held_on_the_waiting_pods(Etcd::V3_5Current).await;
}

/// `etcd-steward backup` through pod `o`'s member into `store`: a verified snapshot's name.
async fn backup_now(set: &Set, o: u32, store: &Path) -> String {
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
    let manifest: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(manifest["verified"], true, "{manifest}");
    assert!(store.join("snapshots").is_dir());
    manifest["name"].as_str().unwrap().to_string()
}

/// Two of three volumes lost, `recover --yes`: the survivor's pod shows the recovery
/// starting and the cluster back from its data.
async fn a_recovery_is_recovery_started_and_recovered_from_survivor_on_the_survivors_pod(
    etcd: Etcd,
) {
    let api = api().await;
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec![kube_arg(&api)];
    set.start_all(FORM).await.unwrap();
    set.put_keys("k", 20).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for o in [0, 2] {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in [0, 2] {
        set.start(o).unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let out = recover_yes(&mut set, 2).await;
    assert!(
        out.status.success(),
        "recover --yes: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        set.dump()
    );
    let deadline = tokio::time::Instant::now() + HEAL;
    while !(set.all_linearizable(&[0, 1, 2], 3).await && set.all_ready(&[0, 1, 2]).await) {
        set.restart_exited().unwrap();
        assert!(tokio::time::Instant::now() < deadline, "{}", set.dump());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let started = event_on(&api, 1, "RecoveryStarted", "--force-new-cluster").await;
    assert_eq!(started["type"], "Warning");
    event_on(&api, 1, "RecoveredFromSurvivor", "surviving data").await;
    for o in [0, 2] {
        assert!(
            on(&api, o, "RecoveryStarted").is_empty(),
            "{:#?}",
            api.events()
        );
        event_on(&api, o, "JoinedAsLearner", "join as a learner").await;
    }
    assert_eq!(on(&api, 1, "RecoveredFromSurvivor").len(), 1);
    set.shutdown().await;
}

/// Runs `recover --yes` in pod `o` while restarting exited etcd containers, as kubelet
/// would.
async fn recover_yes(set: &mut Set, o: u32) -> Output {
    let cmd = set.steward_in(o, &["recover", "--yes", "--timeout=80s"]);
    set.run_restarting(cmd).await
}

/// The time of the first log line of `init`'s log `logs` whose message is `message`.
fn logged_at(logs: &str, message: &str) -> Option<std::time::SystemTime> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["message"] == message)
        .and_then(|v| {
            let t = v["timestamp"].as_str()?.trim_end_matches('Z').to_string();
            humantime::parse_rfc3339_weak(&t).ok()
        })
}

/// Pod 2's volume lost `runs` times: `init`'s time from its first decision to `exec etcd`
/// (a replace, a join and a resume, each journaled for the sidecar to post), in ms.
async fn decision_to_exec_ms(set: &mut Set, runs: usize) -> Vec<f64> {
    let mut took = Vec::new();
    for _ in 0..runs {
        set.kill(2).await.unwrap();
        set.wipe(2).unwrap();
        set.start(2).unwrap();
        set.wait_ready(&[0, 1, 2], 3, HEAL).await.unwrap();
        let logs = set.read_logs(2, "init");
        let (Some(decided), Some(exec)) =
            (logged_at(&logs, "decision"), logged_at(&logs, "exec etcd"))
        else {
            panic!("no decision or exec logged:\n{logs}");
        };
        took.push(
            exec.duration_since(decided)
                .unwrap_or_default()
                .as_secs_f64()
                * 1000.0,
        );
    }
    took.sort_by(f64::total_cmp);
    took
}

/// Posting never delays `init`: with the API hanging on every call, its time from decision
/// to exec is what it is with the API up (BENCHMARKS.md, *Events and init's exec*).
async fn init_execs_etcd_as_soon_with_the_api_hanging_as_with_it_up(etcd: Etcd) {
    let api = api().await;
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec![kube_arg(&api)];
    set.start_all(FORM).await.unwrap();
    let runs = std::env::var("INIT_EVENTS_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let up = decision_to_exec_ms(&mut set, runs).await;
    assert!(
        !on(&api, 2, "MemberReplaced").is_empty(),
        "{:#?}",
        api.events()
    );
    api.set_silent(true);
    let hanging = decision_to_exec_ms(&mut set, runs).await;
    let median = |v: &[f64]| v[v.len() / 2];
    eprintln!("init decision→exec ms, API up: {up:?} (median {:.1}); API hanging: {hanging:?} (median {:.1})", median(&up), median(&hanging));
    // The runs vary by hundreds of ms with the API up as well (the membership changes and
    // init's retries): medians compared, with a second's margin.
    // An init that waited on a hanging API would wait its call time-out for each act.
    assert!(
        median(&hanging) < median(&up) + 1000.0,
        "API up: {up:?} ms; hanging: {hanging:?} ms"
    );
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_execs_etcd_as_soon_with_the_api_hanging_as_with_it_up_3_5() {
    init_execs_etcd_as_soon_with_the_api_hanging_as_with_it_up(Etcd::V3_5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_volume_and_a_removed_member_are_events_on_the_pods_that_acted_3_5() {
    a_lost_volume_and_a_removed_member_are_events_on_the_pods_that_acted(Etcd::V3_5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_volume_lost_each_pod_shows_restored_from_backup_naming_the_snapshot_3_5_current() {
    every_volume_lost_each_pod_shows_restored_from_backup_naming_the_snapshot(Etcd::V3_5Current)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_is_recovery_started_and_recovered_from_survivor_on_the_survivors_pod_3_5() {
    a_recovery_is_recovery_started_and_recovered_from_survivor_on_the_survivors_pod(Etcd::V3_5)
        .await;
}
