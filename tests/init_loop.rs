//! `init`'s loop on the in-memory fakes (etcd, DNS, the peers' sidecars), with a paused
//! clock: the retry sequences a real cluster produces ("unhealthy cluster" just after a
//! restart, "too many learners", "leader changed"), and a kill between the membership change
//! and the exec. No root, no process, no real time.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use clap::Parser;
use tokio::time::Instant;

use etcd_steward::config::{Cli, Command, InitConfig};
use etcd_steward::etcd::EtcdError;
use etcd_steward::facts::{ActionKind, Lookup, PeerReport, WalIdentity};
use etcd_steward::fake::{FakeCluster, FakeDns, FakeReports, Op, Times};
use etcd_steward::init::{self, act::ActError, retry::UNHEALTHY_CLUSTER_RETRY, Outcome};
use etcd_steward::volume::journal;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const CLUSTER: u64 = 0xc1;

fn host(o: u32) -> String {
    format!("etcd-{o}.etcd.default.svc.cluster.local")
}

fn peer_url(o: u32) -> String {
    format!("http://{}:2380", host(o))
}

fn client_url(o: u32) -> String {
    format!("http://{}:2379", host(o))
}

/// Pod `etcd-1` of three with an empty volume; `etcd-0` (leader) and `etcd-2` run as voters
/// and their sidecars report their volumes.
struct World {
    cluster: FakeCluster,
    dns: FakeDns,
    reports: FakeReports,
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> Result<Self, Box<dyn std::error::Error>> {
        let w = World {
            cluster: FakeCluster::new(CLUSTER),
            dns: FakeDns::default(),
            reports: FakeReports::default(),
            dir: tempfile::tempdir()?,
        };
        for o in 0..3u8 {
            w.dns.answer(
                &host(u32::from(o)),
                Lookup::Found(vec![IpAddr::from([10, 0, 0, o + 1])]),
            );
        }
        for o in [0u32, 2] {
            let id = 0xa0 + u64::from(o);
            w.cluster.add_member(
                id,
                &format!("etcd-{o}"),
                &peer_url(o),
                &client_url(o),
                false,
            );
            w.reports.set(
                &format!("etcd-{o}"),
                PeerReport {
                    name: format!("etcd-{o}"),
                    has_data: true,
                    wal: Some(WalIdentity {
                        member_id: id,
                        cluster_id: CLUSTER,
                    }),
                    wal_error: None,
                    formation: None,
                    ..Default::default()
                },
            );
        }
        w.cluster.set_leader(0xa0);
        Ok(w)
    }

    fn config(&self) -> Result<InitConfig, Box<dyn std::error::Error>> {
        let dir = format!("--data-dir={}", self.dir.path().display());
        let cli = Cli::try_parse_from([
            "etcd-steward",
            "init",
            "--name=etcd-1",
            "--replicas=3",
            "--listen-ip=10.0.0.2",
            "--etcd-bin=/bin/sh",
            &dir,
        ])?;
        match cli.command {
            Command::Init(args) => Ok(args.validate()?),
            other => Err(format!("not init: {other:?}").into()),
        }
    }

    async fn run(&self) -> Result<Outcome, ActError> {
        let cfg = self.config().map_err(|e| {
            ActError::Volume(etcd_steward::volume::VolumeError::Unreadable {
                path: self.dir.path().into(),
                source: std::io::Error::other(e.to_string()),
            })
        })?;
        init::run(
            cfg,
            self.dns.clone(),
            self.cluster.clone(),
            self.reports.clone(),
        )
        .await
    }

    fn ours(&self) -> Option<etcd_steward::facts::MemberInfo> {
        self.cluster
            .members()
            .into_iter()
            .find(|m| m.peer_urls.contains(&peer_url(1)))
    }

    fn journal(&self) -> Vec<ActionKind> {
        journal::read(self.dir.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|e| e.action)
            .collect()
    }
}

fn exec_argv(outcome: Outcome) -> Vec<String> {
    match outcome {
        Outcome::Exec { argv, .. } => argv,
        Outcome::DryRun(v) => panic!("a dry run: {v}"),
    }
}

#[track_caller]
fn starts_as_a_joining_member(argv: &[String]) {
    assert!(
        argv.contains(&"--initial-cluster-state=existing".to_string()),
        "{argv:?}"
    );
    assert!(
        argv.iter()
            .any(|a| a.starts_with("--initial-cluster=") && a.contains(&peer_url(1))),
        "{argv:?}"
    );
}

fn wiped(dir: &Path) -> bool {
    !dir.join("member/wal").exists()
}

