//! Defragmentation and the space alarm against real etcd (3.4.23, 3.5.1, 3.5.30) on loopback
//! pods: a fragmented database is defragmented by every member's sidecar, one member at a
//! time, followers first and the leader last; under NOSPACE, once keys are deleted and
//! compacted, the sidecars defragment and disarm the alarm, and writes resume.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use etcd_client::{Client, CompactionOptions};
use harness::client::sample;
use harness::loopback::Set;
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const WAIT: Duration = Duration::from_secs(60);
const VALUE: usize = 256 << 10;
const QUOTA: &str = "16777216";

/// Polls `check` every 200 ms for up to WAIT.
async fn until<F, Fut>(set: &Set, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {WAIT:?}\n{}",
            set.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn db_size(set: &Set, o: u32) -> i64 {
    set.status(o).await.map(|s| s.db_size()).unwrap_or(i64::MAX)
}

/// Deletes every key under `prefix` and compacts away the history.
async fn delete_and_compact(c: &mut Client, prefix: &str) {
    let opts = etcd_client::DeleteOptions::new().with_prefix();
    let r = c.delete(prefix, Some(opts)).await.unwrap();
    let rev = r.header().unwrap().revision();
    c.compact(rev, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    // bolt counts the pages the compaction freed as free only after a later write commits;
    // under NOSPACE only deletes are taken (of the keys `pad` wrote).
    for i in 0..PADS {
        tokio::time::sleep(Duration::from_millis(150)).await;
        c.delete(format!("pad/{i}"), None).await.unwrap();
    }
}

const PADS: usize = 3;

/// Small keys that `delete_and_compact` deletes after its compaction.
async fn pad(c: &mut Client) {
    for i in 0..PADS {
        c.put(format!("pad/{i}"), "p", None).await.unwrap();
    }
}

/// When pod `o`'s sidecar logged that it defragmented its member (the first time).
fn defragmented_at(set: &Set, o: u32) -> Option<String> {
    set.read_logs(o, "sidecar").lines().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        (v["message"] == "member defragmented")
            .then(|| v["timestamp"].as_str().map(String::from))?
    })
}

/// Pod `o`'s defragmentations, from its sidecar's log: when each started and ended.
fn defrag_intervals(set: &Set, o: u32) -> Vec<(SystemTime, SystemTime)> {
    let at = |v: &serde_json::Value| {
        v["timestamp"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
    };
    let mut out = Vec::new();
    let mut started = None;
    for line in set.read_logs(o, "sidecar").lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        match v["message"].as_str() {
            Some("defragmentation started") => started = at(&v),
            Some("defragmentation ended") => {
                if let (Some(s), Some(e)) = (started.take(), at(&v)) {
                    out.push((s, e));
                }
            }
            _ => {}
        }
    }
    out
}

/// Each member defragmented once, no two at the same time (the lock), the leader's
/// started after both followers' ended. An election moves the leadership and with it the
/// order; the scenario then runs again on a new set (at most three times).
async fn fragmented_members_are_defragmented_one_at_a_time_leader_last(etcd: Etcd) {
    for attempt in 1..=3 {
        if defragmented_one_at_a_time_leader_last(etcd).await {
            return;
        }
        eprintln!("attempt {attempt}: an election during the defragmentations; running again");
    }
    panic!("an election during each of three attempts: the order was never checked");
}

/// One attempt; `false` when an election made the order unprovable.
async fn defragmented_one_at_a_time_leader_last(etcd: Etcd) -> bool {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = vec!["--defrag-threshold=30%,2MiB".into()];
    set.start_all(WAIT).await.unwrap();
    let leader = set.leader().await.unwrap();
    let mut c = set.any_client().await.unwrap();
    pad(&mut c).await;
    for i in 0..40 {
        c.put(format!("big/{i:03}"), vec![b'x'; VALUE], None)
            .await
            .unwrap();
    }
    let term = set.status(leader).await.unwrap().raft_term();
    // Every member has applied the writes (a follower may lag a moment).
    until(&set, "the values fill every file", || async {
        let mut all = true;
        for o in 0..3 {
            all &= (8 << 20..i64::MAX).contains(&db_size(&set, o).await);
        }
        all
    })
    .await;
    let full = db_size(&set, 0).await;
    delete_and_compact(&mut c, "big/").await;

    until(
        &set,
        "every member defragmented, its file shrunk",
        || async {
            let mut all = true;
            for o in 0..3 {
                let freed = match set.http(o, "/metrics").await {
                    Some((_, text)) => sample(&text, "etcd_steward_defrag_last_freed_bytes"),
                    None => None,
                };
                all &= db_size(&set, o).await < full / 2
                    && defragmented_at(&set, o).is_some()
                    && freed.unwrap_or(0.0) > 4e6;
            }
            all
        },
    )
    .await;
    // Each member once; the leader after both followers.
    let mut followers = Vec::new();
    for o in 0..3 {
        if o != leader {
            followers.push(defragmented_at(&set, o).unwrap());
        }
        let (_, text) = set.http(o, "/metrics").await.unwrap();
        assert_eq!(
            sample(&text, "etcd_steward_defrag_total"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "etcd_steward_defrag_failures_total"),
            Some(0.0),
            "{text}"
        );
        let took = sample(&text, "etcd_steward_defrag_last_duration_seconds");
        assert!(
            took.is_some_and(|s| s > 0.0 && s < 60.0),
            "the last defragmentation's duration: {took:?}\n{text}"
        );
    }
    let leader_at = defragmented_at(&set, leader).unwrap();
    if set.status(leader).await.unwrap().raft_term() != term {
        set.shutdown().await;
        return false;
    }
    assert!(
        followers.iter().all(|f| *f < leader_at),
        "followers {followers:?} before the leader {leader_at}\n{}",
        set.dump()
    );
    // One at a time: no two members' defragmentations overlap, and the leader's started
    // after both followers' ended.
    let mut all: Vec<(SystemTime, SystemTime, u32)> = Vec::new();
    for o in 0..3 {
        let intervals = defrag_intervals(&set, o);
        assert_eq!(intervals.len(), 1, "pod {o}: {intervals:?}\n{}", set.dump());
        all.extend(intervals.iter().map(|(s, e)| (*s, *e, o)));
    }
    all.sort();
    for w in all.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "pods {} and {} defragmented at the same time: {all:?}\n{}",
            w[0].2,
            w[1].2,
            set.dump()
        );
    }
    assert_eq!(
        all.last().map(|l| l.2),
        Some(leader),
        "the leader started last: {all:?}"
    );
    harness::wait_for(
        std::time::Duration::from_secs(10),
        "every pod ready again after the defragmentations",
        || set.all_ready(&[0, 1, 2]),
    )
    .await;
    set.shutdown().await;
    true
}

