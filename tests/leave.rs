//! A planned leave and a rejoin (`etcd-steward leave --yes`, `etcd-steward rejoin`) against
//! real etcd (3.5.1 and 3.4.23) on loopback pods, the harness restarting an etcd container
//! whose process exits, as kubelet does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use harness::loopback::Set;
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const WAIT: Duration = Duration::from_secs(60);

/// Polls `check` for up to WAIT, restarting exited etcd containers meanwhile.
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

fn set_aside_for_leave(set: &Set, o: u32) -> bool {
    std::fs::read_dir(set.data_dir(o).join("set-aside")).is_ok_and(|d| {
        d.filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().ends_with("-left"))
    })
}

async fn a_pod_leaves_stays_out_across_restarts_and_rejoins_as_a_new_member(etcd: Etcd) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.start_all(WAIT).await.unwrap();
    set.put_keys("k", 30).await.unwrap();
    let old_id = set.member_id(2).await.unwrap();

    let out = set.steward(2, &["leave"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"planned\""));
    assert_eq!(
        set.members(0).await.unwrap().len(),
        3,
        "a plan changes nothing"
    );

    let out = set.steward(2, &["leave", "--yes"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(set.members(0).await.unwrap().len(), 2);
    until(&mut set, "pod 2's data set aside", |s| {
        let done = set_aside_for_leave(s, 2);
        async move { done }
    })
    .await;
    // The sidecar's next look (within a tick) says why the pod is not ready.
    harness::wait_for_or(
        WAIT,
        "pod 2's /ready says it left",
        || async {
            set.http(2, "/ready")
                .await
                .is_some_and(|(code, body)| code == 503 && body.contains("left the cluster"))
        },
        || set.dump(),
    )
    .await;
    // A restart of the whole pod does not bring it back.
    set.kill(2).await.unwrap();
    set.start(2).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(set.members(0).await.unwrap().len(), 2, "{}", set.dump());
    assert!(set.init_running(2), "init waits");
    assert!(
        set.logs(2).contains("etcd-steward rejoin"),
        "{}",
        set.dump()
    );

    let out = set.steward(2, &["rejoin"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while !(set.all_linearizable(&[0, 1, 2], 3).await && set.all_ready(&[0, 1, 2]).await) {
        set.restart_exited().unwrap();
        assert!(
            tokio::time::Instant::now() < deadline,
            "three ready voters\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_ne!(set.member_id(2).await.unwrap(), old_id, "a new member ID");
    assert_eq!(set.count_keys_on(2, "k/").await.unwrap(), 30);

    // Pod 1 gone: pod 0 leaving would leave two voters of which one answers.
    set.kill(1).await.unwrap();
    let out = set.steward(0, &["leave", "--yes"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("quorum"), "{err}");
    assert!(!set.data_dir(0).join("steward-left.json").exists());
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leave_and_rejoin_3_5() {
    a_pod_leaves_stays_out_across_restarts_and_rejoins_as_a_new_member(Etcd::V3_5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leave_and_rejoin_3_4() {
    a_pod_leaves_stays_out_across_restarts_and_rejoins_as_a_new_member(Etcd::V3_4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leave_and_rejoin_3_5_current() {
    a_pod_leaves_stays_out_across_restarts_and_rejoins_as_a_new_member(Etcd::V3_5Current).await;
}
