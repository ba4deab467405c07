//! Kubernetes Events through the `kube` client against the fake API server
//! (`harness::fake_kube`), which takes `events.k8s.io/v1` Events as the real one does (its
//! validation of a new Event, a JSON merge patch of the series) and keeps them. The fake is
//! here for what a real server cannot be made to do: answer 500 and then take the Event
//! (the retry), or hang on every call (posting never waits); and for a series of 600
//! repeats at no cost. The same calls against a real API server (the project's test API
//! server: its validation, authorization, 403 and 409, resource versions) are
//! tests/kube_calls.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use etcd_steward::kube_api::events::{ApiEvents, Events, Reason, Regarding, CONTROLLER};
use etcd_steward::kube_api::KubeAccess;
use harness::fake_kube::FakeKube;
use harness::wait_for;
use prometheus_client::metrics::counter::Counter;

async fn api() -> FakeKube {
    FakeKube::start("127.0.0.1:0".parse().unwrap(), "db", "etcd")
        .await
        .unwrap()
}

fn events_to(api: &FakeKube, failed: &Counter) -> Events {
    let access = KubeAccess {
        url: format!("http://{}", api.addr()),
        token_file: "/nonexistent/token".into(),
        ca_file: "/nonexistent/ca.crt".into(),
        namespace: "db".into(),
        statefulset: "etcd".into(),
    };
    let regarding = Regarding {
        namespace: "db".into(),
        pod: "etcd-1".into(),
        uid: Some("8d1c2a4e-0000-4000-8000-000000000001".into()),
    };
    Events::start(ApiEvents::new(&access).unwrap(), regarding, failed.clone())
}

#[tokio::test]
async fn an_act_is_an_event_on_the_pod_that_acted_with_its_reason_and_note() {
    let api = api().await;
    let failed = Counter::default();
    let events = events_to(&api, &failed);
    events.post(
        Reason::MemberReplaced,
        "member 8e9e05c52164694d of etcd-1 replaced: its volume was empty",
    );
    events.post(Reason::Promoted, "etcd-1's learner promoted to voter");
    wait_for(Duration::from_secs(10), "two Events", || async {
        api.events().len() == 2
    })
    .await;
    let got = api.events();
    let replaced = &got[0];
    assert_eq!(replaced["apiVersion"], "events.k8s.io/v1");
    assert_eq!(replaced["reason"], "MemberReplaced");
    assert_eq!(replaced["action"], "MemberReplaced");
    assert_eq!(replaced["type"], "Warning");
    assert_eq!(
        replaced["note"],
        "member 8e9e05c52164694d of etcd-1 replaced: its volume was empty"
    );
    assert_eq!(replaced["reportingController"], CONTROLLER);
    assert_eq!(replaced["reportingInstance"], "etcd-1");
    assert_eq!(replaced["regarding"]["kind"], "Pod");
    assert_eq!(replaced["regarding"]["name"], "etcd-1");
    assert_eq!(replaced["regarding"]["namespace"], "db");
    assert_eq!(
        replaced["regarding"]["uid"],
        "8d1c2a4e-0000-4000-8000-000000000001"
    );
    assert!(replaced["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("etcd-1."));
    assert_eq!(got[1]["reason"], "Promoted");
    assert_eq!(got[1]["type"], "Normal");
    assert_eq!(failed.get(), 0);
}

/// Six hundred repeats of one wait are one Event whose series counts them all (sent at
/// most every heartbeat, and once more when the poster stops).
#[tokio::test]
async fn a_repeated_wait_is_one_event_whose_series_counts_every_repeat() {
    let api = api().await;
    let failed = Counter::default();
    let events = events_to(&api, &failed);
    for _ in 0..600 {
        events.post(
            Reason::WaitingTooLong,
            "waiting over 5 minutes: forming a new cluster: waiting for etcd-2 to prepare",
        );
        tokio::task::yield_now().await;
    }
    drop(events);
    wait_for(
        Duration::from_secs(10),
        "the series to count 600",
        || async {
            api.events()
                .first()
                .is_some_and(|e| e["series"]["count"] == 600)
        },
    )
    .await;
    let got = api.events();
    assert_eq!(got.len(), 1, "one Event: {got:#?}");
    assert!(got[0]["series"]["lastObservedTime"].is_string());
    assert_eq!(failed.get(), 0);
}

/// An API server that refuses Events (no RBAC) or does not answer at all delays no post:
/// a thousand posts take milliseconds, and what was not posted is counted.
#[tokio::test]
async fn an_api_that_refuses_or_hangs_delays_no_post_and_is_counted() {
    let api = api().await;
    api.refuse_events(Some(403));
    let failed = Counter::default();
    let events = events_to(&api, &failed);
    let started = Instant::now();
    for i in 0..1000 {
        events.post(Reason::DataSetAside, format!("data set aside {i}"));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_millis(200), "posting took {took:?}");
    wait_for(Duration::from_secs(20), "refusals counted", || async {
        failed.get() >= 1000
    })
    .await;
    assert!(api.events().is_empty());

    let silent = api_silent().await;
    let failed = Counter::default();
    let events = events_to(&silent, &failed);
    let started = Instant::now();
    for i in 0..1000 {
        events.post(Reason::DataSetAside, format!("data set aside {i}"));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_millis(200), "posting took {took:?}");
    // The queue holds 256 while the first call hangs: the rest are dropped and counted.
    assert!(failed.get() >= 1000 - 257, "counted: {}", failed.get());
}

/// An act posted while the API fails (its etcd being the one restored, a 500, a restart)
/// is not lost: the Event is created under its name once the API answers again, and it is
/// created once.
#[tokio::test]
async fn an_event_the_api_did_not_take_is_created_once_the_api_answers() {
    let api = api().await;
    api.refuse_events(Some(500));
    let failed = Counter::default();
    let events = events_to(&api, &failed);
    events.post(
        Reason::RestoredFromBackup,
        "restored from snapshot etcd-1-000042 while the API was down",
    );
    wait_for(Duration::from_secs(10), "the first refusal", || async {
        failed.get() >= 1
    })
    .await;
    assert!(api.events().is_empty());
    // Still refused at the first retry (after 1 s): tried again later, not given up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(failed.get() >= 2, "retried while refused: {}", failed.get());
    api.refuse_events(None);
    wait_for(
        Duration::from_secs(15),
        "the Event created after the API came back",
        || async { api.events().len() == 1 },
    )
    .await;
    // Nothing more is queued: it stays one Event, never a second copy.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = api.events();
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0]["reason"], "RestoredFromBackup");
    assert_eq!(
        got[0]["note"],
        "restored from snapshot etcd-1-000042 while the API was down"
    );
}

async fn api_silent() -> FakeKube {
    let api = api().await;
    api.set_silent(true);
    api
}