async fn nospace_is_defragmented_and_disarmed_once_keys_are_deleted(etcd: Etcd) {
    // Fragmentation alone does not trigger: only the space alarm does.
    let mut set = with_quota(etcd, &["--defrag-threshold=0"]).await;
    let mut c = set.any_client().await.unwrap();
    pad(&mut c).await;
    fill_until_nospace(&mut c).await;
    until(&set, "/ready says NOSPACE", || async {
        set.http(0, "/ready")
            .await
            .is_some_and(|(code, body)| code == 503 && body.contains("NOSPACE"))
    })
    .await;
    delete_and_compact(&mut c, "fill/").await;
    until(&set, "the alarm is disarmed and writes resume", || async {
        let mut c = set.any_client().await.unwrap();
        c.put("after", "ok", None).await.is_ok()
    })
    .await;
    let leader = set.leader().await.unwrap();
    assert!(
        set.read_logs(leader, "sidecar")
            .contains("NOSPACE disarmed"),
        "{}",
        set.dump()
    );
    for o in 0..3 {
        assert!(
            defragmented_at(&set, o).is_some(),
            "pod {o}\n{}",
            set.dump()
        );
    }
    until(&set, "every pod ready again", || set.all_ready(&[0, 1, 2])).await;
    set.shutdown().await;
}

async fn nospace_with_data_too_large_stays_and_says_why(etcd: Etcd) {
    let mut set = with_quota(etcd, &[]).await;
    let mut c = set.any_client().await.unwrap();
    fill_until_nospace(&mut c).await;
    let leader = set.leader().await.unwrap();
    until(
        &set,
        "the leader's sidecar says what the operator must do",
        || async {
            set.read_logs(leader, "sidecar")
                .contains("defragmenting cannot free enough")
        },
    )
    .await;
    // Several ticks later still: nothing was disarmed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    match c.put("after", "no", None).await {
        Err(e) => assert!(e.to_string().contains("space"), "the alarm stays: {e}"),
        Ok(_) => panic!("the alarm was disarmed with the data still too large"),
    }
    set.shutdown().await;
}

/// Three pods whose etcd and sidecars have a 16 MiB quota, and `extra` sidecar options.
async fn with_quota(etcd: Etcd, extra: &[&str]) -> Set {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.extra_args = extra.iter().map(|a| a.to_string()).collect();
    set.extra_args
        .push(format!("--quota-backend-bytes={QUOTA}"));
    set.publish(&[0, 1, 2]).await.unwrap();
    for o in 0..3 {
        set.start_sidecar(o).unwrap();
        set.start_init_with(o, &[&format!("--quota-backend-bytes={QUOTA}")])
            .unwrap();
    }
    set.wait_up(WAIT).await.unwrap();
    set
}

/// Writes big values until etcd refuses one for lack of space.
async fn fill_until_nospace(c: &mut Client) {
    for i in 0..200 {
        if let Err(e) = c.put(format!("fill/{i:03}"), vec![b'x'; VALUE], None).await {
            let refused = e.to_string();
            assert!(refused.contains("space"), "{refused}");
            return;
        }
    }
    panic!("the quota never refused a write");
}

harness::per_etcd_version! {
    [V3_5, V3_4, V3_5Current] by scenario:
    fragmented => fragmented_members_are_defragmented_one_at_a_time_leader_last,
    nospace_disarmed => nospace_is_defragmented_and_disarmed_once_keys_are_deleted,
    nospace_too_large => nospace_with_data_too_large_stays_and_says_why,
}
