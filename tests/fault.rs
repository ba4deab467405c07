//! The fault suite: pods are Docker containers on a private network (see
//! harness/src/docker.rs), each scenario against a writer that records every acknowledged
//! write. After each: every acknowledged write is readable (on every member), exactly one
//! cluster ID exists, every member is a voter and ready.
//!
//! Opt-in: every scenario is `#[ignore]`d, so a plain `cargo test` reports them as
//! ignored; run them with `cargo test --test fault -- --ignored` after building the image
//! with `images/build-test-image.sh` (CI does). A missing Docker or image fails them.
//! `STEWARD_FAULT_PARALLEL` (default 2) scenarios run at once; `STEWARD_FAULT_KEEP=1`
//! keeps a failed scenario's containers, networks and volumes; `STEWARD_TEST_IMAGE`
//! names another image. Scenario 9 runs Debian's etcd 3.4.23 (`ETCD_3_4_BIN`, default
//! /usr/bin/etcd, installed by scripts/install-test-deps.sh) inside the pods: a dynamic
//! binary, so it is bind-mounted read-only together with the libraries `ldd` lists.
//! Scenarios 10 and 11 give the pods a `file://` backup store on a volume of their own
//! (as manifests/overlays/backup-file does); 11 ends waiting, as the product must when a
//! majority is lost with a volume surviving, so its checks are its own. Scenario 14 serves
//! a fake Kubernetes API (harness/src/fake_kube.rs) on the host at the management network's
//! gateway, which the pods reach for `--scale-in` and `leave --if-scaled-in`.
//! A failed scenario prints every container's etcd-steward lines and etcd's last lines.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::time::Duration;

use harness::docker::{self, Cluster};
use harness::fake_kube::FakeKube;
use harness::writer::Writer;
use harness::Etcd;
use rand::seq::SliceRandom;
use rand::RngExt;
use tokio::time::Instant;

const READY: Duration = Duration::from_secs(120);
const PROGRESS: Duration = Duration::from_secs(60);

fn writer_for(c: &Cluster, pods: &[u32]) -> Writer {
    Writer::start(pods.iter().map(|o| c.client_url(*o)).collect())
}

macro_rules! scenario {
    ($name:ident, exclusive: $exclusive:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "the Docker fault suite: images/build-test-image.sh, then cargo test --test fault -- --ignored"]
        async fn $name() {
            let _slot = docker::slot($exclusive).await;
            let started = Instant::now();
            scenarios::$name().await;
            let _ = writeln!(
                std::io::stderr(),
                "fault scenario {} passed in {:.0?}",
                stringify!($name),
                started.elapsed()
            );
        }
    };
}

scenario!(s1_killed_leader_returns_with_its_member_id, exclusive: false);
scenario!(s2_lost_volume_rejoins_as_a_new_learner, exclusive: false);
scenario!(s3_full_stop_and_start_in_random_order, exclusive: false);
scenario!(s4_wiped_pod_alone_waits_and_forms_nothing, exclusive: false);
scenario!(s5_partitioned_leader_no_split, exclusive: false);
scenario!(s6_dead_learner_costs_no_quorum_and_is_removed, exclusive: false);
scenario!(s7_scale_three_five_three, exclusive: false);
scenario!(s8_rolling_restart_under_writes, exclusive: true);
scenario!(s9_rolling_upgrade_3_4_to_3_5, exclusive: false);
scenario!(s10_every_volume_lost_comes_back_from_the_latest_backup, exclusive: false);
scenario!(s11_lost_majority_with_a_survivor_is_not_restored, exclusive: false);
scenario!(s12_lost_majority_recovered_from_the_survivor_with_every_write, exclusive: false);
scenario!(s13_peer_tls_switched_on_one_pod_at_a_time, exclusive: false);
scenario!(s14_scale_in_leaves_no_dead_voter, exclusive: false);

mod scenarios {
    use super::*;

    /// 1. Kill the leader's container; it comes back with its volume and its member ID.
    pub async fn s1_killed_leader_returns_with_its_member_id() {
        let mut c = Cluster::new("s1", 3).await;
        let cid = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(50, PROGRESS, "before the kill").await;
        let l = c.wait_leader(Duration::from_secs(30)).await;
        let id = c.member_id(l).await;
        c.say(&format!("leader is pod {l} ({id:x})"));
        let before = c.decisions(l).await.len();
        c.kill(l).await;
        w.wait_progress(50, PROGRESS, "with the old leader dead")
            .await;
        c.start(l).await;
        c.wait_ready(&[0, 1, 2], READY).await;
        assert_eq!(
            c.member_id(l).await,
            id,
            "the same member ID after the kill"
        );
        c.assert_restarted_on_its_data(l, before).await;
        w.wait_progress(20, PROGRESS, "after the return").await;
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
    }

