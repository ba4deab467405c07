//! `etcd-steward status --history` against real etcd on loopback pods: after every volume
//! was lost and restored from a backup, and then one pod's volume was lost and its member
//! replaced, one timeline tells both, in order, across the pods (each pod's `init` journal
//! and its sidecar's acts); a pod that does not answer is named. Real etcd 3.5.1, dnsmasq,
//! `init`, `sidecar` and `backup` processes, a `file://` store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use harness::loopback::Set;
use harness::{wait_for, Etcd};

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const FORM: Duration = Duration::from_secs(60);

async fn steward_ok(set: &Set, o: u32, args: &[&str]) -> String {
    let out = set.steward(o, args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The timeline's entries as (pod, act, reason).
fn acts(json: &serde_json::Value) -> Vec<(String, String, String)> {
    json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["pod"].as_str().unwrap().to_string(),
                e["act"].as_str().unwrap().to_string(),
                e["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn history_tells_a_restore_then_a_replacement_across_pods(etcd: Etcd) {
    let store = tempfile::tempdir().unwrap();
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec![
        format!("--backup-url=file://{}", store.path().display()),
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
    let snapshots = store.path().join("snapshots");
    wait_for(FORM, "the leader's sidecar's first snapshot", || async {
        std::fs::read_dir(&snapshots).is_ok_and(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.path().extension().is_some_and(|x| x == "json"))
        })
    })
    .await;

    // Every volume lost: the pods restore the newest backup.
    for o in 0..3 {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in 0..3 {
        set.start(o).unwrap();
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    // Then etcd-2's volume lost: its stale member is replaced, it joins as a learner, and
    // its sidecar promotes it.
    set.kill(2).await.unwrap();
    set.wipe(2).unwrap();
    set.start(2).unwrap();
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    wait_for(FORM, "etcd-2's sidecar promoted its learner", || async {
        set.logs(2).contains("learner promoted to voter")
    })
    .await;

    // Every pod answers (asked again while one is slow to, on a loaded machine).
    let mut json = serde_json::Value::Null;
    for _ in 0..10 {
        let args = ["status", "--history", "--since", "1h", "-o", "json"];
        json = serde_json::from_str(&steward_ok(&set, 0, &args).await).unwrap();
        if json["unanswered"].as_array().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        json["unanswered"].as_array().unwrap().is_empty(),
        "{json:#}"
    );
    let acts = acts(&json);
    let at = |pod: &str, act: &str| {
        acts.iter()
            .position(|(p, a, _)| p == pod && a == act)
            .unwrap_or_else(|| panic!("{pod} {act} in the timeline: {json:#}"))
    };
    // The re-formation from the backup: each pod whose volume still holds its record
    // bootstrapped and says it restored from the backup, whether it started the formation
    // or started as the member of a formation a peer had started first.
    let restored: Vec<usize> = acts
        .iter()
        .enumerate()
        .filter(|(_, (p, a, _))| a == "bootstrap" && (p == "etcd-0" || p == "etcd-1"))
        .map(|(i, _)| i)
        .collect();
    let restoring_pods: std::collections::BTreeSet<&str> =
        restored.iter().map(|i| acts[*i].0.as_str()).collect();
    assert!(
        restoring_pods.contains("etcd-0") && restoring_pods.contains("etcd-1"),
        "the restore on the pods whose volumes still hold its record: {json:#}"
    );
    assert!(
        restored
            .iter()
            .all(|i| acts[*i].2.contains("restored from backup")),
        "the restore named by every pod that restored: {json:#}"
    );
    let replaced = at("etcd-2", "replace");
    let promoted = at("etcd-2", "Promoted");
    assert!(
        restored.iter().all(|i| *i < replaced) && replaced < promoted,
        "the restore, then the replacement, then the promotion: {json:#}"
    );
    let times: Vec<u64> = json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["at_ms"].as_u64().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "newest last: {json:#}"
    );

    let text = steward_ok(&set, 1, &["status", "--history"]).await;
    let replace_line = text
        .lines()
        .find(|l| l.contains("etcd-2") && l.contains(" replace "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        replace_line.starts_with("20")
            && replace_line.contains("Z (")
            && (replace_line.contains(" ago)") || replace_line.contains("(just now)")),
        "readable time: {text}"
    );

    // A pod whose sidecar is gone is named, and the others still tell their part.
    set.kill(1).await.unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&steward_ok(&set, 0, &["status", "--history", "-o", "json"]).await)
            .unwrap();
    let unanswered = json["unanswered"].as_array().unwrap();
    assert_eq!(unanswered.len(), 1, "{json:#}");
    assert_eq!(unanswered[0]["pod"], "etcd-1", "{json:#}");
    assert!(acts_of(&json, "etcd-2").contains(&"replace".to_string()));
    let text = steward_ok(&set, 0, &["status", "--history"]).await;
    assert!(text.contains("etcd-1: not in this timeline: "), "{text}");
    set.shutdown().await;
}

fn acts_of(json: &serde_json::Value, pod: &str) -> Vec<String> {
    acts(json)
        .into_iter()
        .filter(|(p, _, _)| p == pod)
        .map(|(_, a, _)| a)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_3_5() {
    history_tells_a_restore_then_a_replacement_across_pods(Etcd::V3_5).await;
}
