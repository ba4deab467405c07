//! A pod whose advertised peer URL changed (here its peer port; on Kubernetes a renamed
//! service, or peer TLS switched on: http → https) comes back as the same member: its entry
//! is updated (MemberUpdate), never replaced; a live cluster switched to peer TLS one pod at
//! a time keeps its members and every acknowledged write. Real etcd 3.4.23, 3.5.1 and 3.5.30
//! on loopback pods.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use harness::loopback::Set;
use harness::pki::Pki;
use harness::writer::Writer;
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

/// The procedure of docs/operations/tls.md: every pod gets the peer certificates, then the pods are restarted
/// with peer TLS one at a time, each waiting for the one before to be a ready voter. Each
/// member keeps its ID and data (its entry updated from `http://` to `https://`), the cluster
/// keeps quorum throughout, and no acknowledged write is lost.
async fn switching_a_live_cluster_to_peer_tls_one_pod_at_a_time_keeps_its_members_and_writes(
    etcd: Etcd,
) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.start_all(WAIT).await.unwrap();
    set.put_keys("k", 40).await.unwrap();
    let ids: Vec<u64> = {
        let mut v = Vec::new();
        for o in 0..3 {
            v.push(set.member_id(o).await.unwrap());
        }
        v
    };
    let cluster = set.cluster_id(0).await.unwrap();
    let pki = Pki::generate(
        &set.root().join("peer-pki"),
        "etcd",
        "default",
        "cluster.local",
    )
    .unwrap();
    let peer_tls: Vec<String> = pki
        .args()
        .into_iter()
        .filter(|a| a.starts_with("--peer-"))
        .collect();
    let writer = Writer::start((0..3).map(|o| set.client_url(o)).collect());
    writer.wait_progress(20, WAIT, "before the switch").await;
    // The leader last: when it stops, the others elect a new leader, which dials it at
    // its old http:// URL; its own init may not hear a leader in time to update its entry.
    let leader = set.leader().await.unwrap();
    let order: Vec<u32> = (0..3).filter(|o| *o != leader).chain([leader]).collect();
    for o in order {
        set.kill_processes(o).await;
        set.extra_args = peer_tls.clone();
        set.start_sidecar(o).unwrap();
        set.start_init(o).unwrap();
        harness::wait_for_or(
            WAIT,
            &format!("pod {o} listed at an https:// peer URL, and every member ready"),
            || async {
                let listed = set.members(0).await.is_ok_and(|ms| {
                    ms.iter()
                        .find(|m| m.id() == ids[o as usize])
                        .is_some_and(|m| m.peer_urls().iter().all(|u| u.starts_with("https://")))
                });
                listed && set.all_ready(&[0, 1, 2]).await
            },
            || set.dump(),
        )
        .await;
        writer
            .wait_progress(20, WAIT, &format!("after pod {o} switched"))
            .await;
    }
    let report = writer.stop().await;
    for o in 0..3u32 {
        assert_eq!(
            set.member_id(o).await.unwrap(),
            ids[o as usize],
            "pod {o}: the same member"
        );
        assert_eq!(
            set.cluster_id(o).await.unwrap(),
            cluster,
            "pod {o}: the same cluster"
        );
        assert_eq!(set.count_keys_on(o, "k/").await.unwrap(), 40, "pod {o}");
        assert_eq!(
            set.count_keys_on(o, "w/").await.unwrap(),
            report.acked as i64,
            "pod {o}: every acknowledged write"
        );
        assert!(
            !set.data_dir(o).join("set-aside").exists(),
            "pod {o}: nothing set aside"
        );
    }
    assert_eq!(set.members(0).await.unwrap().len(), 3);
    assert!(
        report.max_gap < Duration::from_secs(5),
        "writes refused for {:?} (at {:?}): {}",
        report.max_gap,
        report.max_gap_at,
        report.last_error
    );
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_tls_switch_3_5() {
    switching_a_live_cluster_to_peer_tls_one_pod_at_a_time_keeps_its_members_and_writes(Etcd::V3_5)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_tls_switch_3_4() {
    switching_a_live_cluster_to_peer_tls_one_pod_at_a_time_keeps_its_members_and_writes(Etcd::V3_4)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_tls_switch_3_5_current() {
    switching_a_live_cluster_to_peer_tls_one_pod_at_a_time_keeps_its_members_and_writes(
        Etcd::V3_5Current,
    )
    .await;
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
