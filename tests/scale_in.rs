//! Scale-in against real etcd on five loopback pods, the Kubernetes API played by
//! [`harness::fake_kube::FakeKube`]: for what a real API server cannot be made to do here
//! (silence: connections dropped unanswered, a connection kept from before that hangs),
//! for counting the requests (only the leader asks) and for each etcd release at little
//! cost. The same calls against a real API server (its authorization, its label selector,
//! objects created, merge-patched and deleted by a client) are tests/kube_calls.rs. The
//! fake answers what the real one does: an apps/v1
//! StatefulSet, a v1 PodList narrowed by `labelSelector`, and a v1 Status 404 for a
//! StatefulSet it does not hold. One scenario per etcd version: silence (an API that does
//! not answer) removes nothing; only the leader's sidecar asks the API; pods gone while
//! spec.replicas still counts them removes nothing; spec.replicas 5 → 3 removes ordinals 4
//! then 3 and the cluster serves, even with a stray pod named like ordinal 4 (not the set's
//! labels) in the namespace; `leave --if-scaled-in` is a no-op for a kept ordinal and a
//! leave without the "do not rejoin" marker for a scaled-away one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use harness::fake_kube::FakeKube;
use harness::loopback::{BackedSet, Backups, Set, SERVICE};
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const WAIT: Duration = Duration::from_secs(60);
/// Long enough for several looks of the API (every second) and ticks of the leader.
const QUIET: Duration = Duration::from_secs(4);

