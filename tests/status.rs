//! `etcd-steward status` against real etcd (3.5.1 and 3.4.23) on loopback pods: the screen
//! and its JSON name every member, its role, size and version, each pod's last decision,
//! and what is down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use harness::loopback::Set;
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");

async fn status(set: &Set, o: u32, extra: &[&str]) -> String {
    let args: Vec<&str> = std::iter::once("status")
        .chain(extra.iter().copied())
        .collect();
    let out = set.steward(o, &args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn status_shows_every_member_and_what_is_down(etcd: Etcd) {
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    set.start_all(Duration::from_secs(60)).await.unwrap();
    set.put_keys("k", 50).await.unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&status(&set, 1, &["-o", "json"]).await).unwrap();
    let cluster = format!("{:x}", set.cluster_id(0).await.unwrap());
    assert_eq!(
        json["cluster_id"].as_str(),
        Some(cluster.as_str()),
        "{json}"
    );
    assert_eq!(json["voters"], 3, "{json}");
    let pods = json["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 3);
    let mut leaders = 0;
    for (o, p) in pods.iter().enumerate() {
        let id = format!("{:x}", set.member_id(o as u32).await.unwrap());
        assert_eq!(p["member_id"].as_str(), Some(id.as_str()), "{p}");
        leaders += usize::from(p["role"] == "leader");
        assert!(
            ["leader", "follower"].contains(&p["role"].as_str().unwrap()),
            "{p}"
        );
        assert!(p["db_size"].as_i64().unwrap() > 0, "{p}");
        assert!(p["version"].as_str().unwrap().starts_with("3."), "{p}");
        assert_eq!(p["volume"], "data", "{p}");
        // A formation member starts as `bootstrap`, or `resume` when it found the cluster
        // already listing it.
        let action = p["last_decision"]["action"].as_str().unwrap_or_default();
        assert!(["bootstrap", "resume"].contains(&action), "{p}");
    }
    assert_eq!(leaders, 1);
    let text = status(&set, 0, &[]).await;
    assert!(
        text.starts_with(&format!("cluster {cluster}  leader etcd-")),
        "{text}"
    );

    set.kill(2).await.unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&status(&set, 0, &["-o", "json"]).await).unwrap();
    let down = &json["pods"][2];
    assert!(down["member_id"].is_null(), "{json}");
    assert!(
        !down["volume"].as_str().unwrap().is_empty() && down["volume"] != "data",
        "{json}"
    );
    let listed = json["other_members"].as_array().unwrap();
    assert_eq!(
        listed.len(),
        1,
        "the cluster lists etcd-2's member, no pod answers: {json}"
    );
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_3_5() {
    status_shows_every_member_and_what_is_down(Etcd::V3_5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_3_4() {
    status_shows_every_member_and_what_is_down(Etcd::V3_4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_3_5_current() {
    status_shows_every_member_and_what_is_down(Etcd::V3_5Current).await;
}
