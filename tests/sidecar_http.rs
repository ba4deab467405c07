//! The sidecar's HTTP surface, driven through `tower::ServiceExt::oneshot` on the axum
//! router: no socket, no etcd. Each test names what a probe, a scraper or a peer sees.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::watch;
use tower::ServiceExt;

use etcd_steward::etcd::MemberStatus;
use etcd_steward::report::{parse_report, Formation, PeerReport, WalIdentity};
use etcd_steward::sidecar::gather::Journal;
use etcd_steward::sidecar::health::{assess, Health, LocalObservation, PeerApi, Role};
use etcd_steward::sidecar::http::metrics::{encode, Format, HealthMetrics, InitMetrics};
use etcd_steward::sidecar::http::{peer_router, router, AppState};
use etcd_steward::sidecar::plan::evict::Evict;
use etcd_steward::sidecar::plan::promote::Promote;
use etcd_steward::sidecar::plan::{Outcome, Planner, Step, Why};
use etcd_steward::volume::wal::frame;
use etcd_steward::volume::{journal, marker};
use prometheus_client::registry::Registry;

/// Both surfaces in one router, for tests that ask the probes and the report alike (in the
/// sidecar they are two ports: the probe port serves no report).
fn both_ports(state: AppState) -> axum::Router {
    router(state.clone()).merge(peer_router(state))
}

