//! Unit tests of the observer.
#![cfg(test)]
use super::*;
use crate::facts::{ActionKind, Vouch, WalIdentity};
use crate::volume::journal::Entry;

const URL: &str = "http://etcd-1.etcd:2380";
const WAL: WalIdentity = WalIdentity {
    member_id: 0xa1,
    cluster_id: 0xc1,
};

fn start(ts: u64, vouch: Option<Vouch>) -> Entry {
    Entry {
        vouch,
        ..Entry::new(ts, ActionKind::Restart, "")
    }
}

fn vouch(member_id: u64, cluster_id: u64, peer_url: &str, ts: u64) -> Option<Vouch> {
    Some(Vouch {
        member_id,
        cluster_id,
        peer_url: peer_url.into(),
        ts,
    })
}

fn ours(ts: u64) -> Option<Vouch> {
    vouch(0xa1, 0xc1, URL, ts)
}

fn report(vouch: Option<Vouch>) -> PeerReport {
    PeerReport {
        name: "etcd-1".into(),
        has_data: true,
        vouch,
        ..Default::default()
    }
}

fn deadline(journal: &[Entry], sidecar: Option<Vouch>, now: u64) -> Duration {
    cluster_deadline(true, journal, Some(&report(sidecar)), Some(WAL), URL, now)
}

#[test]
fn an_empty_volume_waits_long_for_the_cluster_it_must_join_or_form() {
    let d = cluster_deadline(false, &[start(1, ours(1))], None, None, URL, 2);
    assert_eq!(d, CLUSTER_DEADLINE_EMPTY);
}

#[test]
fn data_the_cluster_never_vouched_for_waits_the_full_deadline() {
    assert_eq!(deadline(&[], None, 1000), CLUSTER_DEADLINE_WITH_DATA);
    assert_eq!(
        deadline(&[start(1, None)], None, 1000),
        CLUSTER_DEADLINE_WITH_DATA
    );
    assert_eq!(
        cluster_deadline(
            true,
            &[start(1, ours(1))],
            Some(&report(ours(2))),
            None,
            URL,
            1000
        ),
        CLUSTER_DEADLINE_WITH_DATA,
        "a WAL that cannot be read is no vouched volume"
    );
}

#[test]
fn data_the_cluster_vouched_for_does_not_wait_on_silent_peers() {
    // At init's last start.
    assert_eq!(
        deadline(&[start(1, None), start(5, ours(5))], None, 10),
        CLUSTER_DEADLINE_VOUCHED
    );
    // Through the sidecar, while etcd served after an unanswered start.
    assert_eq!(
        deadline(&[start(1, None)], ours(30), 40),
        CLUSTER_DEADLINE_VOUCHED
    );
}

#[test]
fn a_vouch_for_another_member_cluster_or_peer_url_does_not_count() {
    for other in [
        vouch(0xa2, 0xc1, URL, 5),
        vouch(0xa1, 0xc2, URL, 5),
        vouch(0xa1, 0xc1, "https://etcd-1.etcd:2380", 5),
    ] {
        assert_eq!(
            deadline(&[start(5, other.clone())], None, 1000),
            CLUSTER_DEADLINE_WITH_DATA,
            "{other:?}"
        );
        assert_eq!(
            deadline(&[start(1, None)], other.clone(), 1000),
            CLUSTER_DEADLINE_WITH_DATA,
            "from the sidecar: {other:?}"
        );
    }
    // The newest vouch is the one that counts: the peer URL changed since.
    assert_eq!(
        deadline(
            &[start(5, ours(5))],
            vouch(0xa1, 0xc1, "https://etcd-1.etcd:2380", 9),
            1000
        ),
        CLUSTER_DEADLINE_WITH_DATA
    );
}

#[test]
fn right_after_an_unanswered_start_the_next_round_waits_the_full_deadline() {
    let journal = [start(100, ours(100)), start(1000, None)];
    // etcd exited soon after a start the cluster did not answer for, and the sidecar
    // saw no cluster list it since: perhaps it was removed, and a slow cluster must
    // get the time to say so.
    assert_eq!(
        deadline(&journal, ours(900), 1010),
        CLUSTER_DEADLINE_WITH_DATA
    );
    // The sidecar saw it listed after that start: etcd served, no crash loop.
    assert_eq!(
        deadline(&journal, ours(1005), 1010),
        CLUSTER_DEADLINE_VOUCHED
    );
    // Long after, it was no crash loop either.
    assert_eq!(
        deadline(&journal, None, 1000 + UNANSWERED_START_RECENT_SECS),
        CLUSTER_DEADLINE_VOUCHED
    );
}

#[test]
fn while_an_operators_request_is_held_every_round_hears_the_cluster_out() {
    let journal = [start(5, ours(5))];
    let mut held = report(ours(9));
    held.recovery_request = Some(crate::facts::RecoveryRequest {
        id: "r1".into(),
        survivor: "etcd-1".into(),
        force_lost: vec![],
        expires_unix: 100,
    });
    let d = cluster_deadline(true, &journal, Some(&held), Some(WAL), URL, 10);
    assert_eq!(d, CLUSTER_DEADLINE_WITH_DATA);
    held.recovery_request = None;
    held.restore_request = Some(crate::facts::RestoreRequest {
        id: "r2".into(),
        snapshot: "s".into(),
        expires_unix: 100,
    });
    let d = cluster_deadline(true, &journal, Some(&held), Some(WAL), URL, 10);
    assert_eq!(d, CLUSTER_DEADLINE_WITH_DATA);
}

