//! A pod whose advertised peer URL changed (here its peer port; on Kubernetes a renamed
//! service, or peer TLS switched on: http → https) comes back as the same member: its entry
//! is updated (MemberUpdate), never replaced. Real etcd 3.5.1 and 3.4.23 on loopback pods.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use harness::loopback::Set;
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const WAIT: Duration = Duration::from_secs(60);

async fn a_changed_peer_url_updates_the_member_and_keeps_its_id_and_data(etcd: Etcd) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.start_all(WAIT).await.unwrap();
    set.put_keys("k", 40).await.unwrap();
    let id = set.member_id(2).await.unwrap();
    set.kill_processes(2).await;
    set.extra_args = vec!["--peer-port=2390".into()];
    set.start_sidecar(2).unwrap();
    set.start_init(2).unwrap();
    set.extra_args.clear();
    set.wait_ready(&[0, 1, 2], 3, WAIT).await.unwrap();
    assert_eq!(set.member_id(2).await.unwrap(), id, "the same member");
    // init updates the entry before etcd starts when a cluster answers within its
    // deadline; otherwise etcd starts on its data and the sidecar updates it.
    harness::wait_for_or(
        WAIT,
        "the member list shows pod 2 at its new peer URL",
        || async {
            set.members(0).await.is_ok_and(|ms| {
                ms.iter()
                    .find(|m| m.id() == id)
                    .is_some_and(|m| m.peer_urls().iter().all(|u| u.ends_with(":2390")))
            })
        },
        || set.dump(),
    )
    .await;
    let members = set.members(0).await.unwrap();
    assert_eq!(members.len(), 3);
    assert_eq!(set.count_keys_on(2, "k/").await.unwrap(), 40);
    assert!(
        !set.data_dir(2).join("set-aside").exists(),
        "nothing set aside"
    );
    let updated_by_init = set
        .decisions(2)
        .iter()
        .any(|d| d.contains("update-peer-urls"));
    let updated_by_sidecar = set
        .read_logs(2, "sidecar")
        .contains("entry updated (MemberUpdate)");
    assert!(updated_by_init || updated_by_sidecar, "{}", set.dump());
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_url_change_3_5() {
    a_changed_peer_url_updates_the_member_and_keeps_its_id_and_data(Etcd::V3_5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_url_change_3_4() {
    a_changed_peer_url_updates_the_member_and_keeps_its_id_and_data(Etcd::V3_4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_url_change_3_5_current() {
    a_changed_peer_url_updates_the_member_and_keeps_its_id_and_data(Etcd::V3_5Current).await;
}