const POD: &str = "etcd-1";
const ME: u64 = 0xa1;
const LEADER: u64 = 0xa0;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Records a decision in the init journal, as `init` does.
fn record(dir: &std::path::Path, action: &str) -> TestResult {
    let entry = journal::Entry::new(0, action.parse()?, "");
    journal::append(dir, &entry)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Observations
// ---------------------------------------------------------------------------------------

fn status() -> MemberStatus {
    MemberStatus {
        member_id: ME,
        cluster_id: 0xc1,
        leader: LEADER,
        raft_index: 95,
        raft_term: 3,
        is_learner: false,
        errors: vec![],
        ..Default::default()
    }
}

/// A voter that sees a leader and whose linearizable read succeeded.
fn serving() -> LocalObservation {
    LocalObservation {
        serializable: Ok(()),
        peer_api: None,
        status: Ok(status()),
        linearizable: Some(Ok(())),
        leader_index: Some(100),
    }
}

/// The client API did not answer; the sidecar then asked the peer API.
fn client_api_down(peer_api: PeerApi) -> LocalObservation {
    LocalObservation {
        serializable: Err("context deadline exceeded".into()),
        peer_api: Some(peer_api),
        status: Err("context deadline exceeded".into()),
        linearizable: None,
        leader_index: None,
    }
}

fn with_status(f: impl FnOnce(&mut MemberStatus)) -> LocalObservation {
    let mut s = status();
    f(&mut s);
    LocalObservation {
        status: Ok(s),
        ..serving()
    }
}

/// The state a handler reads when it needs no metrics.
fn bare_state(data_dir: &Path) -> AppState {
    let (_tx, rx) = watch::channel(Health::starting());
    AppState::new(rx, Arc::new(Registry::default()), POD, data_dir)
}

// ---------------------------------------------------------------------------------------
// The router, and one request through it
// ---------------------------------------------------------------------------------------

struct Sidecar {
    tx: watch::Sender<Health>,
    health_metrics: HealthMetrics,
    init_metrics: InitMetrics,
    promote: Promote,
    evict: Evict,
    state: AppState,
    /// Kept so the data directory lives as long as the test.
    _dir: tempfile::TempDir,
}

impl Sidecar {
    /// The sidecar's metrics registered as its loop registers them, `health` published.
    fn new(health: Health) -> Result<Self, std::io::Error> {
        let dir = tempfile::tempdir()?;
        let mut registry = Registry::default();
        let promote = Promote::new(&mut registry);
        let evict = Evict::new(std::time::Duration::from_secs(300), &mut registry);
        let health_metrics = HealthMetrics::register(&mut registry);
        let init_metrics = InitMetrics::register(&mut registry);
        let (tx, rx) = watch::channel(Health::starting());
        let state = AppState::new(rx, Arc::new(registry), POD, dir.path());
        let s = Sidecar {
            tx,
            health_metrics,
            init_metrics,
            promote,
            evict,
            state,
            _dir: dir,
        };
        s.publish(health);
        Ok(s)
    }

    fn observing(o: &LocalObservation) -> Result<Self, std::io::Error> {
        Self::new(assess(o))
    }

    /// What the loop does with a verdict.
    fn publish(&self, health: Health) {
        self.health_metrics.set(&health);
        self.tx.send_replace(health);
    }

    /// What the loop does with the init journal it read.
    fn read_journal(&self) {
        let mut journal = Journal::new(self.data_dir());
        self.init_metrics.set(&journal.read().counts);
    }

    fn data_dir(&self) -> &Path {
        &self.state.data_dir
    }

    async fn call(&self, method: Method, path: &str) -> Result<Answer, Box<dyn std::error::Error>> {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())?;
        let resp = both_ports(self.state.clone()).oneshot(req).await?;
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = resp.into_body().collect().await?.to_bytes().to_vec();
        Ok(Answer {
            status,
            content_type,
            body,
        })
    }

    async fn get(&self, path: &str) -> Result<Answer, Box<dyn std::error::Error>> {
        self.call(Method::GET, path).await
    }
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[track_caller]
fn assert_answer(a: &Answer, status: StatusCode, needle: &str) {
    assert_eq!(a.status, status, "body: {}", a.text());
    assert!(
        a.text().contains(needle),
        "body should mention {needle:?}: {}",
        a.text()
    );
}

// ---------------------------------------------------------------------------------------
// /healthz: liveness never depends on quorum or on a peer
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn healthz_is_ok_when_serializable_reads_work() -> TestResult {
    let s = Sidecar::observing(&serving())?;
    let a = s.get("/healthz").await?;
    assert_answer(&a, StatusCode::OK, "serializable reads");
    assert!(
        a.content_type.starts_with("text/plain"),
        "{}",
        a.content_type
    );
    Ok(())
}

#[tokio::test]
async fn healthz_is_ok_for_a_member_waiting_for_quorum_whose_peer_api_answers() -> TestResult {
    // Restarting the pod would not bring quorum back; it would only lose the member.
    let s = Sidecar::observing(&client_api_down(PeerApi::Answered))?;
    assert_answer(
        &s.get("/healthz").await?,
        StatusCode::OK,
        "peer API answers",
    );
    assert_eq!(
        s.get("/ready").await?.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    Ok(())
}

#[tokio::test]
async fn healthz_is_ok_while_etcd_is_not_listening_yet() -> TestResult {
    // init may still be deciding (waiting for peers): killing the pod would not help.
    let s = Sidecar::observing(&client_api_down(PeerApi::NotListening))?;
    assert_answer(&s.get("/healthz").await?, StatusCode::OK, "not running yet");
    Ok(())
}

#[tokio::test]
async fn healthz_fails_when_the_peer_api_accepts_but_never_answers() -> TestResult {
    let s = Sidecar::observing(&client_api_down(PeerApi::NoAnswer("read timed out".into())))?;
    let a = s.get("/healthz").await?;
    assert_answer(&a, StatusCode::SERVICE_UNAVAILABLE, "does not answer");
    assert!(
        a.text().contains("context deadline exceeded"),
        "{}",
        a.text()
    );
    assert!(a.text().contains("read timed out"), "{}", a.text());
    Ok(())
}

#[tokio::test]
async fn healthz_fails_when_the_client_api_fails_and_the_peer_api_was_not_asked() -> TestResult {
    let o = LocalObservation {
        peer_api: None,
        ..client_api_down(PeerApi::Answered)
    };
    let s = Sidecar::observing(&o)?;
    assert_answer(
        &s.get("/healthz").await?,
        StatusCode::SERVICE_UNAVAILABLE,
        "context deadline exceeded",
    );
    Ok(())
}

#[tokio::test]
async fn before_the_first_observation_the_pod_is_live_but_not_ready() -> TestResult {
    let s = Sidecar::new(Health::starting())?;
    assert_answer(
        &s.get("/healthz").await?,
        StatusCode::OK,
        "no observation yet",
    );
    assert_answer(
        &s.get("/ready").await?,
        StatusCode::SERVICE_UNAVAILABLE,
        "no observation yet",
    );
    Ok(())
}

#[tokio::test]
async fn liveness_ignores_every_readiness_failure() -> TestResult {
    // Learner, no leader, alarm, failed quorum read: none of them is cured by a restart.
    let cases = [
        ("learner", with_status(|s| s.is_learner = true)),
        ("no leader", with_status(|s| s.leader = 0)),
        ("alarm", with_status(|s| s.errors = vec!["NOSPACE".into()])),
        (
            "linearizable read failed",
            LocalObservation {
                linearizable: Some(Err("timeout".into())),
                ..serving()
            },
        ),
    ];
    for (case, o) in cases {
        let s = Sidecar::observing(&o)?;
        assert_eq!(s.get("/healthz").await?.status, StatusCode::OK, "{case}");
        assert_eq!(
            s.get("/ready").await?.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{case}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// /ready: only a voter with a leader whose linearizable read succeeded; the body says why
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn ready_for_a_voter_with_a_leader_and_a_linearizable_read() -> TestResult {
    let s = Sidecar::observing(&serving())?;
    let a = s.get("/ready").await?;
    assert_answer(&a, StatusCode::OK, "voter a1 with leader a0");
    assert!(
        a.text().contains("linearizable read succeeded"),
        "{}",
        a.text()
    );
    Ok(())
}

#[tokio::test]
async fn not_ready_as_a_learner() -> TestResult {
    let s = Sidecar::observing(&with_status(|s| s.is_learner = true))?;
    let a = s.get("/ready").await?;
    assert_answer(&a, StatusCode::SERVICE_UNAVAILABLE, "a1 is a learner");
    assert!(a.text().contains("5 behind the leader"), "{}", a.text());
    Ok(())
}

#[tokio::test]
async fn not_ready_without_a_leader() -> TestResult {
    let s = Sidecar::observing(&with_status(|s| s.leader = 0))?;
    assert_answer(
        &s.get("/ready").await?,
        StatusCode::SERVICE_UNAVAILABLE,
        "sees no leader",
    );
    Ok(())
}

#[tokio::test]
async fn not_ready_with_an_active_alarm() -> TestResult {
    let s = Sidecar::observing(&with_status(|s| {
        s.errors = vec!["memberID:161 alarm:NOSPACE".into()]
    }))?;
    assert_answer(
        &s.get("/ready").await?,
        StatusCode::SERVICE_UNAVAILABLE,
        "alarm active: memberID:161 alarm:NOSPACE",
    );
    Ok(())
}

#[tokio::test]
async fn not_ready_when_the_linearizable_read_fails() -> TestResult {
    let s = Sidecar::observing(&LocalObservation {
        linearizable: Some(Err("etcdserver: request timed out".into())),
        ..serving()
    })?;
    assert_answer(
        &s.get("/ready").await?,
        StatusCode::SERVICE_UNAVAILABLE,
        "linearizable read through this member failed: etcdserver: request timed out",
    );
    Ok(())
}

#[tokio::test]
async fn not_ready_when_the_linearizable_read_was_not_attempted() -> TestResult {
    let s = Sidecar::observing(&LocalObservation {
        linearizable: None,
        ..serving()
    })?;
    assert_answer(
        &s.get("/ready").await?,
        StatusCode::SERVICE_UNAVAILABLE,
        "not attempted",
    );
    Ok(())
}

#[tokio::test]
async fn not_ready_when_the_status_is_unavailable() -> TestResult {
    let s = Sidecar::observing(&LocalObservation {
        status: Err("connection refused".into()),
        ..serving()
    })?;
    assert_answer(
        &s.get("/ready").await?,
        StatusCode::SERVICE_UNAVAILABLE,
        "status unavailable: connection refused",
    );
    Ok(())
}

#[tokio::test]
async fn an_alarm_fails_readiness_even_when_the_linearizable_read_succeeds() -> TestResult {
    let s = Sidecar::observing(&with_status(|s| s.errors = vec!["CORRUPT".into()]))?;
    assert_answer(
        &s.get("/ready").await?,
        StatusCode::SERVICE_UNAVAILABLE,
        "CORRUPT",
    );
    Ok(())
}

#[tokio::test]
async fn probes_serve_the_latest_assessment() -> TestResult {
    let s = Sidecar::observing(&with_status(|s| s.is_learner = true))?;
    assert_eq!(
        s.get("/ready").await?.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    s.publish(assess(&serving()));
    assert_eq!(s.get("/ready").await?.status, StatusCode::OK);
    s.publish(assess(&with_status(|s| s.leader = 0)));
    assert_answer(
        &s.get("/ready").await?,
        StatusCode::SERVICE_UNAVAILABLE,
        "no leader",
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// assess: role, leader and lag
// ---------------------------------------------------------------------------------------

#[test]
fn assess_reports_role_leader_and_lag_of_a_follower() {
    let h = assess(&serving());
    assert_eq!(h.role, Role::Voter);
    assert!(h.leader_present);
    assert_eq!(h.raft_index_lag, Some(5));
}

#[test]
fn the_leader_itself_has_no_lag() {
    let h = assess(&LocalObservation {
        leader_index: None,
        ..with_status(|s| s.leader = ME)
    });
    assert_eq!(h.raft_index_lag, Some(0));
    assert!(h.ready.ok, "{}", h.ready.reason);
}

#[test]
fn a_member_ahead_of_the_stale_leader_index_has_zero_lag_not_an_overflow() {
    let h = assess(&LocalObservation {
        leader_index: Some(90),
        ..serving()
    });
    assert_eq!(h.raft_index_lag, Some(0));
}

#[test]
fn without_a_status_the_role_is_unknown_and_no_leader_is_claimed() {
    let h = assess(&client_api_down(PeerApi::Answered));
    assert_eq!(h.role, Role::Unknown);
    assert!(!h.leader_present);
    assert_eq!(h.raft_index_lag, None);
}

// ---------------------------------------------------------------------------------------
// /metrics: OpenMetrics text through prometheus-client
// ---------------------------------------------------------------------------------------

/// One scrape's samples by series, after checking what a scraper relies on: every sample
/// belongs to a family declared by `# HELP` and `# TYPE` lines before it, a counter family's
/// samples end in `_total`, values are numbers, and no series appears twice. With
/// `openmetrics`, a counter family is named without `_total` and the text ends in `# EOF`;
/// without, it is the Prometheus 0.0.4 text, where the family has its samples' name.
fn parse_exposition(text: &str, openmetrics: bool) -> Result<BTreeMap<String, f64>, String> {
    let mut help = BTreeSet::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let mut lines: Vec<&str> = text.lines().collect();
    if openmetrics && lines.pop() != Some("# EOF") {
        return Err("OpenMetrics text must end in # EOF".into());
    }
    for line in lines {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').ok_or(format!("bad HELP: {line}"))?;
            if text.trim().is_empty() || !help.insert(name.to_string()) {
                return Err(format!("empty or repeated HELP: {line}"));
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or(format!("bad TYPE: {line}"))?;
            if !matches!(kind, "gauge" | "counter") {
                return Err(format!("unexpected type: {line}"));
            }
            if kind == "counter" && name.ends_with("_total") == openmetrics {
                return Err(format!("counter family misnamed for this format: {line}"));
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(format!("repeated TYPE: {line}"));
            }
        } else if line.trim().is_empty() || line.starts_with('#') {
            return Err(format!("unexpected line: {line:?}"));
        } else {
            let (series, value) = line.rsplit_once(' ').ok_or(format!("bad sample: {line}"))?;
            let name = series.split('{').next().unwrap_or_default();
            let family = match name.strip_suffix("_total") {
                Some(f) if openmetrics && types.get(f).is_some_and(|k| k == "counter") => f,
                _ => name,
            };
            if !types.contains_key(family) || !help.contains(family) {
                return Err(format!("sample before its HELP/TYPE: {line}"));
            }
            if types[family] == "counter" && !name.ends_with("_total") {
                return Err(format!("counter sample without _total: {line}"));
            }
            if series.contains('{') && !series.ends_with('}') {
                return Err(format!("bad labels: {line}"));
            }
            let value: f64 = value.parse().map_err(|_| format!("bad value: {line}"))?;
            if samples.insert(series.to_string(), value).is_some() {
                return Err(format!("repeated series: {line}"));
            }
        }
    }
    Ok(samples)
}

fn promoted(why: Why) -> Step {
    Step::Promote {
        id: ME,
        via: "http://etcd-0.etcd:2379".into(),
        why,
    }
}

#[tokio::test]
async fn metrics_expose_role_leader_readiness_promotions_decisions_and_lag() -> TestResult {
    let mut s = Sidecar::observing(&serving())?;
    for action in ["restart", "join", "restart"] {
        record(s.data_dir(), action)?;
    }
    s.read_journal();
    // Three promotions made; a refusal and an already-voter answer are not promotions.
    for outcome in [
        Outcome::Done(promoted(Why::CaughtUp)),
        Outcome::NotYet(promoted(Why::CaughtUp)),
        Outcome::Done(promoted(Why::BeforeServing)),
        Outcome::Moot(promoted(Why::CaughtUp)),
        Outcome::Done(promoted(Why::CaughtUp)),
    ] {
        s.promote.learn(&outcome);
    }
    let removal = Step::RemoveLearner { id: 0xb };
    s.evict
        .learn(&Outcome::Failed(removal.clone(), "no leader".into()));
    s.evict.learn(&Outcome::Done(removal));
    let a = s.get("/metrics").await?;
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        a.content_type
            .starts_with("application/openmetrics-text; version=1.0.0"),
        "{}",
        a.content_type
    );
    let samples = parse_exposition(&a.text(), true).map_err(|e| format!("{e}\n{}", a.text()))?;
    let expected = [
        (r#"etcd_steward_member_role{role="voter"}"#, 1.0),
        (r#"etcd_steward_member_role{role="learner"}"#, 0.0),
        ("etcd_steward_leader_present", 1.0),
        ("etcd_steward_ready", 1.0),
        ("etcd_steward_live", 1.0),
        ("etcd_steward_etcd_running", 1.0),
        ("etcd_steward_promotions_total", 3.0),
        ("etcd_steward_learners_removed_total", 1.0),
        (
            r#"etcd_steward_init_decisions_total{action="restart"}"#,
            2.0,
        ),
        (r#"etcd_steward_init_decisions_total{action="join"}"#, 1.0),
        ("etcd_steward_raft_index_lag", 5.0),
        // No recovery was journaled on this volume.
        ("etcd_steward_recoveries_total", 0.0),
    ];
    for (series, value) in expected {
        assert_eq!(
            samples.get(series),
            Some(&value),
            "{series} in\n{}",
            a.text()
        );
    }
    assert_eq!(samples.len(), expected.len(), "{}", a.text());
    Ok(())
}

#[tokio::test]
async fn decision_counts_follow_the_journal_as_init_appends_to_it() -> TestResult {
    let s = Sidecar::observing(&serving())?;
    let count = |samples: &BTreeMap<String, f64>| {
        samples
            .get(r#"etcd_steward_init_decisions_total{action="join"}"#)
            .copied()
    };
    s.read_journal();
    let first = parse_exposition(&s.get("/metrics").await?.text(), true)?;
    assert_eq!(count(&first), None, "no decision yet, no series");
    record(s.data_dir(), "join")?;
    s.read_journal();
    assert_eq!(
        count(&parse_exposition(&s.get("/metrics").await?.text(), true)?),
        Some(1.0)
    );
    record(s.data_dir(), "join")?;
    s.read_journal();
    assert_eq!(
        count(&parse_exposition(&s.get("/metrics").await?.text(), true)?),
        Some(2.0)
    );
    Ok(())
}

#[tokio::test]
async fn metrics_of_a_learner_without_a_leader_index_show_no_lag() -> TestResult {
    let s = Sidecar::observing(&LocalObservation {
        leader_index: None,
        linearizable: None,
        ..with_status(|s| s.is_learner = true)
    })?;
    let a = s.get("/metrics").await?;
    let samples = parse_exposition(&a.text(), true)?;
    assert_eq!(
        samples.get(r#"etcd_steward_member_role{role="learner"}"#),
        Some(&1.0)
    );
    assert_eq!(
        samples.get(r#"etcd_steward_member_role{role="voter"}"#),
        Some(&0.0)
    );
    assert_eq!(samples.get("etcd_steward_ready"), Some(&0.0));
    assert_eq!(samples.get("etcd_steward_leader_present"), Some(&1.0));
    assert!(
        !a.text().contains("etcd_steward_raft_index_lag"),
        "{}",
        a.text()
    );
    Ok(())
}

#[tokio::test]
async fn metrics_before_any_observation_or_decision_are_well_formed() -> TestResult {
    let s = Sidecar::new(Health::starting())?;
    let text = s.get("/metrics").await?.text();
    let samples = parse_exposition(&text, true)?;
    assert_eq!(
        samples.get(r#"etcd_steward_member_role{role="voter"}"#),
        Some(&0.0)
    );
    assert_eq!(
        samples.get(r#"etcd_steward_member_role{role="learner"}"#),
        Some(&0.0)
    );
    assert_eq!(samples.get("etcd_steward_ready"), Some(&0.0));
    assert_eq!(samples.get("etcd_steward_live"), Some(&1.0));
    assert_eq!(samples.get("etcd_steward_etcd_running"), Some(&0.0));
    assert_eq!(samples.get("etcd_steward_promotions_total"), Some(&0.0));
    assert!(
        !samples
            .keys()
            .any(|k| k.starts_with("etcd_steward_init_decisions_total")),
        "{text}"
    );
    Ok(())
}

#[tokio::test]
async fn etcd_running_while_only_the_peer_api_answers_and_not_while_nothing_listens() -> TestResult
{
    let s = Sidecar::observing(&client_api_down(PeerApi::Answered))?;
    let running = |text: &str| -> Result<Option<f64>, String> {
        Ok(parse_exposition(text, true)?
            .get("etcd_steward_etcd_running")
            .copied())
    };
    assert_eq!(running(&s.get("/metrics").await?.text())?, Some(1.0));
    s.publish(assess(&client_api_down(PeerApi::NotListening)));
    assert_eq!(running(&s.get("/metrics").await?.text())?, Some(0.0));
    s.publish(assess(&client_api_down(PeerApi::NoAnswer(
        "timed out".into(),
    ))));
    assert_eq!(running(&s.get("/metrics").await?.text())?, Some(0.0));
    Ok(())
}

#[tokio::test]
async fn a_scraper_asking_for_plain_text_gets_the_prometheus_text_format() -> TestResult {
    let mut s = Sidecar::observing(&serving())?;
    s.promote.learn(&Outcome::Done(promoted(Why::CaughtUp)));
    let req = Request::get("/metrics")
        .header(header::ACCEPT, "text/plain")
        .body(Body::empty())?;
    let resp = router(s.state.clone()).oneshot(req).await?;
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let text = String::from_utf8(resp.into_body().collect().await?.to_bytes().to_vec())?;
    let samples = parse_exposition(&text, false).map_err(|e| format!("{e}\n{text}"))?;
    assert_eq!(samples.get("etcd_steward_promotions_total"), Some(&1.0));
    assert!(
        text.contains("# TYPE etcd_steward_promotions_total counter"),
        "{text}"
    );
    // The same samples as the OpenMetrics scrape.
    let openmetrics = encode(&s.state.registry, Format::OpenMetrics)?;
    assert_eq!(parse_exposition(&openmetrics, true)?, samples);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// /peer/report: the bootstrap evidence other pods read
// ---------------------------------------------------------------------------------------

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// The head of a WAL file as etcd writes it: a crc record, then the metadata record
/// (`walpb.Record{type: 1, data: etcdserverpb.Metadata{node_id, cluster_id}}`).
fn wal_head(member: u64, cluster: u64) -> Vec<u8> {
    let mut meta = vec![0x08];
    meta.extend(varint(member));
    meta.push(0x10);
    meta.extend(varint(cluster));
    let mut rec = vec![0x08, 0x01, 0x10, 0x05, 0x1a];
    rec.extend(varint(meta.len() as u64));
    rec.extend(meta);
    let mut out = frame(&[0x08, 0x04, 0x10, 0x00]);
    out.extend(frame(&rec));
    out
}

fn write_wal(dir: &Path, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let wal = dir.join("member/wal");
    std::fs::create_dir_all(&wal)?;
    let path = wal.join("0000000000000000-0000000000000000.wal");
    std::fs::write(&path, bytes)?;
    Ok(path)
}

async fn report_of(s: &Sidecar) -> Result<PeerReport, Box<dyn std::error::Error>> {
    let a = s.get("/peer/report").await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(a.content_type, "application/json");
    Ok(parse_report(&a.body, POD)?)
}

#[tokio::test]
async fn peer_report_of_an_empty_volume_says_no_data() -> TestResult {
    let s = Sidecar::new(Health::starting())?;
    let r = report_of(&s).await?;
    assert_eq!(
        r,
        PeerReport {
            name: POD.into(),
            has_data: false,
            wal: None,
            wal_error: None,
            formation: None,
            ..Default::default()
        }
    );
    Ok(())
}

#[tokio::test]
async fn peer_report_of_a_volume_with_files_but_no_wal_says_no_data() -> TestResult {
    let s = Sidecar::new(Health::starting())?;
    std::fs::create_dir_all(s.data_dir().join("member/snap"))?;
    std::fs::write(s.data_dir().join("member/wal.tmp"), b"")?;
    assert!(!report_of(&s).await?.has_data);
    Ok(())
}

#[tokio::test]
async fn peer_report_of_a_volume_with_a_wal_names_its_member_and_cluster() -> TestResult {
    let s = Sidecar::new(Health::starting())?;
    write_wal(
        s.data_dir(),
        &wal_head(0xfca2_43bc_c8d8_f651, 0x64f3_ae8b_1535_4f88),
    )?;
    let a = s.get("/peer/report").await?;
    assert!(
        a.text().contains(r#""member_id":"fca243bcc8d8f651""#),
        "IDs travel as etcd prints them: {}",
        a.text()
    );
    let r = parse_report(&a.body, POD)?;
    assert!(r.has_data);
    assert_eq!(
        r.wal,
        Some(WalIdentity {
            member_id: 0xfca2_43bc_c8d8_f651,
            cluster_id: 0x64f3_ae8b_1535_4f88,
        })
    );
    assert_eq!(r.wal_error, None);
    Ok(())
}

#[tokio::test]
async fn peer_report_of_an_unreadable_wal_still_says_data_and_why() -> TestResult {
    let s = Sidecar::new(Health::starting())?;
    write_wal(s.data_dir(), b"not a wal at all, just bytes")?;
    let r = report_of(&s).await?;
    assert!(r.has_data, "a WAL that cannot be parsed is still data");
    assert_eq!(r.wal, None);
    assert!(
        r.wal_error.as_deref().is_some_and(|e| e.contains(".wal")),
        "{:?}",
        r.wal_error
    );
    Ok(())
}

#[tokio::test]
async fn peer_report_carries_the_formation_marker() -> TestResult {
    let s = Sidecar::new(Health::starting())?;
    let formation = Formation {
        nonce: "5f1c".into(),
        initial_cluster: "etcd-0=http://etcd-0.etcd:2380,etcd-1=http://etcd-1.etcd:2380".into(),
        token: Some("a9e0.5f1c".into()),
        snapshot: None,
    };
    marker::write(s.data_dir(), &formation)?;
    let r = report_of(&s).await?;
    assert!(!r.has_data, "a marker alone is not etcd data");
    assert_eq!(r.formation, Some(formation));
    Ok(())
}

#[tokio::test]
async fn peer_report_is_an_error_not_an_empty_volume_when_the_data_dir_is_a_file() -> TestResult {
    // "Empty" is bootstrap evidence: a data dir that cannot be inspected must never say it.
    let file = tempfile::NamedTempFile::new()?;
    let app = peer_router(bare_state(file.path()));
    let resp = app
        .oneshot(Request::get("/peer/report").body(Body::empty())?)
        .await?;
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = resp.into_body().collect().await?.to_bytes();
    assert!(parse_report(&body, POD).is_err());
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Methods and paths
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn post_to_healthz_is_method_not_allowed() -> TestResult {
    let s = Sidecar::observing(&serving())?;
    assert_eq!(
        s.call(Method::POST, "/healthz").await?.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    Ok(())
}

#[tokio::test]
async fn every_endpoint_refuses_writes() -> TestResult {
    let s = Sidecar::observing(&serving())?;
    for path in ["/healthz", "/ready", "/metrics", "/peer/report"] {
        for method in [Method::POST, Method::PUT, Method::DELETE] {
            assert_eq!(
                s.call(method.clone(), path).await?.status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn head_is_answered_like_get_without_a_body() -> TestResult {
    let s = Sidecar::observing(&with_status(|s| s.leader = 0))?;
    let a = s.call(Method::HEAD, "/ready").await?;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(a.body.is_empty(), "{}", a.text());
    assert_eq!(
        s.call(Method::HEAD, "/healthz").await?.status,
        StatusCode::OK
    );
    Ok(())
}

#[tokio::test]
async fn an_unknown_path_is_not_found() -> TestResult {
    let s = Sidecar::observing(&serving())?;
    assert_eq!(s.get("/debug/pprof").await?.status, StatusCode::NOT_FOUND);
    Ok(())
}

#[tokio::test]
async fn the_kubelet_facing_router_does_not_serve_peer_reports() -> TestResult {
    // With or without peer TLS, reports are served only on the peer-facing port: the probe
    // port is open to every namespace (kubelet, Prometheus), and the report names this
    // volume's member, cluster and log.
    let dir = tempfile::tempdir()?;
    let app = router(bare_state(dir.path()));
    let resp = app
        .oneshot(Request::get("/peer/report").body(Body::empty())?)
        .await?;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Control requests (POST /peer/recovery, /peer/restore): only on the peer-facing port,
// authenticated, checked by this pod, one at a time, held at most 15 minutes
// ---------------------------------------------------------------------------------------

mod control {
    use super::*;
    use etcd_steward::control::{ControlAuth, ControlToken};
    use etcd_steward::facts::{RecoveryRequest, RestoreRequest};
    use etcd_steward::sidecar::http::control::{CheckRequests, Control, Refused};
    use futures_util::future::BoxFuture;

    const TOKEN: &str = "0123456789abcdef-control";

    /// This pod's check, scripted: `Ok` or the reason a request is not valid here.
    struct Scripted(Result<(), String>);

    impl CheckRequests for Scripted {
        fn recovery<'a>(&'a self, _: &'a RecoveryRequest) -> BoxFuture<'a, Result<(), String>> {
            let r = self.0.clone();
            Box::pin(async move { r })
        }
        fn restore<'a>(&'a self, _: &'a RestoreRequest) -> BoxFuture<'a, Result<(), String>> {
            let r = self.0.clone();
            Box::pin(async move { r })
        }
        fn rebuild<'a>(
            &'a self,
            _: &'a etcd_steward::facts::rebuild::RebuildRequest,
        ) -> BoxFuture<'a, Result<(), String>> {
            let r = self.0.clone();
            Box::pin(async move { r })
        }
    }

    struct Peer {
        state: AppState,
        registry: Arc<Registry>,
        _dir: tempfile::TempDir,
    }

    /// A sidecar's state with the token in a file (`auth` from it), checks scripted.
    fn peer(
        token: bool,
        peer_tls: bool,
        check: Result<(), String>,
    ) -> Result<Peer, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("token");
        std::fs::write(&file, format!("{TOKEN}\n"))?;
        let token = token.then(|| ControlToken::load(&file)).transpose()?;
        let mut registry = Registry::default();
        let control = Control::register(
            &mut registry,
            ControlAuth::new(peer_tls, token.as_ref()),
            Arc::new(Scripted(check)),
        );
        let registry = Arc::new(registry);
        let (_tx, rx) = watch::channel(Health::starting());
        let mut state = AppState::new(rx, registry.clone(), POD, dir.path());
        state.control = control;
        Ok(Peer {
            state,
            registry,
            _dir: dir,
        })
    }

    fn now() -> u64 {
        etcd_steward::clock::unix_now()
    }

    fn restore_body(id: &str, expires_unix: u64) -> String {
        serde_json::json!({"id": id, "snapshot": "20260101T000000.000Z-r5", "expires_unix": expires_unix}).to_string()
    }

    /// A rebuild request for member c, proven by a check in which a and b agree.
    fn rebuild_body(expires_unix: u64) -> String {
        use etcd_steward::facts::hashes::{judge, Answered, HashAnswer, HashCheck, HashRound};
        let answers: Vec<HashAnswer> = [(0xa, 1), (0xb, 1), (0xc, 2)]
            .into_iter()
            .map(|(member, hash)| HashAnswer {
                member,
                got: Answered::Hash {
                    hash,
                    compact_revision: 1,
                },
            })
            .collect();
        let verdict = judge(&HashRound {
            revision: 9,
            voters: vec![0xa, 0xb, 0xc],
            answers: answers.clone(),
        });
        let check = HashCheck {
            at: 1,
            checker: 0xa,
            answers,
            verdict,
        };
        serde_json::to_string(&etcd_steward::facts::rebuild::RebuildRequest::new(
            0xc,
            check,
            expires_unix,
        ))
        .unwrap_or_default()
    }

    fn recovery_body(id: &str, expires_unix: u64) -> String {
        serde_json::json!({"id": id, "survivor": "etcd-0", "force_lost": [], "expires_unix": expires_unix}).to_string()
    }

    impl Peer {
        async fn post(
            &self,
            app: axum::Router,
            path: &str,
            bearer: Option<&str>,
            body: String,
        ) -> Result<(StatusCode, String), Box<dyn std::error::Error>> {
            let mut req = Request::post(path).header(header::CONTENT_TYPE, "application/json");
            if let Some(t) = bearer {
                req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let resp = app.oneshot(req.body(Body::from(body))?).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        }

        async fn to_peer_port(
            &self,
            path: &str,
            bearer: Option<&str>,
            body: String,
        ) -> Result<(StatusCode, String), Box<dyn std::error::Error>> {
            self.post(peer_router(self.state.clone()), path, bearer, body)
                .await
        }

        fn refused(&self, reason: Refused) -> u64 {
            self.state.control.refused(reason)
        }

        fn metrics(&self) -> Result<String, std::fmt::Error> {
            encode(&self.registry, Format::PrometheusText)
        }
    }

    /// The token is checked from the head: a request without it is refused while its body
    /// has not even arrived (a body that never comes: were it read first, this would hang),
    /// and one with it whose body is longer than a control request can be is refused (413)
    /// without holding anything.
    #[tokio::test]
    async fn a_control_request_is_refused_before_its_body_is_read() -> TestResult {
        let p = peer(true, false, Ok(()))?;
        let never = futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
        let req = Request::post("/peer/recovery")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, "1000000")
            .body(Body::from_stream(never))?;
        let resp = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            peer_router(p.state.clone()).oneshot(req),
        )
        .await
        .map_err(|_| "the request was not refused before its body arrived")??;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(p.refused(Refused::Unauthenticated), 1);

        let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(64 * 1024));
        let (status, _) = p.to_peer_port("/peer/recovery", Some(TOKEN), huge).await?;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(p.state.recovery.current(), None);
        Ok(())
    }

    #[tokio::test]
    async fn control_requests_on_the_probe_port_are_not_found() -> TestResult {
        let p = peer(true, false, Ok(()))?;
        for (path, body) in [
            ("/peer/recovery", recovery_body("r1", now() + 60)),
            ("/peer/restore", restore_body("s1", now() + 60)),
            ("/peer/rebuild", rebuild_body(now() + 60)),
        ] {
            let (status, _) = p
                .post(router(p.state.clone()), path, Some(TOKEN), body)
                .await?;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path} on the probe port");
        }
        assert_eq!(p.state.recovery.current(), None);
        assert_eq!(p.state.restore.current(), None);
        Ok(())
    }

    #[tokio::test]
    async fn requests_without_the_token_or_with_a_wrong_one_are_refused_401_and_counted(
    ) -> TestResult {
        let p = peer(true, false, Ok(()))?;
        for bearer in [None, Some("wrong"), Some("0123456789abcdef-contro")] {
            for (path, body) in [
                ("/peer/recovery", recovery_body("r1", now() + 60)),
                ("/peer/restore", restore_body("s1", now() + 60)),
                ("/peer/rebuild", rebuild_body(now() + 60)),
            ] {
                let (status, text) = p.to_peer_port(path, bearer, body).await?;
                assert_eq!(
                    status,
                    StatusCode::UNAUTHORIZED,
                    "{path} with {bearer:?}: {text}"
                );
            }
        }
        assert_eq!(p.refused(Refused::Unauthenticated), 9);
        assert!(
            p.metrics()?.contains(
                "etcd_steward_control_requests_refused_total{reason=\"unauthenticated\"} 9"
            ),
            "{}",
            p.metrics()?
        );
        assert_eq!(p.state.recovery.current(), None);
        assert_eq!(p.state.restore.current(), None);
        assert_eq!(p.state.rebuild.current(), None);
        // With the token, the same rebuild request is held (the check is scripted here).
        let (status, text) = p
            .to_peer_port("/peer/rebuild", Some(TOKEN), rebuild_body(now() + 60))
            .await?;
        assert_eq!(status, StatusCode::ACCEPTED, "{text}");
        assert_eq!(p.state.rebuild.held_id().as_deref(), Some("rebuild-c"));
        Ok(())
    }

    #[tokio::test]
    async fn with_neither_peer_tls_nor_a_token_every_control_request_is_refused_naming_the_option(
    ) -> TestResult {
        let p = peer(false, false, Ok(()))?;
        let (status, text) = p
            .to_peer_port("/peer/restore", Some(TOKEN), restore_body("s1", now() + 60))
            .await?;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(text.contains("--control-token-file"), "{text}");
        assert_eq!(p.refused(Refused::Disabled), 1);
        assert_eq!(p.state.restore.current(), None);
        Ok(())
    }

    #[tokio::test]
    async fn with_peer_tls_and_no_token_the_mutual_tls_listener_is_the_authentication() -> TestResult
    {
        let p = peer(false, true, Ok(()))?;
        let (status, text) = p
            .to_peer_port("/peer/recovery", None, recovery_body("r1", now() + 60))
            .await?;
        assert_eq!(status, StatusCode::ACCEPTED, "{text}");
        assert!(p.state.recovery.current().is_some());
        Ok(())
    }

    #[tokio::test]
    async fn a_valid_request_is_held_and_its_expiry_capped_at_15_minutes_from_receipt() -> TestResult
    {
        let p = peer(true, false, Ok(()))?;
        let (status, text) = p
            .to_peer_port(
                "/peer/restore",
                Some(TOKEN),
                restore_body("s1", u64::MAX / 2),
            )
            .await?;
        assert_eq!(status, StatusCode::ACCEPTED, "{text}");
        let held = p.state.restore.current().ok_or("not held")?;
        assert!(
            held.expires_unix <= now() + 15 * 60,
            "held until {}, more than 15 minutes from now ({})",
            held.expires_unix,
            now()
        );
        Ok(())
    }

    #[tokio::test]
    async fn an_expired_request_is_refused_and_counted() -> TestResult {
        let p = peer(true, false, Ok(()))?;
        let (status, text) = p
            .to_peer_port(
                "/peer/recovery",
                Some(TOKEN),
                recovery_body("r1", now() - 1),
            )
            .await?;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert_eq!(p.refused(Refused::Expired), 1);
        assert_eq!(p.state.recovery.current(), None);
        Ok(())
    }

    #[tokio::test]
    async fn a_new_request_id_while_one_is_held_is_refused_409_and_the_same_id_is_not_renewed(
    ) -> TestResult {
        let p = peer(true, false, Ok(()))?;
        let first = p
            .to_peer_port("/peer/restore", Some(TOKEN), restore_body("s1", now() + 60))
            .await?;
        assert_eq!(first.0, StatusCode::ACCEPTED, "{}", first.1);
        let held = p.state.restore.current().ok_or("not held")?;
        // The same request handed again (as the command does every 5 s): taken, unchanged.
        let again = p
            .to_peer_port(
                "/peer/restore",
                Some(TOKEN),
                restore_body("s1", now() + 600),
            )
            .await?;
        assert_eq!(again.0, StatusCode::ACCEPTED, "{}", again.1);
        assert_eq!(p.state.restore.current(), Some(held.clone()));
        // Another restore, or a recovery, while it is held: refused.
        for (path, body) in [
            ("/peer/restore", restore_body("s2", now() + 60)),
            ("/peer/recovery", recovery_body("r1", now() + 60)),
        ] {
            let (status, text) = p.to_peer_port(path, Some(TOKEN), body).await?;
            assert_eq!(status, StatusCode::CONFLICT, "{path}: {text}");
            assert!(text.contains("s1"), "{text}");
        }
        assert_eq!(p.refused(Refused::Conflict), 2);
        assert_eq!(p.state.restore.current(), Some(held));
        assert_eq!(p.state.recovery.current(), None);
        Ok(())
    }

    #[tokio::test]
    async fn a_request_this_pod_finds_invalid_is_refused_422_counted_and_not_held() -> TestResult {
        let p = peer(
            true,
            false,
            Err("snapshot 20260101T000000.000Z-r5 is not in the store".into()),
        )?;
        let (status, text) = p
            .to_peer_port("/peer/restore", Some(TOKEN), restore_body("s1", now() + 60))
            .await?;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert!(text.contains("is not in the store"), "{text}");
        assert_eq!(p.refused(Refused::Invalid), 1);
        assert_eq!(p.state.restore.current(), None);
        let (status, text) = p
            .to_peer_port("/peer/recovery", Some(TOKEN), "{\"id\":1}".into())
            .await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert_eq!(p.refused(Refused::Invalid), 2);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// /peer/history: this pod's part of `status --history`, on the peer-facing port only
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn the_history_is_served_on_the_peer_port_only_with_inits_decisions_and_the_sidecars_acts(
) -> TestResult {
    use etcd_steward::facts::history::{By, PodHistory};
    let dir = tempfile::tempdir()?;
    // init's decisions after the sidecar's act: the order served is by time, not by source.
    for (ts, action) in [(2_000, "replace"), (3_000, "join")] {
        journal::append(dir.path(), &journal::Entry::new(ts, action.parse()?, ""))?;
    }
    let state = bare_state(dir.path());
    state.acts.record(
        "Promoted",
        "learner a1 promoted to voter",
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000),
    );
    let get = || Request::get("/peer/history").body(Body::empty());

    let resp = peer_router(state.clone()).oneshot(get()?).await?;
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await?.to_bytes();
    let history: PodHistory = serde_json::from_slice(&body)?;
    assert_eq!(history.name, POD);
    let acts: Vec<(By, &str)> = history
        .entries
        .iter()
        .map(|e| (e.by, e.act.as_str()))
        .collect();
    assert_eq!(
        acts,
        [
            (By::Sidecar, "Promoted"),
            (By::Init, "replace"),
            (By::Init, "join")
        ],
        "oldest first"
    );
    let at_ms: Vec<u64> = history.entries.iter().map(|e| e.at_ms).collect();
    assert_eq!(
        at_ms,
        [1_000_000, 2_000_000, 3_000_000],
        "journal seconds as ms"
    );

    // Not on the probe port, which anyone may reach.
    let resp = router(state).oneshot(get()?).await?;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    Ok(())
}
