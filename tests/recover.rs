//! A majority of volumes lost: `etcd-steward recover` brings the cluster back from the
//! freshest surviving volume. Real etcd (3.5.1 and 3.4.23), a real dnsmasq, real `init`,
//! `sidecar` and `recover` processes on loopback pods; the harness restarts an etcd
//! container whose process exits, as kubelet does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::Duration;

use harness::loopback::Set;
use harness::{wait_for, wait_for_or, Etcd};

/// The agent under test.
const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");

const FORM: Duration = Duration::from_secs(60);
const RECOVER: Duration = Duration::from_secs(90);

/// A formed three-pod set holding `n` keys under `k/`, the writes settled on every member.
/// Its sidecars and commands share a control token file (`--control-token-file`), as the
/// chart mounts one Secret into both containers.
async fn formed_with_keys(etcd: Etcd, n: usize) -> Set {
    formed(Set::new(STEWARD, etcd, 3).await.unwrap(), n).await
}

async fn formed(mut set: Set, n: usize) -> Set {
    set.start_all(FORM).await.unwrap();
    set.put_keys("k", n).await.unwrap();
    // Followers learn the commit index with the next heartbeat and persist it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    set
}

/// Pods `lost` are gone with their volumes and come back empty (their init waits).
async fn lose_volumes(set: &mut Set, lost: &[u32]) {
    for &o in lost {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for &o in lost {
        set.start(o).unwrap();
    }
}

async fn recover(set: &Set, o: u32, extra: &[&str]) -> Output {
    let args: Vec<&str> = std::iter::once("recover")
        .chain(extra.iter().copied())
        .collect();
    set.steward(o, &args).await
}

/// The plan `recover` printed (its first stdout line).
fn plan_of(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    serde_json::from_str(first).unwrap_or_else(|e| {
        panic!(
            "not a JSON plan ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs `recover --yes` in pod `o` while restarting exited etcd containers, as kubelet
/// would; returns its output.
async fn recover_yes(set: &mut Set, o: u32, extra: &[&str]) -> Output {
    let mut args = vec!["recover", "--yes", "--timeout=80s"];
    args.extend_from_slice(extra);
    let cmd = set.steward_in(o, &args);
    set.run_restarting(cmd).await
}

/// Waits until every pod is a ready voter, restarting exited etcd containers meanwhile.
async fn all_ready_voters(set: &mut Set) {
    let deadline = tokio::time::Instant::now() + RECOVER;
    loop {
        set.restart_exited().unwrap();
        if set.all_linearizable(&[0, 1, 2], 3).await && set.all_ready(&[0, 1, 2]).await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("not three ready voters after {RECOVER:?}\n{}", set.dump());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn two_of_three_volumes_lost_recover_yes_brings_back_three_voters_with_every_write(
    etcd: Etcd,
) {
    let mut set = formed_with_keys(etcd, 200).await;
    let cluster = set.cluster_id(1).await.unwrap();
    let old_ids = [
        set.member_id(0).await.unwrap(),
        set.member_id(2).await.unwrap(),
    ];
    // Pod 1 survives: the plan must choose by evidence, not by ordinal.
    lose_volumes(&mut set, &[0, 2]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!set.ready(1).await, "no quorum: the survivor is not ready");
    let survivor_pid = set.etcd_pid(1);

    // Without --yes: the plan, and nothing changes.
    let out = recover(&set, 0, &[]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = plan_of(&out);
    assert_eq!(plan["state"], "planned", "{plan}");
    assert_eq!(plan["survivor"], "etcd-1", "{plan}");
    let steps: Vec<&str> = plan["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["step"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["join", "force-new-cluster", "join"], "{plan}");
    assert!(
        plan["pods"][1]["log"]["commit"].as_u64().unwrap() > 200,
        "{plan}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        set.etcd_pid(1),
        survivor_pid,
        "a plan alone changes nothing"
    );
    assert!(set.init_running(1));

    // With --yes, run in another pod than the survivor's.
    let out = recover_yes(&mut set, 2, &[]).await;
    assert!(
        out.status.success(),
        "recover --yes: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        set.dump()
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"recovered\""));
    all_ready_voters(&mut set).await;
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "k/").await.unwrap_or(-1),
            200,
            "pod {o}"
        );
        assert_eq!(
            set.cluster_id(o).await.unwrap(),
            cluster,
            "pod {o}: the same cluster"
        );
    }
    for (o, old) in [(0, old_ids[0]), (2, old_ids[1])] {
        assert_ne!(
            set.member_id(o).await.unwrap(),
            old,
            "pod {o} joined with a new member ID"
        );
    }
    assert_eq!(set.members(1).await.unwrap().len(), 3);
    let logs = set.logs(1);
    assert!(logs.contains("--force-new-cluster"), "{}", set.dump());
    let (_, metrics) = set.http(1, "/metrics").await.unwrap();
    assert!(
        metrics.contains("etcd_steward_recoveries_total 1"),
        "recoveries counted once:\n{metrics}"
    );
    // Writes go on, and running the command again finds the recovery done.
    set.put_keys("after", 5).await.unwrap();
    let again = recover(&set, 0, &["--yes"]).await;
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(plan_of(&again)["state"], "recovered");
    set.shutdown().await;
}

async fn recover_refuses_while_the_cluster_has_quorum_or_a_pod_is_silent(etcd: Etcd) {
    let mut set = formed_with_keys(etcd, 20).await;
    let out = recover(&set, 0, &["--yes"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("quorum") && err.lines().count() == 1, "{err}");

    // Pod 2 lost its volume; pod 0's pod is gone altogether (silent): it could hold
    // fresher data than pod 1.
    lose_volumes(&mut set, &[2]).await;
    set.kill(0).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let survivor_pid = set.etcd_pid(1);
    let out = recover(&set, 1, &["--yes"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("etcd-0") && err.contains("--force-lost"),
        "{err}"
    );
    // A request handed over would stop etcd within a sidecar tick: watched for 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(set.init_running(1), "nothing was stopped");
    assert_eq!(set.etcd_pid(1), survivor_pid, "etcd was not restarted");

    // Named lost for good: the plan goes ahead, from pod 1.
    let out = recover(&set, 1, &["--force-lost", "etcd-0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = plan_of(&out);
    assert_eq!(plan["survivor"], "etcd-1", "{plan}");
    assert_eq!(plan["pods"][0]["step"], "lost", "{plan}");
    set.shutdown().await;
}

async fn a_recover_command_killed_after_handing_over_the_request_still_completes(etcd: Etcd) {
    let mut set = formed_with_keys(etcd, 50).await;
    lose_volumes(&mut set, &[1, 2]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut child = set.steward_in(1, &["recover", "--yes"]).spawn().unwrap();
    // Killed as soon as the survivor's sidecar holds the request.
    wait_for(FORM, "the survivor's sidecar holds the request", || async {
        set.peer_http(0, "/peer/report")
            .await
            .is_some_and(|(_, body)| body.contains("recovery_request"))
    })
    .await;
    child.kill().await.unwrap();
    all_ready_voters(&mut set).await;
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "k/").await.unwrap_or(-1),
            50,
            "pod {o}"
        );
    }
    // The survivor's etcd, killed now, restarts normally: the forced start is not repeated.
    // A second one would make the survivor a one-member cluster again: the other two
    // would be removed and come back as new members, with new IDs. They keep theirs.
    let mut ids_before = Vec::new();
    for o in [1u32, 2] {
        ids_before.push(set.member_id(o).await.unwrap());
    }
    set.kill_etcd(0).await;
    set.start_init(0).unwrap();
    // A forced start happens before etcd serves: once all three are ready voters again,
    // a second one would already have removed the others, who rejoined with new IDs.
    all_ready_voters(&mut set).await;
    for (o, before) in [1u32, 2].iter().zip(&ids_before) {
        assert_eq!(
            set.member_id(*o).await.unwrap(),
            *before,
            "pod {o} is still the member it joined as (no second forced start removed it)\n{}",
            set.dump()
        );
    }
    assert_eq!(
        set.members(0).await.unwrap().len(),
        3,
        "no member was dropped again"
    );
    let forced = set
        .logs(0)
        .matches("recovery: starting etcd with --force-new-cluster")
        .count();
    assert_eq!(forced, 1, "forced exactly once:\n{}", set.dump());
    set.shutdown().await;
}

/// How many entries past etcd's last reported index a stopped member's log may hold.
const TAIL_SLACK: u64 = 5;

async fn the_wal_tail_matches_what_etcd_reported_before_it_stopped(etcd: Etcd) {
    let mut set = formed_with_keys(etcd, 120).await;
    for o in 0..3 {
        let status = set.status(o).await.unwrap();
        // Stopped as the sidecar stops it for a recovery: SIGTERM, so etcd closes its WAL
        // (a SIGKILL can leave the newest commit index in etcd's write buffer: the WAL
        // then says one heartbeat less, and --force-new-cluster keeps only that much).
        let pid = set.etcd_pid(o).unwrap();
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(term.success());
        wait_for(FORM, "etcd stops on SIGTERM", || {
            let running = set.init_running(o);
            async move { !running }
        })
        .await;
        let tail = etcd_steward::volume::log_tail(set.data_dir(o))
            .unwrap()
            .expect("a WAL");
        assert!(
            tail.commit >= status.raft_index(),
            "pod {o}: commit {} < applied {}",
            tail.commit,
            status.raft_index()
        );
        assert!(tail.last_index >= tail.commit, "pod {o}: {tail:?}");
        // Upper bounds: nothing was written after the status, so the log holds at most
        // the few entries a stop adds (a leader's hand-over: an election's empty entry,
        // a conf state) past what etcd reported; a scanner that read garbage or another
        // file's records would overshoot.
        assert!(
            tail.last_index <= status.raft_index() + TAIL_SLACK,
            "pod {o}: last index {} beyond {} + {TAIL_SLACK}: {tail:?}",
            tail.last_index,
            status.raft_index()
        );
        // A stopping leader hands leadership over first: the term may have moved on.
        assert!(tail.last_term >= status.raft_term(), "pod {o}: {tail:?}");
        assert!(
            tail.term <= status.raft_term() + 2,
            "pod {o}: term {} beyond {} + 2: {tail:?}",
            tail.term,
            status.raft_term()
        );
        assert!(tail.term >= tail.last_term, "pod {o}: {tail:?}");
        // The sidecar reports the same evidence, once it has read the volume since etcd
        // stopped (it reads it once per tick: a report of the tick before shows less).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let (_, body) = set.peer_http(o, "/peer/report").await.unwrap();
            let report: serde_json::Value = serde_json::from_str(&body).unwrap();
            let reported = report["log"]["commit"].as_u64();
            if reported == Some(tail.commit) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "pod {o}: the sidecar still reports commit {reported:?}, the volume holds {}: {body}",
                tail.commit
            );
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
    set.shutdown().await;
}

/// The volumes hold the log once more, not twice: etcd keeps a 64 MB WAL segment and
/// preallocates the next one (`wal/0.tmp`, left on disk when etcd is killed), and init
/// copies `member/` aside before the forced start — a copy that took the preallocated
/// segment too filled the survivor's volume, and init never started etcd again (chaos seed
/// 12 on 3.5.30).
const VOLUME_MIB: u32 = 224;

async fn auto_recovery_recovers_a_wiped_majority_from_the_survivor(etcd: Etcd) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec!["--auto-recover-after=3s".into()];
    set.limit_volumes(VOLUME_MIB).unwrap();
    set.start_all(FORM).await.unwrap();
    set.put_keys("k", 80).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Every pod goes down at once (the survivor's etcd killed too), two for good.
    set.kill(2).await.unwrap();
    lose_volumes(&mut set, &[0, 1]).await;
    set.start(2).unwrap();
    all_ready_voters(&mut set).await;
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "k/").await.unwrap_or(-1),
            80,
            "pod {o}"
        );
    }
    assert!(
        set.logs(2)
            .contains("auto-recover: a majority of the initial pods"),
        "{}",
        set.dump()
    );
    set.shutdown().await;
}

async fn auto_recovery_never_fires_while_pods_are_only_down_or_unreachable(etcd: Etcd) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec!["--auto-recover-after=2s".into()];
    set.start_all(FORM).await.unwrap();
    set.put_keys("k", 10).await.unwrap();
    // Pod 0's processes are dead but its name is published (nothing answers there); pod 2
    // is gone altogether. Their volumes are intact: silence is no proof of loss.
    set.kill_processes(0).await;
    set.kill(2).await.unwrap();
    let pid = set.etcd_pid(1);
    for _ in 0..40 {
        set.restart_exited().unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(set.etcd_pid(1), pid, "the survivor's etcd was not stopped");
    assert!(set.init_running(1));
    assert!(
        !set.data_dir(1)
            .join("member/steward/recovery.json")
            .exists(),
        "no recovery started"
    );
    // Back up: the cluster is the one it was, with its three members.
    set.start(0).unwrap();
    set.start(2).unwrap();
    all_ready_voters(&mut set).await;
    assert_eq!(set.count_keys_on(0, "k/").await.unwrap_or(-1), 10);
    assert!(
        !set.logs(1).contains("auto-recover: a majority"),
        "{}",
        set.dump()
    );
    set.shutdown().await;
}

async fn restore_snapshot_takes_a_live_cluster_back_setting_every_volume_aside(etcd: Etcd) {
    let store = tempfile::tempdir().unwrap();
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec![
        format!("--backup-url=file://{}", store.path().display()),
        format!("--etcdutl-bin={}", etcd.offline_tool().display()),
        format!(
            "--backup-scratch-dir={}",
            set.root().join("scratch-{ordinal}").display()
        ),
        "--backup-interval=1h".into(),
        // Not restored when volumes are lost: only at the operator's request.
        "--restore=never".into(),
    ];
    set.extra_args
        .extend(harness::etcd::jump_args(&etcd.offline_tool()));
    set.start_all(FORM).await.unwrap();
    set.put_keys("k", 60).await.unwrap();
    let out = set.steward(0, &["backup"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let snapshot = manifest["name"].as_str().unwrap().to_string();
    // At 10:02 someone writes over everything.
    set.put_keys("oops", 15).await.unwrap();
    let old_cluster = set.cluster_id(0).await.unwrap();
    let mut served = 0;
    for o in 0..3 {
        served = served.max(set.revision(o).await.unwrap());
    }

    let snapshot_arg = format!("--snapshot={snapshot}");
    let restore = |extra: &[&str]| {
        let mut args = vec!["restore", snapshot_arg.as_str()];
        args.extend_from_slice(extra);
        set.steward_in(1, &args)
    };
    let out = restore(&["--snapshot-missing-check"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "an unknown option is a usage error"
    );
    let out = restore(&[]).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(plan_of(&out)["state"], "planned");
    assert_eq!(
        set.count_keys_on(0, "oops/").await.unwrap(),
        15,
        "a plan changes nothing"
    );

    let cmd = restore(&["--yes", "--timeout=80s"]);
    let out = set.run_restarting(cmd).await;
    assert!(
        out.status.success(),
        "restore --yes: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        set.dump()
    );
    all_ready_voters(&mut set).await;
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "k/").await.unwrap_or(-1),
            60,
            "pod {o}"
        );
        assert_eq!(
            set.count_keys_on(o, "oops/").await.unwrap_or(-1),
            0,
            "pod {o}"
        );
        let aside: Vec<_> = std::fs::read_dir(set.data_dir(o).join("set-aside"))
            .unwrap()
            .filter_map(Result::ok)
            .collect();
        assert_eq!(
            aside.len(),
            1,
            "pod {o}: its earlier data set aside once, not deleted"
        );
        assert!(aside[0].path().join("member/wal").exists(), "pod {o}");
    }
    assert_ne!(
        set.cluster_id(0).await.unwrap(),
        old_cluster,
        "a re-formed cluster"
    );
    if etcd == Etcd::V3_5Current {
        // etcd 3.5.30's etcdutl moves the revision forward: no revision the old cluster
        // served is served again, and clients resuming from one re-list.
        for o in 0..3 {
            let now = set.revision(o).await.unwrap();
            assert!(
                now > served,
                "pod {o}: revision {now} is above the {served} served before"
            );
            let (read, watch) = set.compacted_at(o, served).await.unwrap();
            assert!(read && watch, "pod {o}: a read ({read}) and a watch ({watch}) at revision {served} fail as compacted");
        }
    }
    // Once per request: a pod restarted while the request is still held is not set aside
    // again.
    set.kill_etcd(2).await;
    set.start_init(2).unwrap();
    all_ready_voters(&mut set).await;
    let aside = std::fs::read_dir(set.data_dir(2).join("set-aside"))
        .unwrap()
        .count();
    assert_eq!(aside, 1);
    assert_eq!(set.count_keys_on(2, "k/").await.unwrap_or(-1), 60);
    set.shutdown().await;
}

async fn a_recovery_with_the_survivors_sidecar_and_etcd_killed_midway_completes_once(etcd: Etcd) {
    let mut set = formed_with_keys(etcd, 70).await;
    lose_volumes(&mut set, &[1, 2]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let child = set
        .steward_in(2, &["recover", "--yes", "--timeout=80s"])
        .spawn()
        .unwrap();
    let run = tokio::spawn(child.wait_with_output());
    // The survivor's sidecar dies as soon as it holds the request (before or after it
    // stopped etcd), and comes back without it.
    wait_for(FORM, "the survivor's sidecar holds the request", || async {
        set.peer_http(0, "/peer/report")
            .await
            .is_some_and(|(_, body)| body.contains("recovery_request"))
    })
    .await;
    set.kill_sidecar(0).await;
    set.start_sidecar(0).unwrap();
    // The survivor's etcd is SIGKILLed as soon as init wrote the recovery marker: whether
    // or not the forced start committed, the next start finishes it, never twice.
    let marker = set.data_dir(0).join("member/steward/recovery.json");
    let deadline = tokio::time::Instant::now() + RECOVER;
    while !marker.exists() {
        set.restart_exited().unwrap();
        assert!(tokio::time::Instant::now() < deadline, "{}", set.dump());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    set.kill_etcd(0).await;
    set.start_init(0).unwrap();
    while !run.is_finished() {
        set.restart_exited().unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = run.await.unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        set.dump()
    );
    all_ready_voters(&mut set).await;
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "k/").await.unwrap_or(-1),
            70,
            "pod {o}"
        );
    }
    assert_eq!(set.members(0).await.unwrap().len(), 3);
    let (_, metrics) = set.http(0, "/metrics").await.unwrap();
    assert!(
        metrics.contains("etcd_steward_recoveries_total 1"),
        "one recovery:\n{metrics}"
    );
    set.shutdown().await;
}

/// How many times the premise (a burst of writes, then SIGKILL of every pod) is tried until
/// the survivor's commit index on disk lags its last entry.
const PREMISE_ATTEMPTS: u32 = 5;

/// Writes `n` keys `<prefix>/<i>` through pod `o` (the leader); each one acknowledged, with
/// the revision etcd's response header gave it.
async fn put_through(set: &Set, o: u32, prefix: &str, n: usize) -> Vec<(String, i64)> {
    let mut c = set.client(o).await.unwrap();
    let mut acked = Vec::new();
    for i in 0..n {
        let key = format!("{prefix}/{i:05}");
        let r = c.put(key.clone(), format!("v{i}"), None).await.unwrap();
        acked.push((key, r.header().unwrap().revision()));
    }
    acked
}

/// Whether pod `o` serves `key` on a serializable read (from its own copy).
async fn serves(set: &Set, o: u32, key: &str) -> bool {
    let Ok(mut c) = set.client(o).await else {
        return false;
    };
    let opts = etcd_client::GetOptions::new().with_serializable();
    c.get(key, Some(opts))
        .await
        .is_ok_and(|r| r.kvs().len() == 1)
}

/// Every member's HashKV at one revision every member has reached, all equal.
async fn every_member_hashes_alike(set: &Set) {
    let rev = set.status(0).await.unwrap().header().unwrap().revision();
    wait_for_or(
        RECOVER,
        "every member reaches the revision",
        || async move {
            let mut all = true;
            for o in 0..3 {
                all &= set
                    .status(o)
                    .await
                    .is_ok_and(|s| s.header().is_some_and(|h| h.revision() >= rev));
            }
            all
        },
        || set.dump(),
    )
    .await;
    let mut hashes = Vec::new();
    for o in 0..3 {
        let c = set.client(o).await.unwrap();
        let h = c.maintenance_client().hash_kv(rev).await.unwrap();
        hashes.push(h.hash());
    }
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "HashKV at revision {rev}: {hashes:?}"
    );
}

/// etcd writes a hard state whose only change is the commit index without an fsync, so a
/// follower SIGKILLed right after serving the last write has a commit index on disk behind
/// its last entry; `--force-new-cluster` alone would discard those entries.
async fn a_recovery_keeps_every_acknowledged_write_though_the_survivors_commit_index_lags(
    etcd: Etcd,
) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.start_all(FORM).await.unwrap();
    let mut acked = Vec::new();
    let mut premise = None;
    for attempt in 1..=PREMISE_ATTEMPTS {
        set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
        let leader = set.leader().await.unwrap();
        let follower = (leader + 1) % 3;
        let keys = put_through(&set, leader, &format!("w/{attempt}"), 100).await;
        let last = keys.last().cloned().unwrap().0;
        acked.extend(keys);
        wait_for_or(
            FORM,
            "the follower serves the last write",
            || serves(&set, follower, &last),
            || set.dump(),
        )
        .await;
        // What etcd itself says the follower has committed: the independent side of the
        // comparison with what the WAL scanner reads from its volume after the kill.
        let reported = set.status(follower).await.unwrap().raft_index();
        for o in [leader, follower, (leader + 2) % 3] {
            set.kill_processes(o).await;
        }
        let tail = etcd_steward::volume::log_tail(set.data_dir(follower))
            .unwrap()
            .expect("a WAL");
        // Every entry etcd reported committed is in the follower's log (entries are synced
        // before they are acknowledged); a scanner that stopped early, or read past the
        // log's end into garbage, is caught here.
        assert!(
            tail.last_index >= reported && tail.last_index <= reported + TAIL_SLACK,
            "etcd-{follower}: the WAL's last index {} is not within {reported}..={} (etcd's reported commit index before the kill): {tail:?}",
            tail.last_index,
            reported + TAIL_SLACK
        );
        if tail.commit < reported {
            premise = Some((follower, tail, reported));
            break;
        }
        for o in 0..3 {
            set.start(o).unwrap();
        }
    }
    let Some((survivor, tail, reported)) = premise else {
        panic!(
            "in {PREMISE_ATTEMPTS} bursts the follower's commit index on disk never lagged the one etcd reported: the premise did not occur\n{}",
            set.dump()
        );
    };
    eprintln!("survivor etcd-{survivor}: {tail:?}, etcd reported commit index {reported}");
    for o in (0..3).filter(|o| *o != survivor) {
        set.wipe(o).unwrap();
    }
    for o in 0..3 {
        set.start(o).unwrap();
    }
    let asker = (survivor + 1) % 3;
    let plan = wait_for_plan(&set, asker).await;
    assert_eq!(plan["survivor"], format!("etcd-{survivor}"), "{plan}");
    assert_eq!(
        plan["keeps_entries_beyond_commit"].as_u64(),
        Some(tail.last_index - tail.commit),
        "{plan}"
    );
    let out = recover_yes(&mut set, asker, &[]).await;
    assert!(
        out.status.success(),
        "recover --yes: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        set.dump()
    );
    all_ready_voters(&mut set).await;
    for o in 0..3 {
        let mut c = set.client(o).await.unwrap();
        let opts = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_serializable();
        let held: std::collections::BTreeMap<String, i64> = c
            .get("w/", Some(opts))
            .await
            .unwrap()
            .kvs()
            .iter()
            .map(|kv| (kv.key_str().unwrap().to_string(), kv.mod_revision()))
            .collect();
        // Each acknowledged write back at the revision etcd acknowledged it at.
        let missing: Vec<&(String, i64)> = acked
            .iter()
            .filter(|(k, r)| held.get(k) != Some(r))
            .collect();
        assert!(
            missing.is_empty(),
            "pod {o} lost {} acknowledged writes (or holds them at another revision): {missing:?}",
            missing.len()
        );
    }
    every_member_hashes_alike(&set).await;
    let aside = std::fs::read_dir(set.data_dir(survivor).join("set-aside"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with("-before-recovery")
        })
        .count();
    assert_eq!(aside, 1, "one copy aside before the forced start");
    set.shutdown().await;
}

/// The plan `recover` prints from pod `o`, once every pod's sidecar answers.
async fn wait_for_plan(set: &Set, o: u32) -> serde_json::Value {
    let plan = std::sync::Mutex::new(serde_json::Value::Null);
    let shared = &plan;
    wait_for_or(
        RECOVER,
        "recover prints a plan",
        || async move {
            let out = recover(set, o, &[]).await;
            if out.status.success() {
                *shared.lock().unwrap() = plan_of(&out);
            }
            out.status.success()
        },
        || set.dump(),
    )
    .await;
    plan.into_inner().unwrap()
}

/// With neither peer TLS nor a control token the commands refuse at once, naming the
/// option that turns control requests on, and no sidecar is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_or_peer_tls_recover_yes_and_restore_yes_say_which_option_turns_them_on() {
    let mut set = Set::new(STEWARD, Etcd::V3_5, 3).await.unwrap();
    set.control_token = None;
    for args in [
        vec!["recover", "--yes"],
        vec!["restore", "--snapshot=20260101T000000.000Z-r1", "--yes"],
    ] {
        let out = set.steward(0, &args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{args:?}: one line: {stderr}"
        );
        assert!(
            stderr.contains("--control-token-file"),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("peer TLS"), "{args:?}: {stderr}");
    }
    set.shutdown().await;
}

