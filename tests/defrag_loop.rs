//! The defragmentation across the sidecar's ticks, on the in-memory `FakeCluster`: the lock
//! key held by another sidecar means waiting; once free, the fragmented follower takes it,
//! is not ready while it defragments, and releases the lock after. Paused clock, no network.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use prometheus_client::registry::Registry;

use etcd_steward::config::{Cli, Command, Config};
use etcd_steward::dns::Lookup;
use etcd_steward::fake::{FakeCluster, FakeDns, Op};
use etcd_steward::sidecar::gather::PeerProbe;
use etcd_steward::sidecar::health::PeerApi;
use etcd_steward::sidecar::http::metrics::{encode, Format};
use etcd_steward::sidecar::plan::defrag::LOCK_KEY;
use etcd_steward::sidecar::Sidecar;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Clone)]
struct Probe(Arc<Mutex<PeerApi>>);

impl PeerProbe for Probe {
    async fn peer_api(&self) -> PeerApi {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn id(ordinal: u32) -> u64 {
    0xa0 + u64::from(ordinal)
}

const MIB: i64 = 1 << 20;

fn config(dir: &std::path::Path, ordinal: u32) -> Result<Config, Box<dyn std::error::Error>> {
    let data_dir = dir.join(format!("etcd-{ordinal}"));
    std::fs::create_dir_all(&data_dir)?;
    let name = format!("etcd-{ordinal}");
    let cli = Cli::try_parse_from([
        "etcd-steward",
        "sidecar",
        "--name",
        name.as_str(),
        "--replicas",
        "3",
        "--data-dir",
        data_dir.to_str().ok_or("path")?,
    ])?;
    let Command::Sidecar(args) = cli.command else {
        return Err("not the sidecar command".into());
    };
    Ok(args.common.validate().map_err(|e| format!("{e:?}"))?)
}

/// Three running members, etcd-0 leading; etcd-1 (a follower) fragmented: 1 GiB file,
/// 100 MiB in use.
fn world(dir: &std::path::Path) -> Result<(FakeCluster, FakeDns), Box<dyn std::error::Error>> {
    let cluster = FakeCluster::default();
    let dns = FakeDns::default();
    let identity = config(dir, 0)?.identity;
    for o in 0..3u32 {
        dns.answer(
            &identity.host(o),
            Lookup::Found(vec![IpAddr::from([10, 0, 0, o as u8 + 1])]),
        );
        cluster.add_member(
            id(o),
            &identity.pod_name(o),
            &identity.peer_url(o),
            &identity.client_url(o),
            false,
        );
        cluster.set_raft_index(id(o), 1000);
        cluster.set_db_size(id(o), 120 * MIB, 100 * MIB);
    }
    cluster.set_db_size(id(1), 1024 * MIB, 100 * MIB);
    cluster.set_leader(id(0));
    Ok((cluster, dns))
}

#[tokio::test(start_paused = true)]
async fn a_held_lock_means_waiting_then_the_follower_defragments_not_ready_and_releases_it(
) -> TestResult {
    let dir = tempfile::tempdir()?;
    let (cluster, dns) = world(dir.path())?;
    let cfg = config(dir.path(), 1)?;
    let mut registry = Registry::default();
    let probe = Probe(Arc::new(Mutex::new(PeerApi::Answered)));
    let mut sidecar = Sidecar::new(&cfg, dns, cluster.clone(), probe, &mut registry);
    let health = sidecar.health();

    // Another sidecar holds the lock: no defragmentation, however many ticks.
    cluster.hold_lock(LOCK_KEY, true);
    for _ in 0..10 {
        let pause = sidecar.tick().await;
        tokio::time::sleep(pause).await;
    }
    assert!(cluster.calls_of(Op::Defragment).is_empty());
    assert!(!cluster.calls_of(Op::TryLock).is_empty());

    // Released: the next tries take it; etcd takes 3 s to defragment, /ready says so.
    cluster.hold_lock(LOCK_KEY, false);
    cluster.delay(
        &format!("{}:{}", cfg.identity.host(1), cfg.identity.client_port),
        Op::Defragment,
        Duration::from_secs(3),
    );
    let mut seen_defragmenting = false;
    for _ in 0..10 {
        let look = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            health.borrow().clone()
        };
        let (pause, during) = tokio::join!(sidecar.tick(), look);
        if !during.ready.ok && during.ready.reason.starts_with("defragmenting") {
            seen_defragmenting = true;
        }
        tokio::time::sleep(pause).await;
        if !cluster.calls_of(Op::Defragment).is_empty() {
            break;
        }
    }
    assert!(seen_defragmenting, "/ready said defragmenting meanwhile");
    assert_eq!(cluster.calls_of(Op::Defragment).len(), 1);
    assert!(cluster.locks().is_empty(), "the lock is released");
    let text = encode(&registry, Format::OpenMetrics)?;
    assert!(text.contains("etcd_steward_defrag_total 1"), "{text}");
    // Once defragmented, the next ticks leave it alone.
    for _ in 0..5 {
        let pause = sidecar.tick().await;
        tokio::time::sleep(pause).await;
    }
    assert_eq!(cluster.calls_of(Op::Defragment).len(), 1);
    assert!(health.borrow().ready.ok, "{:?}", health.borrow().ready);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_leader_does_not_defragment_before_its_fragmented_follower() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (cluster, dns) = world(dir.path())?;
    cluster.set_db_size(id(0), 1024 * MIB, 100 * MIB);
    let cfg = config(dir.path(), 0)?;
    let mut registry = Registry::default();
    let probe = Probe(Arc::new(Mutex::new(PeerApi::Answered)));
    let mut sidecar = Sidecar::new(&cfg, dns, cluster.clone(), probe, &mut registry);
    for _ in 0..5 {
        let pause = sidecar.tick().await;
        tokio::time::sleep(pause).await;
    }
    assert!(
        cluster.calls_of(Op::Defragment).is_empty(),
        "etcd-1 goes first"
    );
    // etcd-1 lean again (its sidecar defragmented it): the leader goes.
    cluster.set_db_size(id(1), 100 * MIB, 100 * MIB);
    for _ in 0..3 {
        let pause = sidecar.tick().await;
        tokio::time::sleep(pause).await;
    }
    assert_eq!(cluster.calls_of(Op::Defragment).len(), 1);
    Ok(())
}
