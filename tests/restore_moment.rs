//! `etcd-steward restore --to-revision N | --to-time T --yes` takes a live cluster back to
//! a moment inside its archive: the newest snapshot before it with the archive the leader's
//! sidecar wrote replayed onto it. Every key written at or before the moment is back at its
//! original `mod_revision`, every later one is gone, the revision is above every one served
//! before, and every volume's earlier data is set aside, not deleted. A moment outside the
//! archive is refused with the range. Real etcd 3.5.30, dnsmasq, `init`, `sidecar` and
//! `restore` processes on loopback, a `file://` store. Run under `flock /tmp/steward-it.lock`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;
use std::time::{Duration, SystemTime};

use etcd_client::{Client, GetOptions};
use harness::loopback::{first_snapshot, BackedSet, Backups, Set};
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const FORM: Duration = Duration::from_secs(60);
const RESTORE: Duration = Duration::from_secs(120);

/// Three pods formed with backups in `store`, their leader's sidecar archiving every
/// second; `--restore never`: only the operator's request restores. Returns once the first
/// snapshot is stored, so every later write is the archive's.
async fn formed(etcd: Etcd, store: &Path) -> BackedSet {
    let backups = Backups::file(store).with([
        "--backup-interval=1h",
        "--archive-interval=1s",
        "--restore=never",
    ]);
    let set = BackedSet::form(STEWARD, etcd, 3, &backups, FORM)
        .await
        .unwrap();
    first_snapshot(store, FORM).await;
    set
}

/// (key, value, create_revision, mod_revision) of every key the scenarios write.
type Kv = (Vec<u8>, Vec<u8>, i64, i64);

async fn written_keys(c: &mut Client, at: Option<i64>) -> Vec<Kv> {
    let mut out = Vec::new();
    for prefix in ["k/", "late/"] {
        let mut options = GetOptions::new().with_prefix();
        if let Some(r) = at {
            options = options.with_revision(r);
        }
        let r = c.get(prefix, Some(options)).await.unwrap();
        out.extend(r.kvs().iter().map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
            )
        }));
    }
    out
}

/// Puts `k/0..n`; the revision of the last.
async fn put_early(c: &mut Client, n: usize) -> i64 {
    let mut last = 0;
    for i in 0..n {
        let r = c
            .put(format!("k/{i}"), format!("v{i}"), None)
            .await
            .unwrap();
        last = r.header().unwrap().revision();
    }
    last
}

/// What is written after the moment: new keys, an overwrite, a delete.
async fn put_late(c: &mut Client) {
    for i in 0..6 {
        c.put(format!("late/{i}"), format!("l{i}"), None)
            .await
            .unwrap();
    }
    c.put("k/1", "overwritten", None).await.unwrap();
    c.delete("k/2", None).await.unwrap();
}

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