/// Peer TLS alone authenticates the commands' requests (mutual TLS, no token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_peer_tls_and_no_token_recover_yes_brings_back_a_lost_majority() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Tls, 3).await.unwrap();
    set.control_token = None;
    let mut set = formed(set, 50).await;
    let cluster = set.cluster_id(1).await.unwrap();
    lose_volumes(&mut set, &[0, 2]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let out = recover_yes(&mut set, 2, &[]).await;
    assert!(
        out.status.success(),
        "recover --yes: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        set.dump()
    );
    all_ready_voters(&mut set).await;
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "k/").await.unwrap_or(-1),
            50,
            "pod {o}"
        );
        assert_eq!(set.cluster_id(o).await.unwrap(), cluster, "pod {o}");
    }
    set.shutdown().await;
}

harness::per_etcd_version!(
    [V3_5, V3_4, V3_5Current]:
    a_recovery_keeps_every_acknowledged_write_though_the_survivors_commit_index_lags,
    a_recovery_with_the_survivors_sidecar_and_etcd_killed_midway_completes_once,
    restore_snapshot_takes_a_live_cluster_back_setting_every_volume_aside,
    auto_recovery_recovers_a_wiped_majority_from_the_survivor,
    auto_recovery_never_fires_while_pods_are_only_down_or_unreachable,
    the_wal_tail_matches_what_etcd_reported_before_it_stopped,
    two_of_three_volumes_lost_recover_yes_brings_back_three_voters_with_every_write,
    recover_refuses_while_the_cluster_has_quorum_or_a_pod_is_silent,
    a_recover_command_killed_after_handing_over_the_request_still_completes,
);
