//! The sidecar's loop across ticks, on the in-memory `FakeCluster` and `FakeDns`: no root,
//! no process, no network, and a paused clock, so the stall timeout and the tick periods
//! are exact. Each test names the promise it proves.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use clap::Parser;
use http_body_util::BodyExt;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tower::ServiceExt;

use etcd_steward::config::{Cli, Command, Config};
use etcd_steward::dns::Lookup;
use etcd_steward::etcd::EtcdError;
use etcd_steward::fake::{FakeCluster, FakeDns, Op, Times};
use etcd_steward::sidecar::gather::PeerProbe;
use etcd_steward::sidecar::health::PeerApi;
use etcd_steward::sidecar::http::metrics::{encode, Format};
use etcd_steward::sidecar::http::{router, AppState};
use etcd_steward::sidecar::{Sidecar, FAST_TICK, LEARNER_TICK, TICK};
use etcd_steward::volume::journal;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Records a decision in the init journal, as `init` does.
fn record(dir: &std::path::Path, action: &str) -> TestResult {
    let entry = journal::Entry::new(0, action.parse()?, "");
    journal::append(dir, &entry)?;
    Ok(())
}

/// The peer API's answer, as the test sets it.
#[derive(Clone)]
struct Probe(Arc<Mutex<PeerApi>>);

impl Probe {
    fn set(&self, answer: PeerApi) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = answer;
    }
}