    /// 2. Remove a pod's container and its volume: it rejoins as a learner with a new
    ///    member ID, and its sidecar promotes it.
    pub async fn s2_lost_volume_rejoins_as_a_new_learner() {
        let mut c = Cluster::new("s2", 3).await;
        let cid = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(200, PROGRESS, "before the loss").await;
        let l = c.wait_leader(Duration::from_secs(30)).await;
        let f = (l + 1) % 3;
        let old = c.member_id(f).await;
        c.say(&format!(
            "leader is pod {l}; pod {f} ({old:x}) loses its volume"
        ));
        c.remove(f, true).await;
        w.wait_progress(50, PROGRESS, "with a pod gone").await;
        c.create_pod(f, Etcd::V3_5).await;
        // Watch the membership while it rejoins: the new member shows up as a learner.
        let deadline = Instant::now() + READY;
        let mut seen_learner = false;
        loop {
            if let Some(ms) = c.members(l).await {
                if ms.iter().any(|m| m.is_learner() && m.id() != old) {
                    seen_learner = true;
                }
                let done = ms.len() == 3
                    && ms.iter().all(|m| !m.is_learner() && !m.name().is_empty())
                    && ms.iter().all(|m| m.id() != old);
                if done {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "pod {f} did not rejoin as a voter"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c.wait_ready(&[0, 1, 2], READY).await;
        let new = c.member_id(f).await;
        assert_ne!(new, old, "an empty member must not reuse its old member ID");
        let decisions = c.decisions(f).await;
        assert!(
            decisions.contains(&"replace".to_string()),
            "pod {f} replaced its stale entry: {decisions:?}"
        );
        let (_, metrics) = c.http(f, "/metrics").await.unwrap();
        assert!(
            metrics.contains("etcd_steward_promotions_total 1"),
            "pod {f}'s sidecar promoted its learner: {metrics}"
        );
        let sidecar = c.logs(&c.steward_ctr(f)).await;
        assert!(sidecar.contains("learner promoted to voter"), "{sidecar}");
        c.say(&format!(
            "pod {f} rejoined as {new:x} (learner seen in the member list: {seen_learner}), promoted"
        ));
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
    }

    /// 3. Stop every pod, start them again in a random order: same cluster, all data.
    pub async fn s3_full_stop_and_start_in_random_order() {
        let c = &mut Cluster::new("s3", 3).await;
        let cid = c.form(3, Etcd::V3_5).await;
        let w = writer_for(c, &[0, 1, 2]);
        w.wait_progress(200, PROGRESS, "before the outage").await;
        let mut before = Vec::new();
        for o in 0..3 {
            before.push(c.decisions(o).await.len());
        }
        tokio::join!(c.stop(0), c.stop(1), c.stop(2));
        let mut order = vec![0u32, 1, 2];
        order.shuffle(&mut rand::rng());
        c.say(&format!("starting in the order {order:?}"));
        for o in order {
            c.start(o).await;
            let pause = rand::rng().random_range(0..3000u64);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        c.wait_ready(&[0, 1, 2], READY).await;
        for o in 0..3 {
            assert_eq!(c.cluster_id(o).await, cid, "pod {o} kept the cluster ID");
            c.assert_restarted_on_its_data(o, before[o as usize]).await;
        }
        w.wait_progress(50, PROGRESS, "after the outage").await;
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
    }

    /// 4. Stop two of three, wipe one of them and start only that one: it waits and starts
    ///    no etcd; start the rest: one cluster (the old one) with all its data.
    pub async fn s4_wiped_pod_alone_waits_and_forms_nothing() {
        let mut c = Cluster::new("s4", 3).await;
        let cid = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(200, PROGRESS, "before the outage").await;
        let old = c.member_id(1).await;
        tokio::join!(c.stop(1), c.stop(2));
        c.remove(1, true).await;
        c.create_pod(1, Etcd::V3_5).await;
        // Give it at least 15 s and three rounds to decide.
        let since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let d = c.decisions(1).await;
            if d.len() >= 3 && since.elapsed() > Duration::from_secs(15) {
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(60),
                "pod 1 logged fewer than 3 rounds in 60 s: {d:?}"
            );
        }
        let decisions = c.decisions(1).await;
        assert!(
            decisions.iter().all(|d| d == "wait"),
            "the wiped pod must only wait: {decisions:?}"
        );
        assert!(
            c.running(&c.etcd_ctr(1)).await,
            "its init keeps waiting (the container runs)"
        );
        assert!(
            c.status(1).await.is_none(),
            "no etcd answers on the wiped pod"
        );
        let (code, report) = c.peer_http(1, "/peer/report").await.unwrap();
        let report: serde_json::Value = serde_json::from_str(&report).unwrap();
        assert_eq!(code, 200);
        assert_eq!(report["has_data"], false, "{report}");
        // Pod 0 is still the old cluster's member, without quorum: nothing new formed.
        assert_eq!(c.cluster_id(0).await, cid);
        assert_eq!(c.members(0).await.map(|m| m.len()), Some(3));
        // Liveness never depends on quorum: both answer 200; neither is ready.
        for o in [0, 1] {
            let live = c.http(o, "/healthz").await;
            assert!(matches!(live, Some((200, _))), "pod {o} /healthz {live:?}");
            assert!(!c.ready(o).await, "pod {o} is not ready without quorum");
        }
        c.say(&format!(
            "pod 1 waited: {} rounds, all wait",
            decisions.len()
        ));
        c.start(2).await;
        c.wait_ready(&[0, 1, 2], READY).await;
        let new = c.member_id(1).await;
        assert_ne!(new, old, "the wiped pod came back with a new member ID");
        w.wait_progress(50, PROGRESS, "after the recovery").await;
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
    }

    /// 5. Partition the leader from the others (only the cluster network), heal it: the
    ///    majority elects a leader and keeps writing, the isolated pod goes unready and
    ///    accepts no write, and after healing there is one leader and one cluster.
    pub async fn s5_partitioned_leader_no_split() {
        let mut c = Cluster::new("s5", 3).await;
        let cid = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(100, PROGRESS, "before the partition").await;
        let l = c.wait_leader(Duration::from_secs(30)).await;
        let lid = c.member_id(l).await;
        c.say(&format!("leader is pod {l} ({lid:x})"));
        c.partition(l).await;
        let others: Vec<u32> = (0..3).filter(|o| *o != l).collect();
        // The isolated pod goes 503 and stops being (or seeing) a leader.
        let deadline = Instant::now() + Duration::from_secs(30);
        let body = loop {
            if let Some((503, body)) = c.http(l, "/ready").await {
                break body;
            }
            assert!(
                Instant::now() < deadline,
                "pod {l}'s /ready stayed 200 while cut off"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        c.say(&format!("isolated pod {l}: /ready 503 {body:?}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = c
                .status(l)
                .await
                .expect("the isolated pod answers status on mgmt");
            if s.leader() != lid {
                c.say(&format!(
                    "isolated pod {l} now sees leader {:x}",
                    s.leader()
                ));
                break;
            }
            assert!(Instant::now() < deadline, "pod {l} still leads alone");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let ready = c.http(l, "/ready").await;
        let live = c.http(l, "/healthz").await;
        c.say(&format!(
            "isolated pod {l} stepped down: /ready {ready:?}, /healthz {live:?}"
        ));
        assert!(matches!(ready, Some((503, _))), "{ready:?}");
        assert!(
            matches!(live, Some((200, _))),
            "liveness does not depend on quorum: {live:?}"
        );
        // The majority has a leader of its own and takes writes.
        w.wait_progress(100, PROGRESS, "with the old leader cut off")
            .await;
        let mut leaders = std::collections::BTreeSet::new();
        for o in &others {
            let s = c.status(*o).await.unwrap();
            leaders.insert(s.leader());
            assert!(c.ready(*o).await, "pod {o} on the majority side is ready");
        }
        assert_eq!(leaders.len(), 1, "the majority agrees on a leader");
        assert!(!leaders.contains(&lid) && !leaders.contains(&0));
        // The isolated pod accepts no write.
        let mut cl = c.client(l).await;
        let refused =
            tokio::time::timeout(Duration::from_secs(5), cl.put("probe/isolated", "x", None)).await;
        assert!(
            !matches!(refused, Ok(Ok(_))),
            "the isolated pod acknowledged a write"
        );
        let ready = c.http(l, "/ready").await;
        c.say(&format!(
            "isolated pod {l} before healing: /ready {ready:?}"
        ));
        assert!(matches!(ready, Some((503, _))), "{ready:?}");
        c.heal(l).await;
        c.wait_ready(&[0, 1, 2], READY).await;
        assert_eq!(c.member_id(l).await, lid, "the isolated member kept its ID");
        w.wait_progress(50, PROGRESS, "after healing").await;
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
        let mut terms = std::collections::BTreeSet::new();
        for o in 0..3 {
            terms.insert(c.status(o).await.unwrap().raft_term());
        }
        assert_eq!(terms.len(), 1, "one term after healing: {terms:?}");
    }

    /// 6. A dead learner (its MemberAdd made, its pod created but never started) does not
    ///    cost the cluster its quorum, and the leader's sidecar removes it after the stall
    ///    timeout (20 s here). Then the same for a misconfigured pod whose etcd exits at
    ///    once after its init added it as a learner.
    pub async fn s6_dead_learner_costs_no_quorum_and_is_removed() {
        let mut c = Cluster::new("s6", 3).await;
        c.stall_timeout = Some("20s".into());
        let cid = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(100, PROGRESS, "before the dead learner")
            .await;
        let url = format!("http://{}:2380", c.host(3));
        let mut admin = c.client(0).await;
        let mut dead = None;
        for _ in 0..60 {
            match admin
                .member_add(
                    [url.as_str()],
                    Some(etcd_client::MemberAddOptions::new().with_is_learner()),
                )
                .await
            {
                Ok(r) => {
                    dead = Some(r.member().unwrap().id());
                    break;
                }
                Err(e) => c.say(&format!("member add: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let dead = dead.expect("the dead learner's entry was added");
        let added = Instant::now();
        c.create_etcd_container(3, Etcd::V3_5).await; // created, never started
        c.say(&format!(
            "dead learner {dead:x} added for pod 3 (never started)"
        ));
        // A voter down as well: with the learner counted, 2 of 4 would be no quorum.
        let victim = 2;
        c.kill(victim).await;
        w.wait_progress(100, PROGRESS, "with a dead learner and a voter down")
            .await;
        for o in [0, 1] {
            assert!(c.ready(o).await, "pod {o} stays ready");
        }
        let ms = c.members(0).await.unwrap();
        assert!(
            ms.iter().any(|m| m.id() == dead && m.is_learner()),
            "the dead learner was still listed while the cluster kept its quorum \
             ({:.0?} after it was added): {ms:?}",
            added.elapsed()
        );
        c.say("quorum kept with a dead learner listed and a voter down");
        c.start(victim).await;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(ms) = c.members(0).await {
                if ms.iter().all(|m| m.id() != dead) {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the dead learner was not removed"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        c.say(&format!(
            "dead learner removed {:.0?} after it was added",
            added.elapsed()
        ));
        let mut removed = 0;
        for o in 0..3 {
            removed += c
                .logs(&c.steward_ctr(o))
                .await
                .matches("removed a learner that did not start")
                .count();
        }
        assert!(removed >= 1, "a leader's sidecar logged the removal");
        w.wait_progress(20, PROGRESS, "after the removal").await;

        // A misconfigured pod: its init adds it as a learner, then etcd refuses its flags
        // and the container exits (a crash loop, between two restarts). The cluster keeps
        // its quorum, and the leader's sidecar removes that learner as well.
        c.create_pod_with(4, Etcd::V3_5, &["--no-such-etcd-flag"])
            .await;
        let url = format!("http://{}:2380", c.host(4));
        let deadline = Instant::now() + Duration::from_secs(60);
        let (bad, added) = loop {
            let ms = c.members(0).await.unwrap_or_default();
            if let Some(m) = ms.iter().find(|m| m.peer_urls().contains(&url)) {
                assert!(m.is_learner(), "pod 4 joined as a learner: {m:?}");
                break (m.id(), Instant::now());
            }
            assert!(Instant::now() < deadline, "pod 4's init added no learner");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.running(&c.etcd_ctr(4)).await {
            assert!(
                Instant::now() < deadline,
                "etcd with a bad flag kept running"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        c.say(&format!(
            "misconfigured pod 4 added learner {bad:x}, its etcd exited"
        ));
        w.wait_progress(100, PROGRESS, "with a misconfigured learner")
            .await;
        for o in 0..3 {
            assert!(c.ready(o).await, "pod {o} stays ready");
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while c
            .members(0)
            .await
            .is_none_or(|ms| ms.iter().any(|m| m.id() == bad))
        {
            assert!(
                Instant::now() < deadline,
                "the misconfigured learner was not removed"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        c.say(&format!(
            "misconfigured learner removed {:.0?} after it was added",
            added.elapsed()
        ));
        c.remove(4, true).await;
        w.wait_progress(20, PROGRESS, "after the second removal")
            .await;
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
    }

    /// 7. Scale 3 → 5 (new pods join as learners and are promoted) → 3 (the documented
    ///    steps, highest ordinal first: the pod and its volume go, then MemberRemove).
    pub async fn s7_scale_three_five_three() {
        let mut c = Cluster::new("s7", 3).await;
        let cid = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(100, PROGRESS, "before scaling").await;
        c.create_pod(3, Etcd::V3_5).await;
        c.create_pod(4, Etcd::V3_5).await;
        c.wait_ready(&[0, 1, 2, 3, 4], Duration::from_secs(180))
            .await;
        for o in [3, 4] {
            let d = c.decisions(o).await;
            assert!(d.contains(&"join".to_string()), "pod {o}: {d:?}");
        }
        w.wait_progress(50, PROGRESS, "at five").await;
        c.check(&[0, 1, 2, 3, 4], Some(cid), w.acked()).await;
        // The documented scale-down: the pod goes first (a removed member whose pod still
        // ran would be restarted, set its data aside and join again), then its member.
        for o in [4, 3] {
            c.remove(o, true).await;
            let ms = c.members(0).await.unwrap();
            let id = ms
                .iter()
                .find(|m| m.name() == format!("etcd-{o}"))
                .unwrap()
                .id();
            let mut admin = c.client(0).await;
            let mut done = false;
            for _ in 0..60 {
                match admin.member_remove(id).await {
                    Ok(_) => {
                        done = true;
                        break;
                    }
                    Err(e) => c.say(&format!("member remove {id:x}: {e}")),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            assert!(done, "member {id:x} (pod {o}) removed");
            c.say(&format!("member {id:x} (pod {o}) removed"));
        }
        c.wait_ready(&[0, 1, 2], READY).await;
        w.wait_progress(50, PROGRESS, "back at three").await;
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
    }

    /// 8. A rolling restart, one pod at a time (highest ordinal first), each waiting for
    ///    /ready, with the writer running: no write refused for longer than an election
    ///    (the longest gap between acknowledged writes stays under 5 s), none lost.
    pub async fn s8_rolling_restart_under_writes() {
        let mut c = Cluster::new("s8", 3).await;
        let cid = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(100, PROGRESS, "before the roll").await;
        for o in [2, 1, 0] {
            let id = c.member_id(o).await;
            let before = c.decisions(o).await.len();
            c.stop(o).await;
            c.start(o).await;
            c.wait_ready(&[0, 1, 2], READY).await;
            assert_eq!(c.member_id(o).await, id);
            c.assert_restarted_on_its_data(o, before).await;
            w.wait_progress(20, PROGRESS, "between restarts").await;
        }
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        assert!(
            report.max_gap < Duration::from_secs(5),
            "writes were refused for {:?} (ending {:?} after the writer started)",
            report.max_gap,
            report.max_gap_at
        );
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
    }

    /// 9. A rolling upgrade from etcd 3.4.23 to 3.5.1 on the same volumes, one pod at a
    ///    time, each waiting for /ready: all data, the same cluster, all voters.
    pub async fn s9_rolling_upgrade_3_4_to_3_5() {
        let mut c = Cluster::new("s9", 3).await;
        let cid = c.form(3, Etcd::V3_4).await;
        for o in 0..3 {
            let v = c.status(o).await.unwrap().version().to_string();
            assert!(v.starts_with("3.4."), "pod {o} runs etcd {v}");
        }
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(200, PROGRESS, "before the upgrade").await;
        for o in [2, 1, 0] {
            let id = c.member_id(o).await;
            c.stop(o).await;
            c.remove(o, false).await;
            c.create_pod(o, Etcd::V3_5).await;
            c.wait_ready(&[0, 1, 2], READY).await;
            assert_eq!(c.member_id(o).await, id, "pod {o} kept its member ID");
            c.assert_restarted_on_its_data(o, 0).await; // a new container: its own log
            let v = c.status(o).await.unwrap().version().to_string();
            assert!(v.starts_with("3.5."), "pod {o} now runs etcd {v}");
            w.wait_progress(20, PROGRESS, "between upgrades").await;
        }
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
    }

    /// 13. Peer TLS switched on in a live cluster, one pod at a time (docs/operations/tls.md's steps):
    ///     each pod re-created with the peer certificates mounted and the peer TLS options
    ///     keeps its member ID and data, its entry moves from http:// to https://, every pod
    ///     is ready after each step, and no acknowledged write is lost.
    pub async fn s13_peer_tls_switched_on_one_pod_at_a_time() {
        let mut c = Cluster::new("s13", 3).await;
        let cid = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(100, PROGRESS, "before the switch").await;
        c.enable_peer_tls();
        for o in [2, 1, 0] {
            let id = c.member_id(o).await;
            c.stop(o).await;
            c.remove(o, false).await;
            c.create_pod(o, Etcd::V3_5).await;
            c.wait_ready(&[0, 1, 2], READY).await;
            assert_eq!(c.member_id(o).await, id, "pod {o} kept its member ID");
            let deadline = Instant::now() + READY;
            loop {
                let ms = c.members((o + 1) % 3).await.unwrap_or_default();
                let url = ms
                    .iter()
                    .find(|m| m.id() == id)
                    .map(|m| m.peer_urls().join(","));
                if url.as_deref().is_some_and(|u| u.starts_with("https://")) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "pod {o}'s member is listed at {url:?}, not https://"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            w.wait_progress(20, PROGRESS, "between pods").await;
        }
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        assert!(
            report.max_gap < Duration::from_secs(10),
            "writes refused for {:?}",
            report.max_gap
        );
        c.check(&[0, 1, 2], Some(cid), report.acked).await;
    }

    /// The keys `w/…` pod `o` holds (a linearizable read), as the writer's indexes.
    async fn written_indexes(c: &Cluster, o: u32) -> Vec<u64> {
        let mut cl = c.client(o).await;
        let got = cl
            .get(
                "w/",
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("pod {o}: read every write: {e}"));
        got.kvs()
            .iter()
            .map(|kv| {
                let k = String::from_utf8_lossy(kv.key());
                k.trim_start_matches("w/")
                    .parse()
                    .unwrap_or_else(|e| panic!("a key the writer did not write: {k} ({e})"))
            })
            .collect()
    }

    /// 10. Backups to a volume (`file://`), then every pod and every volume lost: the pods,
    ///     created again, form a new cluster from the newest backup (every pod restores the
    ///     same snapshot) with every write acknowledged before it was taken, and none of
    ///     those acknowledged after it.
    pub async fn s10_every_volume_lost_comes_back_from_the_latest_backup() {
        let mut c = Cluster::new("s10", 3).await;
        c.enable_backups().await;
        let old = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(200, PROGRESS, "before the first backup")
            .await;
        let first = c.backup_now(0).await;
        w.wait_progress(100, PROGRESS, "between the backups").await;
        // The last one through a follower: any member's snapshot is the cluster's.
        let l = c.wait_leader(Duration::from_secs(30)).await;
        let f = (l + 1) % 3;
        let acked_before = w.acked();
        let last = c.backup_now(f).await;
        let acked_after = w.acked();
        for m in [&first, &last] {
            assert_eq!(m["verified"], true, "a checked snapshot: {m}");
            assert_eq!(
                m["cluster_id"].as_str(),
                Some(format!("{old:x}").as_str()),
                "the snapshot names its cluster: {m}"
            );
        }
        let last_name = last["name"].as_str().unwrap().to_string();
        // Acknowledged after the last backup: a restore cannot have them.
        w.wait_progress(100, PROGRESS, "after the last backup")
            .await;
        let listed = c.backup_list().await;
        let names: Vec<&str> = listed.iter().filter_map(|m| m["name"].as_str()).collect();
        assert_eq!(
            names.first().copied(),
            Some(last_name.as_str()),
            "backup --list, newest first: {names:?}"
        );
        assert!(
            names.contains(&first["name"].as_str().unwrap()),
            "{names:?}"
        );

        for o in 0..3 {
            c.remove(o, true).await;
        }
        let report = w.stop().await;
        c.say(&format!(
            "every pod and volume gone; {acked_before} writes acknowledged before the last \
             backup {last_name} began, {acked_after} when it ended, {} in all",
            report.acked
        ));
        for o in 0..3 {
            c.create_pod(o, Etcd::V3_5).await;
        }
        c.wait_ready(&[0, 1, 2], READY).await;
        let cid = c.cluster_id(0).await;
        assert_ne!(cid, old, "a restored cluster gets a new identity");
        let mut restored = 0;
        for o in 0..3 {
            let d = c.decisions(o).await;
            // Each pod restores the agreed point (bootstrap), or, when the others started
            // on it before this pod's own start (each pod replays the archive at prepare,
            // some slower than others), starts as the member the restored cluster lists
            // for it and takes the data from its peers (resume).
            let last = d.last().map(String::as_str);
            assert!(
                matches!(last, Some("bootstrap" | "resume")),
                "pod {o} formed or joined the new cluster: {d:?}"
            );
            if last == Some("resume") {
                continue;
            }
            let logs = c.logs(&c.etcd_ctr(o)).await;
            let said = logs.lines().any(|l| {
                l.contains("restored from a backup") && l.contains(&format!("\"{last_name}\""))
            });
            assert!(said, "pod {o} says it restored {last_name}:\n{logs}");
            restored += 1;
        }
        assert!(restored >= 2, "a majority of the pods restored {last_name}");
        // Every write acknowledged before the backup, on every member, one cluster.
        c.check(&[0, 1, 2], Some(cid), acked_before).await;
        // What the snapshot held, and, with the continuous archive (on by default), the
        // archived writes after it: writes 0..n without a gap, n at least what the snapshot
        // held and at most one past the last acknowledged (the writer's next write may have
        // been committed, its acknowledgement not yet counted).
        let mut got = written_indexes(&c, 0).await;
        got.sort_unstable();
        let n = got.len() as u64;
        assert!(
            got.iter().copied().eq(0..n),
            "the restored writes are 0..{n} without a gap"
        );
        assert!(
            (acked_before..=report.acked + 1).contains(&n),
            "the restore holds {n} writes: fewer than the snapshot taken at {acked_before} \
             acknowledged writes holds, or more than were written ({})",
            report.acked
        );
        let mut cl = c.client(l).await;
        cl.put("probe/after-restore", "x", None)
            .await
            .unwrap_or_else(|e| panic!("the restored cluster takes writes: {e}"));
        c.say(&format!(
            "cluster {cid:x} restored from {last_name} and the archive after it: {n} writes back, {} lost, writable",
            report.acked.saturating_sub(n)
        ));
    }

    /// 11. Backups exist, and two of three volumes are lost while one survives: nothing is
    ///     restored (the survivor's data is newer than any snapshot). The survivor restarts
    ///     on its data, the wiped pods only wait, and no pod starts a cluster of its own.
    pub async fn s11_lost_majority_with_a_survivor_is_not_restored() {
        let mut c = Cluster::new("s11", 3).await;
        c.enable_backups().await;
        let old = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(100, PROGRESS, "before the backup").await;
        let snap = c.backup_now(0).await;
        assert_eq!(snap["verified"], true, "{snap}");
        w.wait_progress(50, PROGRESS, "after the backup").await;
        let survivor_id = c.member_id(0).await;
        let before = c.decisions(0).await.len();
        let names = |list: Vec<serde_json::Value>| -> Vec<String> {
            list.iter()
                .filter_map(|m| m["name"].as_str().map(String::from))
                .collect()
        };
        let stored = names(c.backup_list().await);
        assert!(
            stored.iter().any(|n| snap["name"] == n.as_str()),
            "{stored:?}"
        );
        c.kill(0).await;
        c.remove(1, true).await;
        c.remove(2, true).await;
        let report = w.stop().await;
        c.say(&format!(
            "pods 1 and 2 lost their volumes, pod 0 killed; writer: {report:?}"
        ));
        c.start(0).await;
        c.create_pod(1, Etcd::V3_5).await;
        c.create_pod(2, Etcd::V3_5).await;
        // Give the wiped pods at least 20 s and three rounds each to decide.
        let since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let d1 = c.decisions(1).await;
            let d2 = c.decisions(2).await;
            if d1.len() >= 3 && d2.len() >= 3 && since.elapsed() > Duration::from_secs(20) {
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(90),
                "the wiped pods logged fewer than 3 rounds in 90 s: {d1:?} {d2:?}"
            );
        }
        for o in [1, 2] {
            let d = c.decisions(o).await;
            assert!(
                d.iter().all(|a| a == "wait"),
                "wiped pod {o} must only wait: {d:?}"
            );
            assert!(
                c.running(&c.etcd_ctr(o)).await,
                "pod {o}'s init keeps waiting"
            );
            assert!(
                c.status(o).await.is_none(),
                "no etcd answers on wiped pod {o}"
            );
            let (code, r) = c.peer_http(o, "/peer/report").await.unwrap();
            assert_eq!(code, 200);
            let r: serde_json::Value = serde_json::from_str(&r).unwrap();
            assert_eq!(r["has_data"], false, "pod {o}: {r}");
        }
        // The survivor restarted on its own data. Its etcd serves no client until it has
        // a quorum, so its volume speaks through its sidecar's report.
        c.assert_restarted_on_its_data(0, before).await;
        let (code, r) = c.peer_http(0, "/peer/report").await.unwrap();
        assert_eq!(code, 200);
        let r: serde_json::Value = serde_json::from_str(&r).unwrap();
        assert_eq!(r["has_data"], true, "{r}");
        assert_eq!(
            r["wal"]["member_id"].as_str(),
            Some(format!("{survivor_id:x}").as_str()),
            "the survivor kept its member ID: {r}"
        );
        assert_eq!(
            r["wal"]["cluster_id"].as_str(),
            Some(format!("{old:x}").as_str()),
            "the survivor is the old cluster's: {r}"
        );
        for o in 0..3 {
            let logs = c.logs(&c.etcd_ctr(o)).await;
            assert!(
                !logs.contains("restored from a backup"),
                "pod {o} restored a backup over a cluster that still has data:\n{logs}"
            );
            let live = c.http(o, "/healthz").await;
            assert!(matches!(live, Some((200, _))), "pod {o} /healthz {live:?}");
            assert!(!c.ready(o).await, "pod {o} is not ready without quorum");
        }
        assert_eq!(
            names(c.backup_list().await),
            stored,
            "the store holds the snapshots it held"
        );
        c.say("nothing restored: the survivor kept its data, the wiped pods wait");
    }

    /// 12. Two of three volumes lost after a writer ran: `etcd-steward recover --yes`,
    ///     run in a wiped pod's etcd container as `kubectl exec` would, brings the cluster
    ///     back from the survivor's volume: its sidecar stops etcd (the pod shares its process
    ///     namespace), the container restarts (as kubelet restarts it), init starts etcd once
    ///     with --force-new-cluster, and the wiped pods join as new learners: three voters
    ///     holding every acknowledged write, the same cluster.
    pub async fn s12_lost_majority_recovered_from_the_survivor_with_every_write() {
        let mut c = Cluster::new("s12", 3).await;
        let old = c.form(3, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(300, PROGRESS, "before the loss").await;
        let report = w.stop().await;
        // Followers persist the newest commit index with the next heartbeat.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let lost_ids = [c.member_id(1).await, c.member_id(2).await];
        c.remove(1, true).await;
        c.remove(2, true).await;
        c.create_pod(1, Etcd::V3_5).await;
        c.create_pod(2, Etcd::V3_5).await;
        c.say(&format!(
            "pods 1 and 2 lost their volumes; writer: {report:?}"
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!c.ready(0).await, "no quorum before the recovery");

        let (code, plan, err) = c.exec_steward(1, &["recover"]).await;
        assert_eq!(code, 0, "{err}");
        let plan: serde_json::Value =
            serde_json::from_str(plan.lines().next().unwrap_or_default()).unwrap();
        assert_eq!(plan["survivor"], "etcd-0", "{plan}");

        let recover = c.exec_steward(1, &["recover", "--yes", "--timeout=150s"]);
        tokio::pin!(recover);
        let (code, out, err) = loop {
            tokio::select! {
                r = &mut recover => break r,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    c.restart_exited().await;
                }
            }
        };
        assert_eq!(code, 0, "recover --yes: {out}\n{err}");
        let deadline = Instant::now() + READY;
        loop {
            c.restart_exited().await;
            let mut ready = true;
            for o in 0..3 {
                ready &= c.ready(o).await;
            }
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not three ready voters after {READY:?}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        c.check(&[0, 1, 2], Some(old), report.acked).await;
        for (o, lost) in [(1, lost_ids[0]), (2, lost_ids[1])] {
            assert_ne!(
                c.member_id(o).await,
                lost,
                "pod {o} joined with a new member ID"
            );
        }
        let logs = c.logs(&c.etcd_ctr(0)).await;
        assert!(
            logs.contains("recovery: starting etcd with --force-new-cluster"),
            "the survivor says what it did:\n{logs}"
        );
        c.say(&format!(
            "cluster {old:x} recovered from pod 0's volume: every one of {} acknowledged writes on three voters",
            report.acked
        ));
    }

    /// The member names as the first of `pods` that answers sees them.
    async fn member_names(c: &Cluster, pods: &[u32]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for o in pods {
                if let Some(ms) = c.members(*o).await {
                    let mut names: Vec<String> = ms.iter().map(|m| m.name().to_string()).collect();
                    names.sort();
                    return names;
                }
            }
            assert!(
                Instant::now() < deadline,
                "none of pods {pods:?} lists the members"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `etcd_steward_scale_in_removals_total` summed over the sidecars of `pods`.
    async fn scale_in_removals(c: &Cluster, pods: &[u32]) -> u64 {
        let mut total = 0;
        for o in pods {
            let (code, body) = c
                .http(*o, "/metrics")
                .await
                .unwrap_or_else(|| panic!("pod {o}'s sidecar serves /metrics"));
            assert_eq!(code, 200, "pod {o}'s /metrics: {body}");
            total += body
                .lines()
                .find_map(|l| l.strip_prefix("etcd_steward_scale_in_removals_total "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("pod {o}'s /metrics counts scale-in removals:\n{body}"));
        }
        total
    }

    /// 14. Scale-in with the Kubernetes API (a fake one on the host, reached from the pods
    ///     at the management network's gateway): five pods with `--scale-in`, spec.replicas
    ///     5 → 3. While the API is silent nothing is removed, not even a dead pod beyond
    ///     spec.replicas, and the preStop hook does nothing. Pod 3, gone without its hook,
    ///     is removed by the leader's sidecar once the API answers; pod 4's preStop hook
    ///     (`leave --if-scaled-in`, by `docker exec`) removes its own member before the
    ///     pod stops. Three voters remain, ready, with every acknowledged write. A pod
    ///     merely restarted (gone from the API for a while at spec.replicas 3) keeps its
    ///     member. Scaled up to 4 on pod 3's retained volume, pod 3 sets the removed
    ///     member's data aside (renamed, still in the volume) and joins as a new member.
    ///     No write is refused for longer than an election.
    pub async fn s14_scale_in_leaves_no_dead_voter() {
        let mut c = Cluster::new("s14", 5).await;
        let api = FakeKube::start(
            std::net::SocketAddr::new(c.gateway().into(), 0),
            "default",
            "etcd",
        )
        .await
        .unwrap();
        api.set(5, &[0, 1, 2, 3, 4]);
        c.extra_args = vec![
            "--scale-in".into(),
            "--scale-in-interval=1s".into(),
            format!("--kube-api-url=http://{}", api.addr()),
            "--kube-token-file=/nonexistent/token".into(),
            "--statefulset-name=etcd".into(),
        ];
        c.say(&format!("fake Kubernetes API at {}", api.addr()));
        let cid = c.form(5, Etcd::V3_5).await;
        let w = writer_for(&c, &[0, 1, 2]);
        w.wait_progress(100, PROGRESS, "before scaling in").await;
        let all: Vec<String> = (0..5).map(|o| format!("etcd-{o}")).collect();
        let three: Vec<String> = (0..3).map(|o| format!("etcd-{o}")).collect();

        // spec.replicas 3, but the API is silent: pod 3 gone without its hook, pod 4's
        // hook cannot learn it is scaled away. Nothing is removed.
        api.set_silent(true);
        api.set(3, &[0, 1, 2, 4]);
        let old3 = c.member_id(3).await;
        assert_ne!(old3, 0);
        c.kill(3).await;
        c.remove(3, false).await;
        let (code, out, err) = c.exec_steward(4, &["leave", "--if-scaled-in"]).await;
        assert_ne!(code, 0, "a silent API: the hook does nothing\n{out}\n{err}");
        assert!(err.contains("nothing was done"), "{err}");
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            member_names(&c, &[0, 1, 2]).await,
            all,
            "silence removes nothing"
        );
        assert_eq!(scale_in_removals(&c, &[0, 1, 2, 4]).await, 0);

        // The API answers: the leader's sidecar removes pod 3 (its pod is gone), not pod 4
        // (its pod still runs).
        api.set_silent(false);
        let deadline = Instant::now() + PROGRESS;
        loop {
            let names = member_names(&c, &[0, 1, 2]).await;
            if !names.contains(&"etcd-3".to_string()) {
                assert!(names.contains(&"etcd-4".to_string()), "{names:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "pod 3's member removed by the leader within {PROGRESS:?}: {names:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        c.say("the leader's sidecar removed pod 3's member");
        assert_eq!(scale_in_removals(&c, &[0, 1, 2, 4]).await, 1);
        // The removal is one ScaledIn Event, on the pod whose sidecar removed it (a
        // running one), naming pod 3's member, in the API's own shape.
        let scaled_in = || {
            api.events()
                .into_iter()
                .filter(|e| e["reason"] == "ScaledIn")
                .collect::<Vec<_>>()
        };
        let deadline = Instant::now() + PROGRESS;
        while scaled_in().is_empty() {
            assert!(
                Instant::now() < deadline,
                "a ScaledIn Event within {PROGRESS:?}: {:#?}",
                api.events()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let events = scaled_in();
        assert_eq!(events.len(), 1, "{events:#?}");
        let e = &events[0];
        let on = e["regarding"]["name"].as_str().unwrap_or_default();
        assert!(
            three.iter().any(|p| p == on),
            "posted by a running pod: {e:#}"
        );
        assert_eq!(e["regarding"]["kind"], "Pod", "{e:#}");
        assert_eq!(e["reportingController"], "etcd-steward", "{e:#}");
        assert_eq!(e["reportingInstance"], on, "{e:#}");
        assert!(
            e["note"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("removed member {old3:x}")),
            "{e:#}"
        );
        c.say(&format!("ScaledIn Event on {on}"));

        // Pod 4's preStop hook removes its own member; the leader would not (its pod is
        // listed). Then the pod is gone.
        let (code, out, err) = c.exec_steward(4, &["leave", "--if-scaled-in"]).await;
        assert_eq!(code, 0, "the preStop hook: {out}\n{err}");
        assert!(out.contains(r#""state":"left""#), "{out}");
        assert_eq!(
            member_names(&c, &[0, 1, 2]).await,
            three,
            "pod 4's member removed by its own hook"
        );
        c.stop(4).await;
        c.remove(4, false).await;
        api.set(3, &[0, 1, 2]);
        w.wait_progress(50, PROGRESS, "at three").await;
        c.check(&[0, 1, 2], Some(cid), w.acked()).await;

        // Pod 1 merely restarts: gone from the API for a while at spec.replicas 3.
        let id1 = c.member_id(1).await;
        let before = c.decisions(1).await.len();
        api.set(3, &[0, 2]);
        c.kill(1).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            member_names(&c, &[0, 2]).await,
            three,
            "a restarting pod below spec.replicas keeps its member"
        );
        api.set(3, &[0, 1, 2]);
        c.start(1).await;
        c.wait_ready(&[0, 1, 2], READY).await;
        assert_eq!(c.member_id(1).await, id1, "pod 1 kept its member ID");
        c.assert_restarted_on_its_data(1, before).await;

        // Scale up to 4 on pod 3's retained volume: the removed member's data is set
        // aside, pod 3 joins as a new member.
        api.set(4, &[0, 1, 2, 3]);
        c.create_pod(3, Etcd::V3_5).await;
        c.wait_ready(&[0, 1, 2, 3], READY).await;
        let new3 = c.member_id(3).await;
        assert_ne!(new3, old3, "pod 3 joined as a new member");
        let d = c.decisions(3).await;
        let set_aside = d.iter().position(|a| a == "set-aside");
        let joined = d.iter().rposition(|a| a == "join");
        assert!(
            set_aside.is_some() && joined > set_aside,
            "pod 3 set its data aside, then joined: {d:?}"
        );
        let kept = c.volume_paths(3, "set-aside").await;
        assert!(
            kept.iter()
                .any(|p| p.contains("-removed-member/member/wal/") && p.ends_with(".wal")),
            "the removed member's WAL is in set-aside/…-removed-member/: {kept:?}"
        );

        w.wait_progress(50, PROGRESS, "at four").await;
        let report = w.stop().await;
        c.say(&format!("writer: {report:?}"));
        assert!(
            report.max_gap < Duration::from_secs(5),
            "writes were refused for {:?} (ending {:?} after the writer started)",
            report.max_gap,
            report.max_gap_at
        );
        c.check(&[0, 1, 2, 3], Some(cid), report.acked).await;
    }
}
