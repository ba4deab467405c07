//! The backup planner's schedule, on plain observations and a paused clock: only the
//! leader's sidecar plans a round, one round at a time, not every tick, and a failed round
//! is counted and followed by the next; the backup metrics exist only with `--backup-url`
//! and pass `promtool check metrics`. (The rounds themselves, against real etcd and real
//! stores, are in tests/backup_cluster.rs.)

use std::time::Duration;

use clap::Parser;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use etcd_steward::backup::schedule::BackupMetrics;
use etcd_steward::config::{Cli, Command, Config};
use etcd_steward::etcd::MemberStatus;
use etcd_steward::sidecar::execute::backup::{BackupExport, BackupRounds, RoundReport};
use etcd_steward::sidecar::gather::Observation;
use etcd_steward::sidecar::http::metrics::{encode, Format};
use etcd_steward::sidecar::plan::backup::{Backup, RoundEnd, ROUND_EVERY};
use etcd_steward::sidecar::plan::{Outcome, Planner, Step};
use etcd_steward::sidecar::planners;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const INTERVAL: Duration = Duration::from_secs(30 * 60);
const LEADER: u64 = 0xa0;

/// The backup planner and, beside it, the metrics the executor exports from the rounds'
/// reports, as the loop runs them: the reports are exported, then the planner is told how
/// the rounds ended.
struct Rounds {
    planner: Backup,
    export: BackupExport,
}

impl Rounds {
    fn new(interval: Duration, registry: &mut Registry) -> Self {
        Rounds {
            planner: Backup::new(interval),
            export: BackupExport::register(registry),
        }
    }

    fn in_flight(&self) -> bool {
        self.planner.in_flight()
    }

    fn plan(&mut self, seen: &Seen) -> Vec<Step> {
        for report in &seen.1 {
            self.export.absorb(report);
        }
        self.planner.plan(&seen.0)
    }

    fn learn(&mut self, outcome: &Outcome) {
        self.planner.learn(outcome);
        self.export.record(outcome);
    }
}

/// One tick's observation, and the reports of the rounds that ended since the last.
struct Seen(Observation, Vec<RoundReport>);

/// What member `me` sees, member `leader` leading (0: no leader).
fn seen(me: u64, leader: u64, rounds: Vec<RoundReport>) -> Seen {
    let observation = Observation {
        backup_rounds: rounds.iter().map(|r| r.end.clone()).collect(),
        ..Observation::serving(
            Instant::now(),
            MemberStatus {
                member_id: me,
                cluster_id: 9,
                leader,
                raft_index: 100,
                raft_term: 2,
                is_learner: false,
                errors: vec![],
                ..Default::default()
            },
        )
    };
    Seen(observation, rounds)
}

/// The leader's planner after one tick: the steps, each performed (started) at once.
fn tick(p: &mut Rounds, seen: &Seen) -> Vec<Step> {
    let steps = p.plan(seen);
    for s in &steps {
        p.learn(&Outcome::Done(s.clone()));
    }
    steps
}

fn ran(revision: i64, time: u64) -> RoundReport {
    RoundReport {
        end: RoundEnd::Ran {
            newest_verified: Some((time, revision)),
            take_error: None,
        },
        metrics: BackupMetrics {
            last_success: Some(time as f64),
            last_revision: Some(revision),
            duration: Some(1.5),
            size: Some(4096),
            verified_revision: Some(revision),
            drill_last_success: Some(time as f64 + 2.0),
            drill_archive_last_revision: Some(revision + 3),
            ..BackupMetrics::default()
        },
    }
}

fn store_down() -> RoundReport {
    RoundReport {
        end: RoundEnd::Failed {
            error: "store s3://b/p unreachable".into(),
        },
        metrics: BackupMetrics {
            failures: 1,
            duration: Some(0.2),
            ..BackupMetrics::default()
        },
    }
}

fn metric(registry: &Registry, series: &str) -> Result<Option<f64>, Box<dyn std::error::Error>> {
    let text = encode(registry, Format::OpenMetrics)?;
    Ok(harness::client::sample(&text, series))
}