fn ordinals(set: &Set, members: &[etcd_client::Member]) -> Vec<u32> {
    let mut o: Vec<u32> = (0..5)
        .filter(|o| {
            let url = set.peer_url(*o);
            members.iter().any(|m| m.peer_urls().contains(&url))
        })
        .collect();
    o.sort_unstable();
    o
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn removals(set: &Set, pods: &[u32]) -> u64 {
    let mut total = 0;
    for o in pods {
        if let Some((_, body)) = set.http(*o, "/metrics").await {
            total += body
                .lines()
                .find_map(|l| l.strip_prefix("etcd_steward_scale_in_removals_total "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

async fn scaled_from_5_to_3_the_leader_removes_the_gone_ordinals_highest_first(etcd: Etcd) {
    // The API, silent at first: its connections are dropped unanswered.
    let api = FakeKube::start("127.0.0.1:0".parse().unwrap(), "default", SERVICE)
        .await
        .unwrap();
    api.set_silent(true);
    let mut set = Set::new(STEWARD, etcd, 5).await.unwrap();
    set.extra_args = vec![
        "--scale-in".into(),
        "--scale-in-interval=1s".into(),
        format!("--kube-api-url=http://{}", api.addr()),
        "--kube-token-file=/nonexistent/token".into(),
    ];
    set.start_all(WAIT).await.unwrap();
    set.put_keys("k", 20).await.unwrap();

    // The API does not answer: the preStop hook does nothing and says why.
    let out = set.steward(4, &["leave", "--if-scaled-in"]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("nothing was done"),
        "{}",
        stderr(&out)
    );
    // Pods 3 and 4 are gone, and the API is silent: nothing is removed.
    set.kill(3).await.unwrap();
    set.kill(4).await.unwrap();
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        ordinals(&set, &set.members(0).await.unwrap()),
        [0, 1, 2, 3, 4]
    );

    // The API answers; spec.replicas is still 5: a restart, not a scale-in.
    api.set(5, &[0, 1, 2]);
    api.set_silent(false);
    // Only the leader's sidecar asks (two GETs a second); three pods asking would make
    // three times as many.
    let window = Duration::from_secs(6);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = api.requests(None);
    tokio::time::sleep(window).await;
    let asked = api.requests(None) - before;
    assert!(
        (2..=2 * (window.as_secs() as usize + 2)).contains(&asked),
        "{asked} requests in {window:?}: the leader alone asks twice every second\n{}",
        set.dump()
    );
    assert!(api.requests(Some("/api/v1/namespaces/default/pods")) > 0);
    assert_eq!(api.bearer(), None, "no token file, no Authorization header");
    let out = set.steward(1, &["leave", "--if-scaled-in"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not scaled in"));
    // A StatefulSet the API does not hold (its Status 404) is no answer: nothing done.
    let out = set
        .steward(4, &["leave", "--if-scaled-in", "--statefulset-name=nope"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        ordinals(&set, &set.members(0).await.unwrap()),
        [0, 1, 2, 3, 4],
        "{}",
        set.dump()
    );

    // spec.replicas 5 → 3: ordinal 4 goes first, then 3. A stray pod named etcd-4 (a
    // debugging copy: not the set's labels) does not keep ordinal 4: pods are listed by the
    // set's matchLabels.
    api.set_stray(Some(&format!("{SERVICE}-4")));
    api.set(3, &[0, 1, 2]);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = ordinals(&set, &set.members(0).await.unwrap());
        assert!(
            seen.contains(&3) || !seen.contains(&4),
            "ordinal 3 removed before 4: {seen:?}"
        );
        if seen == [0, 1, 2] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "ordinals 3 and 4 removed within {WAIT:?}, still {seen:?}\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    harness::wait_for_or(
        WAIT,
        "pods 0, 1 and 2 serve linearizable reads as three voters",
        || set.all_linearizable(&[0, 1, 2], 3),
        || set.dump(),
    )
    .await;
    set.put_keys("after", 10).await.unwrap();
    for o in 0..3 {
        assert_eq!(set.count_keys_on(o, "k/").await.unwrap(), 20);
    }
    assert_eq!(removals(&set, &[0, 1, 2]).await, 2);
    // Each removal is a ScaledIn Event on the pod whose sidecar removed it (the leader's),
    // in the API's own shape.
    harness::wait_for_or(
        WAIT,
        "two ScaledIn Events",
        || async {
            api.events()
                .iter()
                .filter(|e| e["reason"] == "ScaledIn")
                .count()
                == 2
        },
        || format!("{:#?}\n{}", api.events(), set.dump()),
    )
    .await;
    for e in api.events().iter().filter(|e| e["reason"] == "ScaledIn") {
        let pod = e["regarding"]["name"].as_str().unwrap();
        assert_eq!(e["regarding"]["kind"], "Pod");
        assert_eq!(e["reportingController"], "etcd-steward");
        assert_eq!(e["reportingInstance"], pod);
        assert!(
            ["etcd-0", "etcd-1", "etcd-2"].contains(&pod),
            "posted by a running pod: {e:#}"
        );
        assert!(
            e["note"]
                .as_str()
                .unwrap()
                .contains("scale-in: removed member"),
            "{e:#}"
        );
    }

    let pod2 = set.member_id(2).await.unwrap();
    // spec.replicas 2 with pod 2 still running: its preStop hook removes its own member,
    // and leaves no "do not rejoin" marker (a scale-up on this volume joins again).
    api.set(2, &[0, 1, 2]);
    let out = set.steward(2, &["leave", "--if-scaled-in"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(ordinals(&set, &set.members(0).await.unwrap()), [0, 1]);
    assert!(!set.data_dir(2).join("steward-left.json").exists());
    assert_eq!(
        removals(&set, &[0, 1, 2]).await,
        2,
        "the preStop hook is not the leader's planner"
    );
    set.kill(2).await.unwrap();
    // Pod 2 may have led: the two left elect a leader first.
    harness::wait_for_or(
        WAIT,
        "pods 0 and 1 serve linearizable reads as two voters",
        || set.all_linearizable(&[0, 1], 2),
        || set.dump(),
    )
    .await;
    set.put_keys("two", 5).await.unwrap();
    // A serializable read: pod 1 may apply the last write a moment after it is acknowledged.
    harness::wait_for_or(
        WAIT,
        "pod 1 serving the 5 keys written with two voters",
        || async { set.count_keys_on(1, "two/").await.is_ok_and(|n| n == 5) },
        || set.dump(),
    )
    .await;

    // Scaled up again on the retained volume: the old data is set aside (renamed, not
    // deleted) and pod 2 joins as a new member with every key.
    let old_id = pod2;
    api.set(3, &[0, 1, 2]);
    set.start(2).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !(set.all_linearizable(&[0, 1, 2], 3).await && set.all_ready(&[0, 1, 2]).await) {
        set.restart_exited().unwrap();
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod 2 back as a voter\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_ne!(set.member_id(2).await.unwrap(), old_id, "a new member ID");
    assert!(std::fs::read_dir(set.data_dir(2).join("set-aside"))
        .unwrap()
        .next()
        .is_some());
    assert_eq!(set.count_keys_on(2, "two/").await.unwrap(), 5);

    drop(api);
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_3_5() {
    scaled_from_5_to_3_the_leader_removes_the_gone_ordinals_highest_first(Etcd::V3_5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_3_4() {
    scaled_from_5_to_3_the_leader_removes_the_gone_ordinals_highest_first(Etcd::V3_4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_3_5_current() {
    scaled_from_5_to_3_the_leader_removes_the_gone_ordinals_highest_first(Etcd::V3_5Current).await;
}

/// The store's verified snapshots' (Unix time, revision), any order; nothing when it cannot
/// be listed.
async fn snapshots(url: &str) -> Vec<(u64, i64)> {
    use etcd_steward::backup::{catalog, store::Store};
    let store = Store::open(url).unwrap();
    catalog::list(&store)
        .await
        .unwrap_or_default()
        .iter()
        .filter(|m| m.verified)
        .map(|m| (m.time_unix, m.revision))
        .collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// With `--backup-url`, spec.replicas 3 → 2: while the store cannot be written the leader
/// does not remove ordinal 2, and says why; once it can, a snapshot taken after the removal
/// was decided is in the store when the member goes.
async fn with_backups_a_member_is_removed_only_after_a_fresh_snapshot(etcd: Etcd) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let url = format!("file://{}", store.display());
    let api = FakeKube::start("127.0.0.1:0".parse().unwrap(), "default", SERVICE)
        .await
        .unwrap();
    api.set(3, &[0, 1, 2]);
    let backups = Backups::at(&url)
        .with([
            "--scale-in".to_string(),
            "--scale-in-interval=1s".into(),
            format!("--kube-api-url=http://{}", api.addr()),
            "--kube-token-file=/nonexistent/token".into(),
            // One periodic snapshot (the first) and no other during the scenario.
            "--backup-interval=1h".into(),
        ])
        .sidecars_only();
    let mut set = BackedSet::form(STEWARD, etcd, 3, &backups, WAIT)
        .await
        .unwrap();
    set.put_keys("k", 20).await.unwrap();
    harness::wait_for_or(
        WAIT,
        "the first periodic snapshot in the store",
        || async { !snapshots(&url).await.is_empty() },
        || set.dump(),
    )
    .await;

    // The store cannot be written (a file where its directory was); spec.replicas 3 → 2
    // and pod 2 gone: ordinal 2 is not removed, and the leader says why.
    let away = dir.path().join("store.away");
    std::fs::rename(&store, &away).unwrap();
    std::fs::write(&store, "not a directory").unwrap();
    let decided_after = unix_now();
    api.set(2, &[0, 1]);
    set.kill(2).await.unwrap();
    tokio::time::sleep(QUIET * 3).await;
    assert_eq!(
        ordinals(&set, &set.members(0).await.unwrap()),
        [0, 1, 2],
        "removed without a snapshot\n{}",
        set.dump()
    );
    let said = |o: u32| {
        set.read_logs(o, "sidecar").lines().any(|l| {
            l.contains("the member is not removed yet") && l.contains("no snapshot could be taken")
        })
    };
    assert!(
        said(0) || said(1),
        "the leader says why ordinal 2 waits\n{}",
        set.dump()
    );

    // The store is back: a snapshot newer than the decision, then the removal.
    std::fs::remove_file(&store).unwrap();
    std::fs::rename(&away, &store).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let members = set.members(0).await.unwrap();
        if ordinals(&set, &members) == [0, 1] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "ordinal 2 removed within {WAIT:?}\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fresh: Vec<(u64, i64)> = snapshots(&url)
        .await
        .into_iter()
        .filter(|(t, _)| *t >= decided_after)
        .collect();
    assert!(
        !fresh.is_empty(),
        "no snapshot taken after the removal was decided is in the store when ordinal 2 is gone: {:?}\n{}",
        snapshots(&url).await,
        set.dump()
    );
    harness::wait_for_or(
        WAIT,
        "pods 0 and 1 serve linearizable reads as two voters",
        || set.all_linearizable(&[0, 1], 2),
        || set.dump(),
    )
    .await;
    assert_eq!(set.count_keys_on(1, "k/").await.unwrap(), 20);
    drop(api);
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_with_backups_3_5() {
    with_backups_a_member_is_removed_only_after_a_fresh_snapshot(Etcd::V3_5).await;
}

/// A TLS front for `FakeKube`: terminates TLS with `cert`/`key` and passes the bytes on.
async fn tls_front(
    backend: std::net::SocketAddr,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> std::net::SocketAddr {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn over_https_the_client_trusts_the_given_ca_and_no_other() {
    use etcd_steward::kube_api::{workload_state, ApiWorkload, KubeAccess, KubeError};
    let dir = tempfile::tempdir().unwrap();
    let pki = harness::pki::Pki::generate(dir.path(), SERVICE, "default", "cluster.local").unwrap();
    let api = FakeKube::start("127.0.0.1:0".parse().unwrap(), "default", SERVICE)
        .await
        .unwrap();
    api.set(3, &[0, 1, 2, 4]);
    let front = tls_front(
        api.addr(),
        &pki.path("client.pem"),
        &pki.path("client-key.pem"),
    )
    .await;
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let access = KubeAccess {
        url: format!("https://{front}"),
        token_file: token,
        ca_file: pki.path("client-ca.pem"),
        namespace: "default".into(),
        statefulset: SERVICE.into(),
    };
    let state = workload_state(&ApiWorkload::new(&access).unwrap(), SERVICE)
        .await
        .unwrap();
    assert_eq!(state.replicas, 3);
    assert_eq!(state.pods, [0, 1, 2, 4].into());
    assert_eq!(
        api.bearer().as_deref(),
        Some("t0ken"),
        "the service-account token"
    );
    // The token rotates: the next call carries the new one.
    let client = ApiWorkload::new(&access).unwrap();
    workload_state(&client, SERVICE).await.unwrap();
    std::fs::write(&access.token_file, "r0tated").unwrap();
    workload_state(&client, SERVICE).await.unwrap();
    assert_eq!(
        api.bearer().as_deref(),
        Some("r0tated"),
        "the rotated token"
    );

    // A server whose certificate another CA signed is not the API.
    let asked = api.requests(None);
    let other = KubeAccess {
        ca_file: pki.path("peer-ca.pem"),
        ..access
    };
    let e = workload_state(&ApiWorkload::new(&other).unwrap(), SERVICE)
        .await
        .unwrap_err();
    assert!(matches!(e, KubeError::Unreachable { .. }), "{e}");
    assert_eq!(
        api.requests(None),
        asked,
        "a request passed an untrusted TLS server"
    );
}