/// What the vouched deadline promises (docs/ARCHITECTURE.md, BENCHMARKS.md row 4d,
/// `harness::bounds::RESTART`): a restart on a volume the cluster vouched for waits no
/// longer than this for peers that do not answer.
const VOUCHED_WAIT: Duration = Duration::from_millis(30);

/// One `init` look (tokio's clock paused) by pod etcd-1 of three, whose volume holds
/// member 0xa1 of cluster 0xc1 and whose own sidecar reports `vouch`; the etcds of
/// etcd-0 and etcd-2 (leader 0xa0) answer `Status` only after `delay`. The view it got,
/// and how long the look took.
#[allow(clippy::unwrap_used)]
async fn look_with_peers_answering_after(
    delay: Duration,
    vouch: Option<Vouch>,
) -> (ClusterFacts, Duration) {
    use crate::fake::{FakeCluster, FakeDns, FakeReports, Op};

    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("member/wal");
    std::fs::create_dir_all(&wal).unwrap();
    std::fs::write(
        wal.join("0000000000000000-0000000000000000.wal"),
        crate::volume::wal::tests::wal_head(WAL.member_id, WAL.cluster_id),
    )
    .unwrap();
    let identity = Identity {
        set_name: "etcd".into(),
        ordinal: 1,
        service: "etcd".into(),
        namespace: "default".into(),
        cluster_domain: "cluster.local".into(),
        client_port: 2379,
        peer_port: 2380,
        client_scheme: "http",
        peer_scheme: "http",
    };
    let dns = FakeDns::default();
    let cluster = FakeCluster::new(WAL.cluster_id);
    for o in 0..3u32 {
        dns.answer(
            &identity.host(o),
            Lookup::Found(vec![IpAddr::from([10, 0, 0, 10 + o as u8])]),
        );
        cluster.add_member(
            0xa0 + u64::from(o),
            &identity.pod_name(o),
            &identity.peer_url(o),
            &identity.client_url(o),
            false,
        );
        if o != 1 {
            let endpoint = format!("{}:{}", identity.host(o), identity.client_port);
            cluster.delay(&endpoint, Op::Status, delay);
        }
    }
    cluster.set_leader(0xa0);
    let reports = FakeReports::default();
    reports.set(
        "etcd-1",
        PeerReport {
            name: "etcd-1".into(),
            has_data: true,
            vouch: vouch.map(|v| Vouch {
                peer_url: identity.peer_url(1),
                ..v
            }),
            ..Default::default()
        },
    );
    let observer = Observer {
        pod: Pod {
            identity,
            replicas: 3,
            data_dir: dir.path().to_path_buf(),
            restore: None,
        },
        dns,
        connector: cluster,
        reports,
        store: None,
        starting: true,
    };
    let started = tokio::time::Instant::now();
    let facts = observer.observe("nonce".into()).await.unwrap();
    (facts.cluster, started.elapsed())
}

/// The deadline's behaviour, not its constant: on a vouched volume a peer that answers
/// within the promised wait is heard, one that answers later (100 ms) is not waited for
/// (the look ends within the promise; etcd and the sidecar hear the news once etcd
/// runs), while on a volume never vouched for the same late answer is waited for.
#[tokio::test(start_paused = true)]
async fn a_vouched_restart_hears_peers_that_answer_in_time_and_waits_no_longer_for_silent_ones() {
    let vouched = ours(1);
    let (view, took) =
        look_with_peers_answering_after(Duration::from_millis(10), vouched.clone()).await;
    assert!(
        matches!(view, ClusterFacts::Healthy(_)),
        "a peer answering within {VOUCHED_WAIT:?} is heard: {view:?}"
    );
    assert!(took <= VOUCHED_WAIT, "{took:?}");
    let (view, took) = look_with_peers_answering_after(Duration::from_millis(100), vouched).await;
    assert!(
        took <= VOUCHED_WAIT,
        "a vouched restart waited {took:?} for peers that answer after 100 ms, more than the {VOUCHED_WAIT:?} promised"
    );
    assert!(
        matches!(&view, ClusterFacts::NotReached { tried } if tried.iter().all(|t| t.contains("no answer within"))),
        "{view:?}"
    );
    // Never vouched for: the same late answer is heard (a removal must not be missed).
    let (view, took) = look_with_peers_answering_after(Duration::from_millis(100), None).await;
    assert!(matches!(view, ClusterFacts::Healthy(_)), "{view:?}");
    assert!(took >= Duration::from_millis(100), "{took:?}");
}

#[test]
fn a_peers_version_answer_gives_its_release_and_the_cluster_version() -> Result<(), String> {
    let v = parse_peer_version(
        "etcd-0",
        br#"{"etcdserver":"3.5.30","etcdcluster":"3.5.0"}"#,
    )?;
    assert_eq!(v.server.to_string(), "3.5.30");
    assert_eq!(v.cluster.map(|c| c.to_string()).as_deref(), Some("3.5.0"));
    let undecided = parse_peer_version(
        "etcd-0",
        br#"{"etcdserver":"3.4.23","etcdcluster":"not_decided"}"#,
    )?;
    assert_eq!(undecided.cluster, None);
    assert!(parse_peer_version("etcd-0", b"<html>").is_err());
    Ok(())
}