#[tokio::test(start_paused = true)]
async fn unhealthy_cluster_just_after_a_restart_is_retried_on_a_flat_period() -> TestResult {
    let w = World::new()?;
    w.cluster
        .fail_everywhere(Op::AddLearner, EtcdError::UnhealthyCluster, Times::N(3));
    let started = Instant::now();
    let argv = exec_argv(w.run().await?);
    let took = started.elapsed();
    starts_as_a_joining_member(&argv);
    assert_eq!(
        w.cluster.calls_of(Op::AddLearner).len(),
        4,
        "three refusals, then added"
    );
    assert!(
        took >= UNHEALTHY_CLUSTER_RETRY * 3
            && took < UNHEALTHY_CLUSTER_RETRY * 3 + Duration::from_millis(200),
        "a flat 250 ms between attempts, no growing back-off: {took:?}"
    );
    let ours = w.ours().ok_or("no member for etcd-1")?;
    assert!(ours.is_learner, "joins as a learner");
    assert_eq!(w.journal(), [ActionKind::Join, ActionKind::Resume]);
    assert!(wiped(w.dir.path()), "init itself never writes etcd's data");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn too_many_learners_waits_for_its_turn_with_a_growing_back_off() -> TestResult {
    let w = World::new()?;
    w.cluster
        .fail_everywhere(Op::AddLearner, EtcdError::TooManyLearners, Times::N(6));
    let started = Instant::now();
    let argv = exec_argv(w.run().await?);
    starts_as_a_joining_member(&argv);
    let attempts = w.cluster.calls_of(Op::AddLearner).len();
    assert_eq!(attempts, 7);
    // A growing back-off from 50 ms (factor 1.6): six waits take well over six flat periods
    // of the first delay.
    assert!(
        started.elapsed() > Duration::from_millis(50 * 6 * 2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(w.journal(), [ActionKind::Join, ActionKind::Resume]);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn leader_changed_during_the_join_is_looked_at_again_not_fatal() -> TestResult {
    let w = World::new()?;
    w.cluster.fail_everywhere(
        Op::AddLearner,
        EtcdError::Other {
            endpoint: host(0),
            detail: "etcdserver: leader changed".into(),
        },
        Times::N(1),
    );
    let argv = exec_argv(w.run().await?);
    starts_as_a_joining_member(&argv);
    assert_eq!(w.cluster.calls_of(Op::AddLearner).len(), 2);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn killed_between_member_add_and_exec_resumes_the_entry_it_added() -> TestResult {
    // The first run adds the learner and gets as far as the exec; killed there, etcd never
    // started (the entry publishes no client URL). Every later run must start as that entry,
    // never add another member.
    let w = World::new()?;
    let first = exec_argv(w.run().await?);
    let added = w.ours().ok_or("the MemberAdd happened")?;
    assert!(added.is_learner && added.client_urls.is_empty());
    for _ in 0..3 {
        let again = exec_argv(w.run().await?);
        assert_eq!(again, first, "the same start, run after run");
    }
    assert_eq!(
        w.cluster.calls_of(Op::AddLearner).len(),
        1,
        "later runs resume the entry the first one added, they add no other"
    );
    assert_eq!(w.cluster.members().len(), 3);
    assert_eq!(w.ours().map(|m| m.id), Some(added.id));
    assert_eq!(
        w.journal(),
        [
            ActionKind::Join,
            ActionKind::Resume,
            ActionKind::Resume,
            ActionKind::Resume,
            ActionKind::Resume
        ]
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_lost_volume_removes_its_stale_entry_then_joins_with_a_new_id() -> TestResult {
    let w = World::new()?;
    w.cluster
        .add_member(0xa1, "etcd-1", &peer_url(1), &client_url(1), false);
    w.cluster.set_up(0xa1, false);
    w.cluster
        .fail_everywhere(Op::Remove, EtcdError::UnhealthyCluster, Times::N(1));
    let argv = exec_argv(w.run().await?);
    starts_as_a_joining_member(&argv);
    let calls: Vec<Op> = w
        .cluster
        .calls()
        .into_iter()
        .map(|c| c.op)
        .filter(|op| matches!(op, Op::Remove | Op::AddLearner))
        .collect();
    assert_eq!(calls, [Op::Remove, Op::Remove, Op::AddLearner]);
    let ours = w.ours().ok_or("no member for etcd-1")?;
    assert_ne!(ours.id, 0xa1, "never the old member ID");
    assert!(ours.is_learner);
    assert_eq!(
        w.journal(),
        [ActionKind::Replace, ActionKind::Join, ActionKind::Resume]
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn silent_peers_mean_waiting_not_a_new_cluster() -> TestResult {
    // No cluster answers, and one initial peer's sidecar is silent: init keeps waiting.
    let mut w = World::new()?;
    for id in [0xa0, 0xa2] {
        w.cluster.set_up(id, false);
    }
    w.reports = FakeReports::default();
    w.reports.set(
        "etcd-0",
        PeerReport {
            name: "etcd-0".into(),
            has_data: false,
            wal: None,
            wal_error: None,
            formation: None,
            ..Default::default()
        },
    );
    let waited = tokio::time::timeout(Duration::from_secs(120), w.run()).await;
    assert!(
        waited.is_err(),
        "still waiting after two minutes: {waited:?}"
    );
    assert!(w.journal().is_empty(), "nothing acted on");
    assert!(
        !w.dir.path().join("member/steward/formation.json").exists(),
        "not even a formation prepared"
    );
    Ok(())
}