impl PeerProbe for Probe {
    async fn peer_api(&self) -> PeerApi {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn id(ordinal: u32) -> u64 {
    0xa0 + u64::from(ordinal)
}

/// A three-pod set `etcd-0..2` whose members all run, `etcd-0` leading at raft index 1000.
struct World {
    cluster: FakeCluster,
    dns: FakeDns,
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> Result<Self, Box<dyn std::error::Error>> {
        let w = World {
            cluster: FakeCluster::default(),
            dns: FakeDns::default(),
            dir: tempfile::tempdir()?,
        };
        for o in 0..5u8 {
            w.dns.answer(
                &w.config(0)?.identity.host(u32::from(o)),
                Lookup::Found(vec![IpAddr::from([10, 0, 0, o + 1])]),
            );
        }
        for o in 0..3 {
            w.add(o, false)?;
            w.cluster.set_raft_index(id(o), 1000);
        }
        w.cluster.set_leader(id(0));
        Ok(w)
    }

    /// Adds pod `ordinal`'s member to the cluster.
    fn add(&self, ordinal: u32, learner: bool) -> Result<(), Box<dyn std::error::Error>> {
        let identity = self.config(0)?.identity;
        self.cluster.add_member(
            id(ordinal),
            &identity.pod_name(ordinal),
            &identity.peer_url(ordinal),
            &identity.client_url(ordinal),
            learner,
        );
        Ok(())
    }

    /// The configuration of pod `ordinal`'s sidecar, with its own data directory.
    fn config(&self, ordinal: u32) -> Result<Config, Box<dyn std::error::Error>> {
        let data_dir = self.dir.path().join(format!("etcd-{ordinal}"));
        let name = format!("etcd-{ordinal}");
        let cli = Cli::try_parse_from([
            "etcd-steward",
            "sidecar",
            "--name",
            name.as_str(),
            "--replicas",
            "3",
            "--learner-stall-timeout",
            "30s",
            "--data-dir",
            data_dir.to_str().ok_or("path")?,
        ])?;
        let Command::Sidecar(args) = cli.command else {
            return Err("not the sidecar command".into());
        };
        Ok(args.common.validate().map_err(|e| format!("{e:?}"))?)
    }

    fn endpoint(&self, ordinal: u32) -> Result<String, Box<dyn std::error::Error>> {
        let identity = self.config(0)?.identity;
        Ok(format!(
            "{}:{}",
            identity.host(ordinal),
            identity.client_port
        ))
    }

    fn sidecar(&self, ordinal: u32) -> Result<Pod, Box<dyn std::error::Error>> {
        let cfg = self.config(ordinal)?;
        std::fs::create_dir_all(&cfg.data_dir)?;
        let probe = Probe(Arc::new(Mutex::new(PeerApi::Answered)));
        let mut registry = Registry::default();
        let sidecar = Sidecar::new(
            &cfg,
            self.dns.clone(),
            self.cluster.clone(),
            probe.clone(),
            &mut registry,
        );
        Ok(Pod {
            sidecar,
            probe,
            registry: Arc::new(registry),
            cfg,
        })
    }
}

/// One pod's sidecar, its peer-API answer and its metrics.
struct Pod {
    sidecar: Sidecar<FakeDns, FakeCluster, Probe>,
    probe: Probe,
    registry: Arc<Registry>,
    cfg: Config,
}

impl Pod {
    /// Ticks, then waits the pause the tick asked for; returns that pause.
    async fn tick(&mut self) -> Duration {
        let pause = self.sidecar.tick().await;
        tokio::time::sleep(pause).await;
        pause
    }

    /// Ticks until `d` has passed.
    async fn run_for(&mut self, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.tick().await;
        }
    }

    fn metric(&self, series: &str) -> Result<Option<f64>, Box<dyn std::error::Error>> {
        let text = encode(&self.registry, Format::OpenMetrics)?;
        Ok(harness::client::sample(&text, series))
    }
}

// ---------------------------------------------------------------------------------------
// Promotion
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_learner_is_promoted_once_the_leader_sees_it_caught_up_and_not_before() -> TestResult {
    let w = World::new()?;
    let learner = id(3);
    w.add(3, true)?;
    w.cluster.set_raft_index(learner, 500);
    let mut pod = w.sidecar(3)?;
    for _ in 0..8 {
        assert_eq!(
            pod.tick().await,
            LEARNER_TICK,
            "a learner looks every 250 ms"
        );
    }
    assert!(
        w.cluster.calls_of(Op::Promote).is_empty(),
        "at 50% of the leader's index, no promotion is asked"
    );
    w.cluster.set_raft_index(learner, 950);
    assert_eq!(pod.tick().await, FAST_TICK, "100 ms after a promotion");
    let promotions = w.cluster.calls_of(Op::Promote);
    assert_eq!(promotions.len(), 1, "{promotions:?}");
    assert_eq!(
        promotions[0].endpoint,
        w.endpoint(0)?,
        "asked of the leader, never of the learner itself"
    );
    assert_eq!(w.cluster.member(learner).map(|m| m.is_learner), Some(false));
    assert_eq!(pod.metric("etcd_steward_promotions_total")?, Some(1.0));
    // A voter now: ready at once, and never promoted again.
    assert_eq!(pod.tick().await, TICK);
    assert!(pod.sidecar.health().borrow().ready.ok);
    pod.run_for(Duration::from_secs(5)).await;
    assert_eq!(w.cluster.calls_of(Op::Promote).len(), 1);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_joining_learner_is_promoted_before_it_serves_clients() -> TestResult {
    let w = World::new()?;
    let learner = id(3);
    w.add(3, true)?;
    // Its etcd runs (the peer API answers) but applies the leader's log: no client API yet.
    w.cluster.set_up(learner, false);
    w.cluster.set_raft_index(learner, 100);
    let mut pod = w.sidecar(3)?;
    record(&pod.cfg.data_dir, "resume")?;
    assert_eq!(pod.tick().await, FAST_TICK);
    let asked = w.cluster.calls_of(Op::Promote);
    assert_eq!(
        asked.len(),
        1,
        "asked at once: etcd judges whether it caught up"
    );
    assert_ne!(asked[0].endpoint, w.endpoint(3)?, "not of the learner");
    assert_eq!(
        w.cluster.member(learner).map(|m| m.is_learner),
        Some(true),
        "refused while the learner is behind"
    );
    assert_eq!(pod.metric("etcd_steward_promotions_total")?, Some(0.0));
    w.cluster.set_raft_index(learner, 1000);
    pod.tick().await;
    assert_eq!(w.cluster.member(learner).map(|m| m.is_learner), Some(false));
    assert_eq!(pod.metric("etcd_steward_promotions_total")?, Some(1.0));
    assert!(
        !pod.sidecar.health().borrow().ready.ok,
        "promoted, but not ready before it serves"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_voter_restarted_without_quorum_asks_no_promotion() -> TestResult {
    let w = World::new()?;
    w.cluster.set_up(id(1), false);
    let mut pod = w.sidecar(1)?;
    record(&pod.cfg.data_dir, "restart")?;
    pod.run_for(Duration::from_secs(3)).await;
    assert!(w.cluster.calls_of(Op::Promote).is_empty());
    assert!(
        w.cluster.calls_of(Op::Members).is_empty(),
        "nor asks the peers for their member list"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_promotion_that_fails_is_asked_again_on_the_next_tick() -> TestResult {
    let w = World::new()?;
    let learner = id(3);
    w.add(3, true)?;
    w.cluster.set_raft_index(learner, 1000);
    w.cluster.fail(
        &w.endpoint(0)?,
        Op::Promote,
        EtcdError::UnhealthyCluster,
        Times::N(2),
    );
    let mut pod = w.sidecar(3)?;
    assert_eq!(pod.tick().await, LEARNER_TICK);
    assert_eq!(pod.tick().await, LEARNER_TICK);
    assert_eq!(pod.tick().await, FAST_TICK);
    assert_eq!(w.cluster.calls_of(Op::Promote).len(), 3);
    assert_eq!(pod.metric("etcd_steward_promotions_total")?, Some(1.0));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Stalled learners
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_stalled_learner_is_removed_by_the_leaders_sidecar_after_the_stall_timeout() -> TestResult
{
    let w = World::new()?;
    let dead = id(3);
    w.add(3, true)?;
    w.cluster.set_up(dead, false);
    let mut leader = w.sidecar(0)?;
    let start = Instant::now();
    leader.run_for(Duration::from_secs(29)).await;
    assert!(
        w.cluster.calls_of(Op::Remove).is_empty(),
        "not before the 30 s stall timeout"
    );
    leader.run_for(Duration::from_secs(2)).await;
    let removals = w.cluster.calls_of(Op::Remove);
    assert_eq!(removals.len(), 1, "{removals:?}");
    assert_eq!(removals[0].endpoint, w.endpoint(0)?, "through the leader");
    assert!(start.elapsed() >= Duration::from_secs(30));
    assert_eq!(w.cluster.member(dead), None);
    assert_eq!(
        leader.metric("etcd_steward_learners_removed_total")?,
        Some(1.0)
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_followers_sidecar_never_removes_a_learner() -> TestResult {
    let w = World::new()?;
    w.add(3, true)?;
    w.cluster.set_up(id(3), false);
    let mut follower = w.sidecar(2)?;
    follower.run_for(Duration::from_secs(120)).await;
    assert!(w.cluster.calls_of(Op::Remove).is_empty());
    assert!(w.cluster.member(id(3)).is_some());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_learner_that_makes_progress_is_never_removed() -> TestResult {
    let w = World::new()?;
    let slow = id(3);
    w.add(3, true)?;
    w.cluster.set_raft_index(id(0), 1_000_000);
    let mut leader = w.sidecar(0)?;
    let mut index = 0;
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        index += 10;
        w.cluster.set_raft_index(slow, index);
        leader.tick().await;
    }
    assert!(w.cluster.calls_of(Op::Remove).is_empty());
    assert!(w.cluster.member(slow).is_some());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_times_a_stalled_learner_afresh() -> TestResult {
    let w = World::new()?;
    w.add(3, true)?;
    w.cluster.set_up(id(3), false);
    let mut pod = w.sidecar(1)?;
    pod.run_for(Duration::from_secs(20)).await;
    // Pod 1 leads from now on: its 30 s start now, not when the learner was first seen.
    w.cluster.set_leader(id(1));
    pod.run_for(Duration::from_secs(29)).await;
    assert!(w.cluster.calls_of(Op::Remove).is_empty());
    pod.run_for(Duration::from_secs(2)).await;
    assert_eq!(w.cluster.calls_of(Op::Remove).len(), 1);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Health across ticks, and the tick periods
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn liveness_never_depends_on_quorum_across_ticks() -> TestResult {
    let w = World::new()?;
    let mut pod = w.sidecar(1)?;
    let health = pod.sidecar.health();
    assert_eq!(pod.tick().await, TICK, "a ready voter looks once a second");
    assert!(health.borrow().live.ok && health.borrow().ready.ok);

    // Quorum lost: the other two members are down, no leader.
    w.cluster.set_up(id(0), false);
    w.cluster.set_up(id(2), false);
    w.cluster.set_leader(0);
    assert_eq!(pod.tick().await, FAST_TICK, "not ready: look every 100 ms");
    assert!(health.borrow().live.ok, "{:?}", health.borrow().live);
    assert!(!health.borrow().ready.ok);
    assert!(health.borrow().ready.reason.contains("no leader"));

    // The local etcd restarted without quorum: no client API, its peer API answers.
    w.cluster.set_up(id(1), false);
    pod.tick().await;
    assert!(health.borrow().live.ok, "{:?}", health.borrow().live);
    assert_eq!(pod.metric("etcd_steward_etcd_running")?, Some(1.0));

    // init is still deciding: nothing listens.
    pod.probe.set(PeerApi::NotListening);
    pod.tick().await;
    assert!(health.borrow().live.ok, "{:?}", health.borrow().live);
    assert_eq!(pod.metric("etcd_steward_etcd_running")?, Some(0.0));

    // etcd accepts but never answers: the only case a restart cures.
    pod.probe.set(PeerApi::NoAnswer("timed out".into()));
    pod.tick().await;
    assert!(!health.borrow().live.ok);

    // Everything back.
    for o in 0..3 {
        w.cluster.set_up(id(o), true);
    }
    w.cluster.set_leader(id(0));
    pod.probe.set(PeerApi::Answered);
    pod.tick().await;
    assert!(health.borrow().live.ok && health.borrow().ready.ok);
    assert_eq!(pod.metric("etcd_steward_ready")?, Some(1.0));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_local_etcd_slower_than_500_ms_counts_as_not_answering_for_that_round() -> TestResult {
    let w = World::new()?;
    let mut pod = w.sidecar(1)?;
    w.cluster
        .delay(&w.endpoint(1)?, Op::Status, Duration::from_secs(10));
    w.cluster.delay(
        &w.endpoint(1)?,
        Op::SerializableRead,
        Duration::from_secs(10),
    );
    let start = Instant::now();
    let pause = pod.sidecar.tick().await;
    assert!(
        start.elapsed() < Duration::from_millis(600),
        "the round ended after {:?}",
        start.elapsed()
    );
    assert_eq!(pause, FAST_TICK);
    let health = pod.sidecar.health();
    assert!(!health.borrow().ready.ok);
    assert!(
        health.borrow().ready.reason.contains("500ms"),
        "{}",
        health.borrow().ready.reason
    );
    assert!(health.borrow().live.ok, "its peer API answers");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_tick_periods_follow_the_members_state() -> TestResult {
    let w = World::new()?;
    let mut pod = w.sidecar(1)?;
    assert_eq!(pod.tick().await, TICK, "ready: 1 s");
    w.cluster.set_errors(id(1), &["NOSPACE"]);
    assert_eq!(pod.tick().await, FAST_TICK, "not ready: 100 ms");
    w.cluster.set_errors(id(1), &[]);
    w.cluster.set_up(id(1), false);
    assert_eq!(pod.tick().await, FAST_TICK, "etcd not answering: 100 ms");
    w.cluster.set_up(id(1), true);
    assert_eq!(pod.tick().await, TICK);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_rescheduled_peer_is_reached_at_its_new_address() -> TestResult {
    let w = World::new()?;
    w.add(3, true)?;
    w.cluster.set_raft_index(id(3), 100);
    let mut pod = w.sidecar(3)?;
    pod.tick().await;
    let host0 = pod.cfg.identity.host(0);
    let opened = |w: &World| -> Result<usize, Box<dyn std::error::Error>> {
        let endpoint = w.endpoint(0)?;
        Ok(w.cluster
            .calls_of(Op::Connect)
            .iter()
            .filter(|c| c.endpoint == endpoint)
            .count())
    };
    pod.tick().await;
    assert_eq!(opened(&w)?, 1, "the connection is kept across ticks");
    w.dns
        .answer(&host0, Lookup::Found(vec![IpAddr::from([10, 9, 9, 9])]));
    pod.tick().await;
    assert_eq!(opened(&w)?, 2, "reopened once the name moved");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// /metrics as a scraper sees it
// ---------------------------------------------------------------------------------------

/// GETs `/metrics` from the pod's router with this `Accept` header.
async fn scrape(pod: &Pod, accept: &str) -> Result<(String, String), Box<dyn std::error::Error>> {
    let state = AppState::new(
        pod.sidecar.health(),
        pod.registry.clone(),
        &pod.cfg.identity.name(),
        &pod.cfg.data_dir,
    );
    let req = Request::get("/metrics")
        .header(header::ACCEPT, accept)
        .body(Body::empty())?;
    let resp = router(state).oneshot(req).await?;
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = resp.into_body().collect().await?.to_bytes().to_vec();
    Ok((content_type, String::from_utf8(body)?))
}

/// `promtool check metrics` on `text`: its complaints, or none.
async fn promtool(text: &str) -> Result<String, Box<dyn std::error::Error>> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool: {e} (scripts/install-test-deps.sh installs it)"))?;
    let mut stdin = child.stdin.take().ok_or("promtool stdin")?;
    stdin.write_all(text.as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    let complaints = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(complaints)
    } else {
        Err(format!("promtool check metrics failed: {complaints}\n{text}").into())
    }
}

#[tokio::test]
async fn a_sidecars_metrics_pass_promtool() -> TestResult {
    let w = World::new()?;
    w.add(3, true)?;
    w.cluster.set_raft_index(id(3), 1000);
    let mut pod = w.sidecar(3)?;
    for action in ["join", "resume"] {
        record(&pod.cfg.data_dir, action)?;
    }
    pod.sidecar.tick().await;
    pod.sidecar.tick().await;
    assert_eq!(pod.metric("etcd_steward_promotions_total")?, Some(1.0));
    // Prometheus asks for OpenMetrics, and gets it.
    let (content_type, openmetrics) = scrape(
        &pod,
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    )
    .await?;
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    // promtool reads the Prometheus text format (a counter family named like its samples,
    // which OpenMetrics names without `_total`): asked for plain text, the sidecar serves it.
    let (content_type, text) = scrape(&pod, "text/plain").await?;
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    for series in [
        "etcd_steward_promotions_total 1",
        "etcd_steward_etcd_running 1",
        "etcd_steward_init_decisions_total{action=\"resume\"} 1",
        "etcd_steward_raft_index_lag 0",
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
    }
    let complaints = promtool(&text).await?;
    assert!(complaints.trim().is_empty(), "{complaints}");
    Ok(())
}
