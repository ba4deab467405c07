//! A member whose data silently diverged (issue 27), on real etcd and loopback pods: a
//! follower's database file is changed on disk while it is down (a value's bytes replaced
//! by others of the same length: bbolt has no page checksums), and it restarts.
//!
//! - While another member does not answer, the check proves nothing: no member is judged
//!   diverged, and `status` says why (the silent member named).
//! - Once every voter answers, the leader's sidecar finds the changed member diverged from
//!   the majority's hash within a few `--corruption-check-interval`s: the metric, its own
//!   `/ready` and `status` say so; the healthy members stay ready and are not flagged.
//!
//! - Then its sidecar, told by the leader's (authenticated as every control request), stops
//!   it; `init` sets its data aside under `set-aside/<time>-diverged/` and it joins again
//!   as a new member: every member's `HashKV` agrees and none serves the changed value.
//!   The same when the leader's own data is the changed one, and when etcd's own check
//!   raised its `CORRUPT` alarm first (disarmed once every voter agrees). Without a way to
//!   authenticate the request (no token, no peer TLS), nothing is rebuilt.
//!
//! The changed member's etcd is started with `--experimental-initial-corrupt-check=false`
//! (a user's flag keeps its value): with `init`'s default, etcd itself refuses to start on
//! such data (`etcd_refuses_to_start_on_data_that_differs_from_its_peers`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use etcd_client::GetOptions;
use harness::loopback::{Backups, DrillReaper, Set};
use harness::{wait_for_or, Etcd};

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const FORM: Duration = Duration::from_secs(60);
/// A few check intervals (1 s each), and a restart.
const FOUND: Duration = Duration::from_secs(30);
const KEY: &str = "diverge/victim";
const VALUE: &str = "value-original-0123456789abcdef";
/// The same length as `original`: the file keeps its layout.
const FROM: &[u8] = b"original";
const TO: &[u8] = b"tampered";
const NO_INITIAL_CHECK: &str = "--experimental-initial-corrupt-check=false";
/// A rebuild: a stop, a restart of `init`, a replacement, a learner's catch-up.
const REBUILT: Duration = Duration::from_secs(120);

/// Replaces every `FROM` in the member's database file by `TO`; how many were replaced.
fn change_db(data_dir: &Path) -> usize {
    change_db_to(data_dir, TO)
}

/// Replaces every `FROM` in the member's database file by `to` (as long).
fn change_db_to(data_dir: &Path, to: &[u8]) -> usize {
    harness::loopback::replace_in_db(data_dir, FROM, to).unwrap()
}

async fn metrics(set: &Set, o: u32) -> String {
    set.http(o, "/metrics")
        .await
        .map(|(_, b)| b)
        .unwrap_or_default()
}