/// `restore <moment>` planned (no `--yes`) once the archive reaches the moment: its plan.
async fn planned_once_archived(set: &Set, moment: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + FORM;
    loop {
        let out = set.steward(1, &["restore", moment]).await;
        if out.status.success() {
            return plan_of(&out);
        }
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            err.contains("outside the restorable range"),
            "restore {moment} refused for another reason: {err}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the archive never reached {moment}: {err}\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn all_ready_voters(set: &mut Set) {
    let deadline = tokio::time::Instant::now() + RESTORE;
    loop {
        set.restart_exited().unwrap();
        if set.all_linearizable(&[0, 1, 2], 3).await && set.all_ready(&[0, 1, 2]).await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("not three ready voters after {RESTORE:?}\n{}", set.dump());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Carries out `restore <moment> --yes` and checks the cluster came back with exactly
/// `expected`, above every revision `served` before, each volume's data set aside once.
async fn restored_to(set: &mut Set, moment: &str, expected: &[Kv], served: i64) {
    let old_cluster = set.cluster_id(0).await.unwrap();
    let cmd = set.steward_in(1, &["restore", moment, "--yes", "--timeout=110s"]);
    let out = set.run_restarting(cmd).await;
    assert!(
        out.status.success(),
        "restore {moment} --yes: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        set.dump()
    );
    all_ready_voters(set).await;
    assert_ne!(
        set.cluster_id(0).await.unwrap(),
        old_cluster,
        "a re-formed cluster"
    );
    for o in 0..3 {
        let mut c = set.client(o).await.unwrap();
        assert_eq!(
            written_keys(&mut c, None).await,
            expected,
            "pod {o}: the keyspace at {moment}, each key at its original revision"
        );
        let now = set.revision(o).await.unwrap();
        assert!(
            now > served,
            "pod {o}: revision {now} is above the {served} served before"
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
}

async fn highest_served(set: &Set) -> i64 {
    let mut served = 0;
    for o in 0..3 {
        served = served.max(set.revision(o).await.unwrap());
    }
    served
}

async fn restore_to_revision_takes_a_live_cluster_back_to_that_revision(etcd: Etcd) {
    let store = tempfile::tempdir().unwrap();
    let mut set = formed(etcd, store.path()).await;
    let mut c = set.client(0).await.unwrap();
    let moment = put_early(&mut c, 12).await;
    let expected = written_keys(&mut c, Some(moment)).await;
    assert_eq!(expected.len(), 12);
    // At 10:02 someone writes over part of it.
    put_late(&mut c).await;
    drop(c);
    let served = highest_served(&set).await;

    // Beyond the archive: refused, with the range.
    let beyond = format!("--to-revision={}", served + 1000);
    let out = set.steward(1, &["restore", &beyond]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("outside the restorable range (revision ") && err.contains(" to revision "),
        "{err}"
    );
    let to = format!("--to-revision={moment}");
    let plan = planned_once_archived(&set, &to).await;
    assert_eq!(plan["state"], "planned");
    assert_eq!(plan["to"]["revision"], moment);
    let point = plan["point"].as_str().unwrap().to_string();
    assert!(point.ends_with(&format!("+r{moment}")), "{plan}");
    assert_eq!(
        set.count_keys_on(0, "late/").await.unwrap(),
        6,
        "a plan changes nothing"
    );

    restored_to(&mut set, &to, &expected, served).await;
    for o in 0..3 {
        assert!(
            set.logs(o).contains(&point),
            "pod {o} says which point it restored:\n{}",
            set.dump()
        );
    }
    set.shutdown().await;
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// The same moment as an operator one hour east of UTC writes it (`date -Iseconds`):
/// `2026-11-27T11:01:59.250+01:00` for `2026-11-27T10:01:59.250Z`.
fn rfc3339_one_hour_east(t: SystemTime) -> String {
    rfc3339(t + Duration::from_secs(3600)).replace('Z', "+01:00")
}

async fn restore_to_time_takes_a_live_cluster_back_to_that_moment(etcd: Etcd) {
    let store = tempfile::tempdir().unwrap();
    let mut set = formed(etcd, store.path()).await;
    let mut c = set.client(0).await.unwrap();
    let early = put_early(&mut c, 12).await;
    let expected = written_keys(&mut c, Some(early)).await;
    // The moment: after the archive received the early writes (a revision's time is when the
    // archive received it: under load that lags the write), well before the late ones.
    planned_once_archived(&set, &format!("--to-revision={early}")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let moment = SystemTime::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    put_late(&mut c).await;
    drop(c);
    let served = highest_served(&set).await;

    let later = format!(
        "--to-time={}",
        rfc3339(SystemTime::now() + Duration::from_secs(3600))
    );
    let out = set.steward(1, &["restore", &later]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("outside the restorable range (") && err.contains("(snapshot "),
        "{err}"
    );
    // The late writes archived too: the archive reaches past the moment.
    let after = format!("--to-time={}", rfc3339(SystemTime::now()));
    planned_once_archived(&set, &after).await;
    let to = format!("--to-time={}", rfc3339_one_hour_east(moment));
    let plan = planned_once_archived(&set, &to).await;
    assert_eq!(plan["to"]["time"], rfc3339(moment), "the moment, in UTC");
    assert!(plan["point"].as_str().unwrap().contains("+t"), "{plan}");

    restored_to(&mut set, &to, &expected, served).await;
    set.shutdown().await;
}

harness::per_etcd_version!(
    [V3_5Current]:
    restore_to_revision_takes_a_live_cluster_back_to_that_revision,
    restore_to_time_takes_a_live_cluster_back_to_that_moment,
);