#[tokio::test(start_paused = true)]
async fn only_the_leaders_sidecar_plans_a_backup_round() {
    let mut follower = Rounds::new(INTERVAL, &mut Registry::default());
    let mut no_leader = Rounds::new(INTERVAL, &mut Registry::default());
    let mut leader = Rounds::new(INTERVAL, &mut Registry::default());
    for _ in 0..100 {
        assert!(tick(&mut follower, &seen(0xa1, LEADER, vec![])).is_empty());
        assert!(tick(&mut no_leader, &seen(LEADER, 0, vec![])).is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_eq!(
        tick(&mut leader, &seen(LEADER, LEADER, vec![])),
        vec![Step::BackupRound]
    );
}

#[tokio::test(start_paused = true)]
async fn one_round_at_a_time_however_long_it_runs() {
    let mut p = Rounds::new(INTERVAL, &mut Registry::default());
    assert_eq!(tick(&mut p, &seen(LEADER, LEADER, vec![])).len(), 1);
    assert!(p.in_flight());
    // A 1 GiB snapshot and the drill: ten minutes of ticks, no second round.
    for _ in 0..600 {
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(tick(&mut p, &seen(LEADER, LEADER, vec![])).is_empty());
    }
    // It reports; long past the round period, the next round starts on that same tick.
    assert_eq!(
        tick(&mut p, &seen(LEADER, LEADER, vec![ran(7, 1000)])),
        vec![Step::BackupRound]
    );
}

#[tokio::test(start_paused = true)]
async fn rounds_are_planned_every_15_s_not_every_tick() {
    let mut p = Rounds::new(INTERVAL, &mut Registry::default());
    let mut started = Vec::new();
    let start = Instant::now();
    let mut rounds = Vec::new();
    // One tick a second for a minute; each round ends within the tick after it started.
    for _ in 0..60 {
        if !tick(&mut p, &seen(LEADER, LEADER, std::mem::take(&mut rounds))).is_empty() {
            started.push(Instant::now() - start);
            rounds.push(ran(7, 1000));
        }
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let every = ROUND_EVERY;
    assert_eq!(started, vec![Duration::ZERO, every, every * 2, every * 3]);
}

#[tokio::test(start_paused = true)]
async fn a_short_interval_is_looked_at_four_times_per_interval() {
    let mut p = Rounds::new(Duration::from_secs(8), &mut Registry::default());
    assert_eq!(tick(&mut p, &seen(LEADER, LEADER, vec![])).len(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(tick(&mut p, &seen(LEADER, LEADER, vec![ran(7, 1000)])).is_empty());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(tick(&mut p, &seen(LEADER, LEADER, vec![])).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_round_is_counted_and_the_next_round_is_planned() -> TestResult {
    let mut registry = Registry::default();
    let mut p = Rounds::new(INTERVAL, &mut registry);
    assert_eq!(tick(&mut p, &seen(LEADER, LEADER, vec![])).len(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(tick(&mut p, &seen(LEADER, LEADER, vec![store_down()])).is_empty());
    assert!(!p.in_flight());
    assert_eq!(
        metric(&registry, "etcd_steward_backup_failures_total")?,
        Some(1.0)
    );
    // Nothing succeeded: no time of a last success is made up.
    assert_eq!(
        metric(
            &registry,
            "etcd_steward_backup_last_success_timestamp_seconds"
        )?,
        None
    );
    tokio::time::advance(ROUND_EVERY).await;
    assert_eq!(
        tick(&mut p, &seen(LEADER, LEADER, vec![])),
        vec![Step::BackupRound]
    );
    // That round fails too; a round that could not even start counts as well, and is
    // asked again.
    tokio::time::advance(ROUND_EVERY).await;
    let steps = p.plan(&seen(LEADER, LEADER, vec![store_down()]));
    assert_eq!(steps, vec![Step::BackupRound]);
    for s in steps {
        p.learn(&Outcome::Failed(s, "no backup store".into()));
    }
    assert!(!p.in_flight());
    assert_eq!(
        metric(&registry, "etcd_steward_backup_failures_total")?,
        Some(3.0)
    );
    tokio::time::advance(ROUND_EVERY).await;
    assert_eq!(tick(&mut p, &seen(LEADER, LEADER, vec![])).len(), 1);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_round_that_ends_after_leadership_moved_still_reports() -> TestResult {
    let mut registry = Registry::default();
    let mut p = Rounds::new(INTERVAL, &mut registry);
    assert_eq!(tick(&mut p, &seen(LEADER, LEADER, vec![])).len(), 1);
    tokio::time::advance(Duration::from_secs(30)).await;
    // Now a follower: its round's report is exported, and no new round planned.
    assert!(tick(&mut p, &seen(LEADER, 0xa1, vec![ran(42, 1_700_000_000)])).is_empty());
    assert_eq!(
        metric(&registry, "etcd_steward_backup_last_revision")?,
        Some(42.0)
    );
    assert_eq!(
        metric(
            &registry,
            "etcd_steward_backup_last_success_timestamp_seconds"
        )?,
        Some(1_700_000_000.0)
    );
    Ok(())
}

fn config(extra: &[&str]) -> Result<Config, Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join("steward-sidecar-backup-test");
    let mut args = vec![
        "etcd-steward",
        "sidecar",
        "--name",
        "etcd-0",
        "--replicas",
        "3",
        "--data-dir",
        dir.to_str().ok_or("path")?,
    ];
    args.extend_from_slice(extra);
    let Command::Sidecar(a) = Cli::try_parse_from(args)?.command else {
        return Err("not the sidecar command".into());
    };
    Ok(a.common.validate().map_err(|e| format!("{e:?}"))?)
}

#[test]
fn backup_metrics_exist_only_with_a_backup_url() -> TestResult {
    let mut without = Registry::default();
    let cfg = config(&[])?;
    let _ = planners(&cfg, &mut without);
    assert!(BackupRounds::new(&cfg, &mut without).is_none());
    let text = encode(&without, Format::OpenMetrics)?;
    assert!(!text.contains("etcd_steward_backup"), "{text}");

    let store = tempfile::tempdir()?;
    let url = format!("file://{}", store.path().display());
    let mut with = Registry::default();
    let cfg = config(&["--backup-url", &url])?;
    let _ = planners(&cfg, &mut with);
    assert!(BackupRounds::new(&cfg, &mut with).is_some());
    assert_eq!(
        metric(&with, "etcd_steward_backup_failures_total")?,
        Some(0.0)
    );
    assert_eq!(
        metric(&with, "etcd_steward_backup_drill_failures_total")?,
        Some(0.0)
    );
    Ok(())
}

/// `promtool check metrics` on `text`: its complaints, or an error.
fn promtool(text: &str) -> Result<String, Box<dyn std::error::Error>> {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool: {e} (scripts/install-test-deps.sh installs it)"))?;
    child
        .stdin
        .take()
        .ok_or("stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
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

#[tokio::test(start_paused = true)]
async fn the_backup_metrics_pass_promtool_with_every_series_set() -> TestResult {
    let mut registry = Registry::default();
    let mut p = Rounds::new(INTERVAL, &mut registry);
    tick(&mut p, &seen(LEADER, LEADER, vec![]));
    tick(&mut p, &seen(LEADER, LEADER, vec![ran(7, 1_700_000_000)]));
    tick(&mut p, &seen(LEADER, LEADER, vec![store_down()]));
    let text = encode(&registry, Format::PrometheusText)?;
    for series in [
        "etcd_steward_backup_last_success_timestamp_seconds 1700000000.0",
        "etcd_steward_backup_last_revision 7",
        "etcd_steward_backup_failures_total 1",
        "etcd_steward_backup_duration_seconds 0.2",
        "etcd_steward_backup_size_bytes 4096",
        "etcd_steward_backup_verified_revision 7",
        "etcd_steward_backup_drill_last_success_timestamp_seconds 1700000002.0",
        "etcd_steward_backup_drill_failures_total 0",
        "etcd_steward_backup_drill_archive_last_revision 10",
        "etcd_steward_backup_drill_archive_failures_total 0",
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
    }
    let complaints = promtool(&text)?;
    assert!(complaints.trim().is_empty(), "{complaints}");
    Ok(())
}

/// The archive's metrics: registered only with `--backup-url` and archiving on (the
/// default), and, every series set from a round's report, they pass promtool.
#[test]
fn archive_metrics_exist_only_with_archiving_on_and_pass_promtool() -> TestResult {
    use etcd_steward::backup::archive::writer::RoundReport as ArchiveReport;
    use etcd_steward::sidecar::execute::archive::{ArchiveExport, ArchiveRounds};
    let store = tempfile::tempdir()?;
    let url = format!("file://{}", store.path().display());
    for (args, on) in [
        (vec![], false),
        (
            vec!["--backup-url", url.as_str(), "--archive-interval", "0"],
            false,
        ),
        (vec!["--backup-url", url.as_str()], true),
    ] {
        let mut registry = Registry::default();
        let cfg = config(&args)?;
        assert_eq!(
            ArchiveRounds::new(&cfg, &mut registry).is_some(),
            on,
            "{args:?}"
        );
        let text = encode(&registry, Format::OpenMetrics)?;
        assert_eq!(
            text.contains("etcd_steward_archive"),
            on,
            "{args:?}: {text}"
        );
    }
    let mut registry = Registry::default();
    let export = ArchiveExport::register(&mut registry);
    export.absorb(&ArchiveReport {
        last_revision: Some(1234),
        lag_seconds: Some(0.0),
        segments: 2,
        breaks: 1,
        error: None,
    });
    export.absorb(&ArchiveReport {
        last_revision: Some(1234),
        lag_seconds: Some(7.5),
        segments: 0,
        breaks: 0,
        error: Some("store unreachable".into()),
    });
    export.record(&Outcome::Failed(
        Step::ArchiveRound { from_store: true },
        "no store".into(),
    ));
    let text = encode(&registry, Format::PrometheusText)?;
    for series in [
        "etcd_steward_archive_last_revision 1234",
        "etcd_steward_archive_lag_seconds 7.5",
        "etcd_steward_archive_segments_total 2",
        "etcd_steward_archive_failures_total 2",
        "etcd_steward_archive_breaks_total 1",
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
    }
    let complaints = promtool(&text)?;
    assert!(complaints.trim().is_empty(), "{complaints}");
    Ok(())
}