async fn status_json(set: &Set, o: u32) -> serde_json::Value {
    let out = set.steward(o, &["status", "-o", "json"]).await;
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

async fn served_value(set: &Set, o: u32) -> Option<String> {
    let mut c = set.client(o).await.ok()?;
    let r = c
        .get(KEY, Some(GetOptions::new().with_serializable()))
        .await
        .ok()?;
    r.kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

async fn a_changed_follower_is_found_diverged_only_with_a_majoritys_proof(etcd: Etcd) {
    let api =
        harness::fake_kube::FakeKube::start("127.0.0.1:0".parse().unwrap(), "default", "etcd")
            .await
            .unwrap();
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec![
        "--corruption-check-interval=1s".into(),
        format!("--kube-api-url=http://{}", api.addr()),
    ];
    // Control requests off (no token, no peer TLS): the leader cannot tell the diverged
    // member's sidecar, so nothing is rebuilt and the verdict stands.
    set.control_token = None;
    for o in 0..3 {
        set.start_with_etcd_args(o, &[NO_INITIAL_CHECK]).unwrap();
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    let mut c = set.any_client().await.unwrap();
    c.put(KEY, VALUE, None).await.unwrap();
    set.put_keys("k", 20).await.unwrap();
    // Every member has the value in its database file (etcd commits its backend every
    // 100 ms), not only in its WAL.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = set.leader().await.unwrap();
    let followers: Vec<u32> = (0..3).filter(|o| *o != leader).collect();
    let (changed, silent) = (followers[0], followers[1]);
    let changed_id = format!("{:x}", set.member_id(changed).await.unwrap());
    let silent_id = format!("{:x}", set.member_id(silent).await.unwrap());

    set.kill(silent).await.unwrap();
    set.kill(changed).await.unwrap();
    assert!(
        change_db(set.data_dir(changed)) >= 1,
        "the value is in the database file"
    );
    set.start_with_etcd_args(changed, &[NO_INITIAL_CHECK])
        .unwrap();
    wait_for_or(
        FOUND,
        "the changed member serves its changed value",
        || async {
            served_value(&set, changed).await.as_deref() == Some("value-tampered-0123456789abcdef")
        },
        || set.dump(),
    )
    .await;

    // One member silent: two answers that differ prove nothing.
    let end = tokio::time::Instant::now() + FOUND;
    let split = loop {
        let check = status_json(&set, leader).await["corruption_check"].clone();
        // Both answered (not a check taken while the changed member was starting).
        let hashes = check["verdict"]["why"]["hashes"].as_array().map(Vec::len);
        if check["verdict"]["outcome"] == "undecided" && hashes == Some(2) {
            break check;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no check that proves nothing: {check}{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let why = &split["verdict"]["why"];
    assert_eq!(why["kind"], "no_majority", "{split}");
    assert_eq!(why["silent"], serde_json::json!([silent_id]), "{split}");
    assert_eq!(why["hashes"].as_array().map(Vec::len), Some(2), "{split}");
    for o in [leader, changed] {
        let (_, ready) = set.http(o, "/ready").await.unwrap_or_default();
        assert!(!ready.contains("diverged"), "pod {o}: {ready}");
        let m = metrics(&set, o).await;
        assert!(
            !m.lines()
                .any(|l| l.starts_with("etcd_steward_member_diverged{") && l.ends_with(" 1")),
            "pod {o}: nothing flagged without a majority's proof:\n{m}"
        );
    }
    let text = set.steward(leader, &["status"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("only 2 of the 3 voters answered")
            || text.contains("no hash has a strict majority of the 3 voters"),
        "{text}"
    );
    assert!(
        text.contains(&format!("no answer from {silent_id}")),
        "{text}"
    );

    // Every voter answers: two of three agree, the changed one is diverged.
    set.start_with_etcd_args(silent, &[NO_INITIAL_CHECK])
        .unwrap();
    wait_for_or(
        FOUND,
        "the changed member out of readiness, saying why",
        || async {
            matches!(set.http(changed, "/ready").await, Some((503, body)) if body.contains("data diverged"))
        },
        || set.dump(),
    )
    .await;
    // The changed member's own sidecar posts a MemberDiverged Event on its pod; no other
    // pod gets one.
    wait_for_or(
        FOUND,
        "a MemberDiverged Event on the changed member's pod",
        || async {
            api.events().iter().any(|e| {
                e["reason"] == "MemberDiverged"
                    && e["regarding"]["name"] == format!("etcd-{changed}").as_str()
                    && e["type"] == "Warning"
                    && e["note"].as_str().is_some_and(|n| n.contains(&changed_id))
            })
        },
        || format!("{:#?}", api.events()),
    )
    .await;
    assert!(
        api.events().iter().all(|e| e["reason"] != "MemberDiverged"
            || e["regarding"]["name"] == format!("etcd-{changed}").as_str()),
        "{:#?}",
        api.events()
    );
    let json = status_json(&set, silent).await;
    let check = &json["corruption_check"];
    assert_eq!(check["verdict"]["outcome"], "diverged", "{check}");
    assert_eq!(
        check["verdict"]["diverged"][0]["members"],
        serde_json::json!([changed_id]),
        "{check}"
    );
    let mut agreeing: Vec<String> = check["verdict"]["agreeing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect();
    agreeing.sort();
    let mut healthy = vec![
        format!("{:x}", set.member_id(leader).await.unwrap()),
        silent_id.clone(),
    ];
    healthy.sort();
    assert_eq!(agreeing, healthy, "{check}");
    let checker = set.leader().await.unwrap();
    let m = metrics(&set, checker).await;
    assert!(
        m.contains(&format!(
            "etcd_steward_member_diverged{{member=\"{changed_id}\"}} 1"
        )),
        "{m}"
    );
    for id in &healthy {
        assert!(
            m.contains(&format!(
                "etcd_steward_member_diverged{{member=\"{id}\"}} 0"
            )),
            "{m}"
        );
    }
    assert!(
        m.contains("etcd_steward_corruption_checks_total{outcome=\"diverged\"}"),
        "{m}"
    );
    assert!(
        m.contains("etcd_steward_corruption_check_last_success_timestamp_seconds"),
        "{m}"
    );
    assert!(m.contains("etcd_steward_members_rebuilt_total 0"), "{m}");
    // The healthy members stay ready, and the diverged one stays out.
    wait_for_or(
        FOUND,
        "the healthy members ready",
        || async { set.ready(leader).await && set.ready(silent).await },
        || set.dump(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!set.ready(changed).await, "still out of readiness");
    assert_eq!(
        format!("{:x}", set.member_id(changed).await.unwrap()),
        changed_id,
        "not rebuilt without an authenticated request"
    );
    assert!(
        set.logs(checker).contains("rebuild request refused"),
        "the leader's sidecar says the request was refused"
    );
    set.shutdown().await;
}

/// Which member's database file a rebuild scenario changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Changed {
    /// A follower, with etcd's own periodic check on (it raises `CORRUPT`).
    Follower,
    /// The leader: its own sidecar's check finds it diverged.
    Leader,
}

/// Every member's `HashKV` at the lowest current revision among them.
async fn hashes(set: &Set) -> Vec<(u32, i64)> {
    let mut lowest = i64::MAX;
    for o in 0..3 {
        lowest = lowest.min(set.revision(o).await.unwrap_or(0));
    }
    let mut out = Vec::new();
    for o in 0..3 {
        let mut c = set.client(o).await.unwrap();
        let h = c.hash_kv(lowest).await.unwrap();
        out.push((h.hash(), h.compact_version()));
    }
    out
}

/// Writes the value the tests change (and `keys` others), lets every member apply them,
/// then kills a follower and changes its database file on disk: its ordinal and member ID.
async fn change_a_follower(set: &mut Set, keys: usize) -> (u32, u64) {
    let mut c = set.any_client().await.unwrap();
    c.put(KEY, VALUE, None).await.unwrap();
    set.put_keys("k", keys).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = set.leader().await.unwrap();
    let changed = (0..3).find(|o| *o != leader).unwrap();
    let old = set.member_id(changed).await.unwrap();
    set.kill(changed).await.unwrap();
    assert!(change_db(set.data_dir(changed)) >= 1);
    (changed, old)
}

/// Waits until pod `o`'s etcd refused to start on data that differs from its peers'.
async fn wait_refused(set: &Set, o: u32) {
    wait_for_or(
        FOUND,
        "etcd refusing to start on the changed data",
        || async { set.logs(o).contains("found data inconsistency with peers") },
        || set.dump(),
    )
    .await;
}

/// Whether pod `o`'s sidecar logged that it holds a rebuild request it made itself, on a
/// hash of the database file computed offline (`offline`) or asked of its running etcd.
fn held_by_own_sidecar(set: &Set, o: u32, offline: bool) -> bool {
    set.logs(o).lines().any(|l| {
        l.contains("a rebuild request is held") && l.contains(&format!("\"offline\":{offline}"))
    })
}

/// Restarts exited etcds (as the kubelet does) until pod `changed` serves as a new member
/// (not `old`), every pod is a ready voter and every member's `HashKV` agrees.
async fn wait_rebuilt(set: &mut Set, changed: u32, old: u64) {
    let end = tokio::time::Instant::now() + REBUILT;
    loop {
        set.restart_exited().unwrap();
        let new = set.member_id(changed).await.ok();
        if new.is_some_and(|id| id != old) && set.all_ready(&[0, 1, 2]).await {
            let h = hashes(set).await;
            if h.iter().all(|x| *x == h[0]) {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < end,
            "not rebuilt within {REBUILT:?}{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// After a rebuild of pod `changed`: every pod serves the value written, the changed
/// database file is kept under one `set-aside/<time>-diverged/`, and the rebuild counted.
async fn assert_rebuilt_with_data_kept(set: &Set, changed: u32) {
    for o in 0..3 {
        assert_eq!(
            served_value(set, o).await.as_deref(),
            Some(VALUE),
            "pod {o} serves the value that was written"
        );
    }
    let aside: Vec<_> = std::fs::read_dir(set.data_dir(changed).join("set-aside"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with("-diverged"))
        .collect();
    assert_eq!(aside.len(), 1, "one set-aside for the rebuild");
    let db = std::fs::read(aside[0].path().join("member/snap/db")).unwrap();
    assert!(
        db.windows(TO.len()).any(|w| w == TO),
        "the changed database file is kept"
    );
    let m = metrics(set, changed).await;
    assert!(m.contains("etcd_steward_members_rebuilt_total 1"), "{m}");
}

async fn corrupt_alarm(set: &Set, o: u32) -> bool {
    let Ok(mut c) = set.client(o).await else {
        return false;
    };
    c.alarm(
        etcd_client::AlarmAction::Get,
        etcd_client::AlarmType::None,
        None,
    )
    .await
    .is_ok_and(|r| {
        r.alarms()
            .iter()
            .any(|a| a.alarm() == etcd_client::AlarmType::Corrupt)
    })
}

async fn a_diverged_member_is_rebuilt_from_its_peers(etcd: Etcd, which: Changed) {
    let api =
        harness::fake_kube::FakeKube::start("127.0.0.1:0".parse().unwrap(), "default", "etcd")
            .await
            .unwrap();
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    let kube = format!("--kube-api-url=http://{}", api.addr());
    // The sidecars' check is off until the changed member is in place.
    set.extra_args = vec!["--corruption-check-interval=0".into(), kube.clone()];
    let etcd_check: &[&str] = match which {
        Changed::Follower => &[NO_INITIAL_CHECK, "--experimental-corrupt-check-time=1s"],
        Changed::Leader => &[NO_INITIAL_CHECK],
    };
    let start = |set: &mut Set, o: u32| {
        set.set_dns(o, true).unwrap();
        set.start_sidecar(o).unwrap();
        set.start_init_with(o, etcd_check).unwrap();
    };
    for o in 0..3 {
        start(&mut set, o);
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    let mut c = set.any_client().await.unwrap();
    c.put(KEY, VALUE, None).await.unwrap();
    set.put_keys("k", 20).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = set.leader().await.unwrap();
    let changed = match which {
        Changed::Leader => leader,
        Changed::Follower => (0..3).find(|o| *o != leader).unwrap(),
    };
    let old = set.member_id(changed).await.unwrap();
    set.kill(changed).await.unwrap();
    assert!(change_db(set.data_dir(changed)) >= 1);
    start(&mut set, changed);
    wait_for_or(
        FOUND,
        "the changed member serves its changed value",
        || async {
            served_value(&set, changed).await.as_deref() == Some("value-tampered-0123456789abcdef")
        },
        || set.dump(),
    )
    .await;
    let mut alarm_seen = false;
    if which == Changed::Leader {
        // Leadership back to the changed member: its own check judges it.
        wait_for_or(
            FOUND,
            "the changed member leads",
            || async {
                if set.leader().await.ok() == Some(changed) {
                    return true;
                }
                if let Ok(now) = set.leader().await {
                    if let Ok(mut c) = set.client(now).await {
                        let _ = c.move_leader(old).await;
                    }
                }
                false
            },
            || set.dump(),
        )
        .await;
    } else {
        wait_for_or(
            FOUND,
            "etcd's own check raises CORRUPT",
            || async { corrupt_alarm(&set, leader).await },
            || set.dump(),
        )
        .await;
        alarm_seen = true;
    }
    // The sidecars' check on.
    set.extra_args = vec!["--corruption-check-interval=1s".into(), kube];
    for o in 0..3 {
        set.kill_sidecar(o).await;
        set.start_sidecar(o).unwrap();
    }
    // Rebuilt: a new member serves here as a ready voter, and every member's hash agrees.
    wait_rebuilt(&mut set, changed, old).await;
    let new = set.member_id(changed).await.unwrap();
    assert_ne!(new, old, "an empty member never reuses its old member ID");
    assert_rebuilt_with_data_kept(&set, changed).await;
    wait_for_or(
        FOUND,
        "a MemberRebuilt Event on the changed member's pod",
        || async {
            api.events().iter().any(|e| {
                e["reason"] == "MemberRebuilt"
                    && e["regarding"]["name"] == format!("etcd-{changed}").as_str()
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.contains(&format!("{old:x}")) && n.contains("diverged"))
            })
        },
        || format!("{:#?}", api.events()),
    )
    .await;
    // init's set-aside is an Event too (posted by the sidecar from init's journal).
    wait_for_or(
        FOUND,
        "a DataSetAside Event naming the diverged set-aside",
        || async {
            api.events().iter().any(|e| {
                e["reason"] == "DataSetAside"
                    && e["regarding"]["name"] == format!("etcd-{changed}").as_str()
                    && e["note"].as_str().is_some_and(|n| n.contains("-diverged"))
            })
        },
        || format!("{:#?}", api.events()),
    )
    .await;
    if alarm_seen {
        wait_for_or(
            FOUND,
            "CORRUPT disarmed once every voter agrees",
            || async {
                let l = set.leader().await.unwrap_or(0);
                !corrupt_alarm(&set, l).await
            },
            || set.dump(),
        )
        .await;
        let mut c = set.any_client().await.unwrap();
        c.put("after/rebuild", "writes resume", None).await.unwrap();
    }
    set.shutdown().await;
}

/// Both followers changed, each differently: three hashes, no majority. Nothing is
/// rebuilt (control requests on), and `status` says why.
async fn three_different_hashes_rebuild_nothing_and_say_why(etcd: Etcd) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec!["--corruption-check-interval=1s".into()];
    for o in 0..3 {
        set.start_with_etcd_args(o, &[NO_INITIAL_CHECK]).unwrap();
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    let mut c = set.any_client().await.unwrap();
    c.put(KEY, VALUE, None).await.unwrap();
    set.put_keys("k", 20).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = set.leader().await.unwrap();
    let followers: Vec<u32> = (0..3).filter(|o| *o != leader).collect();
    let mut ids = Vec::new();
    for o in 0..3 {
        ids.push(set.member_id(o).await.unwrap());
    }
    for (o, to) in followers.iter().zip([TO, b"mistaken".as_slice()]) {
        set.kill(*o).await.unwrap();
        assert!(change_db_to(set.data_dir(*o), to) >= 1);
    }
    for o in &followers {
        set.start_with_etcd_args(*o, &[NO_INITIAL_CHECK]).unwrap();
    }
    wait_for_or(
        FOUND,
        "a check that finds three hashes",
        || async {
            let check = status_json(&set, leader).await["corruption_check"].clone();
            check["verdict"]["why"]["hashes"].as_array().map(Vec::len) == Some(3)
        },
        || set.dump(),
    )
    .await;
    // Several more checks: still nothing rebuilt.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for o in 0..3 {
        assert_eq!(
            set.member_id(o).await.unwrap(),
            ids[o as usize],
            "pod {o} not rebuilt"
        );
        assert!(
            !set.data_dir(o).join("set-aside").exists(),
            "pod {o}: nothing set aside"
        );
    }
    let m = metrics(&set, leader).await;
    assert!(
        m.lines().any(
            |l| l.starts_with("etcd_steward_corruption_checks_total{outcome=\"split\"}")
                && !l.ends_with(" 0")
        ),
        "{m}"
    );
    let text = set.steward(leader, &["status"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("no hash has a strict majority of the 3 voters"),
        "{text}"
    );
    set.shutdown().await;
}

/// A rebuild request made up by a holder of the control token (the answers it carries
/// claim a majority hash no member has) is refused: the healthy member's sidecar asks the
/// majority again itself, and nothing is stopped or set aside.
async fn a_made_up_rebuild_request_is_refused_and_sets_nothing_aside(etcd: Etcd) {
    use etcd_steward::facts::hashes::{judge, Answered, HashAnswer, HashCheck, HashRound};
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec!["--corruption-check-interval=0".into()];
    set.start_all(FORM).await.unwrap();
    set.put_keys("k", 20).await.unwrap();
    let leader = set.leader().await.unwrap();
    let target = (0..3).find(|o| *o != leader).unwrap();
    let mut ids = Vec::new();
    for o in 0..3 {
        ids.push(set.member_id(o).await.unwrap());
    }
    let revision = set.revision(target).await.unwrap();
    let real = set
        .client(target)
        .await
        .unwrap()
        .hash_kv(revision)
        .await
        .unwrap();
    // The other two "answered" another hash: a majority that does not exist.
    let answers: Vec<HashAnswer> = (0..3)
        .map(|o| HashAnswer {
            member: ids[o as usize],
            got: Answered::Hash {
                hash: if o == target {
                    real.hash()
                } else {
                    real.hash() ^ 1
                },
                compact_revision: real.compact_version(),
            },
        })
        .collect();
    let verdict = judge(&HashRound {
        revision,
        voters: ids.clone(),
        answers: answers.clone(),
    });
    let check = HashCheck {
        at: etcd_steward::clock::unix_now(),
        checker: ids[leader as usize],
        answers,
        verdict,
    };
    let request = etcd_steward::facts::rebuild::RebuildRequest::new(
        ids[target as usize],
        check,
        etcd_steward::clock::unix_now() + 600,
    );
    let token = std::fs::read_to_string(set.control_token.as_ref().unwrap()).unwrap();
    let (status, body) = etcd_steward::http_client::post_json(
        std::net::SocketAddr::new(set.pod(target).ip.into(), 8443),
        &set.host(target),
        "/peer/rebuild",
        etcd_steward::http_client::Post {
            body: serde_json::to_vec(&request).unwrap(),
            authorization: Some(format!("Bearer {}", token.trim())),
        },
        Duration::from_secs(30),
        None,
    )
    .await
    .unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("not the majority's"), "{body}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    set.restart_exited().unwrap();
    assert_eq!(set.member_id(target).await.unwrap(), ids[target as usize]);
    assert!(!set.data_dir(target).join("set-aside").exists());
    assert!(set.ready(target).await);
    set.shutdown().await;
}

async fn a_diverged_follower_is_rebuilt_and_the_corrupt_alarm_cleared(etcd: Etcd) {
    a_diverged_member_is_rebuilt_from_its_peers(etcd, Changed::Follower).await;
}

async fn a_diverged_leader_is_rebuilt_from_its_peers(etcd: Etcd) {
    a_diverged_member_is_rebuilt_from_its_peers(etcd, Changed::Leader).await;
}

/// With `init`'s defaults, etcd's own check at start compares its hash with its peers' and
/// refuses to start a member whose data differs. etcd compares only once the member's
/// membership is recovered from a snapshot file at start (`--snapshot-count` entries
/// applied; before that its check finds no peer to ask and passes: the sidecars' check
/// covers that gap): a small count here.
async fn etcd_refuses_to_start_on_data_that_differs_from_its_peers(etcd: Etcd) {
    const SNAPSHOTS: &str = "--snapshot-count=10";
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec!["--corruption-check-interval=0".into()];
    let start = |set: &mut Set, o: u32| {
        set.set_dns(o, true).unwrap();
        set.start_sidecar(o).unwrap();
        set.start_init_with(o, &[SNAPSHOTS]).unwrap();
    };
    for o in 0..3 {
        start(&mut set, o);
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    let (changed, _) = change_a_follower(&mut set, 50).await;
    start(&mut set, changed);
    wait_refused(&set, changed).await;
    assert!(!set.ready(changed).await);
    set.shutdown().await;
}

/// With `init`'s defaults, etcd refuses to start a member whose data differs from its
/// peers', and gives no hash for the leader's check to judge. Its own sidecar hashes the
/// volume's database file offline (a copy, in a throw-away etcd), asks every other voter
/// at that revision, and on the majority's proof holds a rebuild request: at the
/// container's next start (the harness restarts an exited etcd, as the kubelet does)
/// `init` sets the data aside and the member joins again as a new one.
async fn a_member_whose_etcd_refuses_to_start_is_rebuilt_from_its_peers(etcd: Etcd) {
    const SNAPSHOTS: &str = "--snapshot-count=10";
    let store = tempfile::tempdir().unwrap();
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    let _reaper = DrillReaper::new(set.root());
    set.extra_args = Backups::file(store.path())
        .with(["--backup-interval=1h", "--corruption-check-interval=1h"])
        .options(set.root(), etcd);
    let start = |set: &mut Set, o: u32| {
        set.set_dns(o, true).unwrap();
        set.start_sidecar(o).unwrap();
        set.start_init_with(o, &[SNAPSHOTS]).unwrap();
    };
    for o in 0..3 {
        start(&mut set, o);
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    let (changed, old) = change_a_follower(&mut set, 50).await;
    start(&mut set, changed);
    wait_refused(&set, changed).await;
    wait_for_or(
        FOUND,
        "the changed member's sidecar holding a rebuild request, on the offline hash",
        || async { held_by_own_sidecar(&set, changed, true) },
        || set.dump(),
    )
    .await;
    wait_rebuilt(&mut set, changed, old).await;
    assert_rebuilt_with_data_kept(&set, changed).await;
    set.shutdown().await;
}

/// A member that does not start for another reason (its data agrees with the majority's):
/// its sidecar's offline hash agrees, and nothing is set aside.
async fn a_member_down_with_agreeing_data_is_judged_and_kept(etcd: Etcd) {
    let store = tempfile::tempdir().unwrap();
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    let _reaper = DrillReaper::new(set.root());
    set.extra_args = Backups::file(store.path())
        .with(["--backup-interval=1h", "--corruption-check-interval=1h"])
        .options(set.root(), etcd);
    set.start_all(FORM).await.unwrap();
    set.put_keys("k", 30).await.unwrap();
    let leader = set.leader().await.unwrap();
    let down = (0..3).find(|o| *o != leader).unwrap();
    let old = set.member_id(down).await.unwrap();
    // Its etcd stopped and not started again (init not run): the sidecar alone looks.
    set.kill_etcd(down).await;
    wait_for_or(
        FOUND,
        "the down member's sidecar judging its data offline",
        || async {
            set.read_logs(down, "sidecar")
                .contains("proves no divergence")
        },
        || set.dump(),
    )
    .await;
    let logs = set.read_logs(down, "sidecar");
    assert!(logs.contains("agreed"), "{logs}");
    assert!(!logs.contains("a rebuild request is held"), "{logs}");
    set.start_init(down).unwrap();
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    assert_eq!(set.member_id(down).await.unwrap(), old, "kept its member");
    assert!(!set.data_dir(down).join("set-aside").exists());
    set.shutdown().await;
}

/// A member that serves again after its etcd was silent for a while (etcd's own check
/// off here, as it passes once the revisions it would compare are compacted on its peers)
/// is judged at once by its own sidecar, online, against every voter's hash, not at the
/// leader's next check (an hour away here); no backups needed. On the majority's proof
/// its etcd is stopped and `init` sets the data aside: rebuilt with a new ID.
async fn a_member_serving_again_after_a_silence_is_judged_at_once(etcd: Etcd) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec!["--corruption-check-interval=1h".into()];
    let start_init = |set: &mut Set, o: u32| set.start_init_with(o, &[NO_INITIAL_CHECK]).unwrap();
    for o in 0..3 {
        set.set_dns(o, true).unwrap();
        set.start_sidecar(o).unwrap();
        start_init(&mut set, o);
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    let (changed, old) = change_a_follower(&mut set, 20).await;
    // The pod back, its etcd silent for longer than a start takes (a crash loop, a wait).
    set.set_dns(changed, true).unwrap();
    set.start_sidecar(changed).unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    start_init(&mut set, changed);
    wait_rebuilt(&mut set, changed, old).await;
    assert!(
        held_by_own_sidecar(&set, changed, false),
        "the request held by the changed member's own sidecar, online{}",
        set.dump()
    );
    assert_rebuilt_with_data_kept(&set, changed).await;
    set.shutdown().await;
}

harness::per_etcd_version!(
    [V3_5Current, V3_4, V3_5]:
    a_member_serving_again_after_a_silence_is_judged_at_once,
    a_member_whose_etcd_refuses_to_start_is_rebuilt_from_its_peers,
    a_member_down_with_agreeing_data_is_judged_and_kept,
    a_changed_follower_is_found_diverged_only_with_a_majoritys_proof,
    etcd_refuses_to_start_on_data_that_differs_from_its_peers,
    a_diverged_follower_is_rebuilt_and_the_corrupt_alarm_cleared,
    a_diverged_leader_is_rebuilt_from_its_peers,
    three_different_hashes_rebuild_nothing_and_say_why,
    a_made_up_rebuild_request_is_refused_and_sets_nothing_aside
);
