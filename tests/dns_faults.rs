//! DNS that misbehaves never counts as evidence. A server that refuses queries, one that
//! answers SERVFAIL, one that never answers, and one that publishes a peer's name at another pod's address all end
//! in `wait`: `init` forms no cluster on what DNS failed to say.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Output;

use harness::logs::dry_run_decision;
use harness::loopback::{empty_report, fake_sidecar, Set};
use harness::Etcd;
use tokio::net::UdpSocket;

/// The agent under test.
const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");

/// A DNS server on loopback that answers every query with SERVFAIL (`servfail`), or
/// reads queries and never answers. Returns its address.
async fn broken_dns(servfail: bool) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            if !servfail || n < 12 {
                continue;
            }
            // The query itself, turned into a response (QR, RA) with RCODE 2 (SERVFAIL)
            // and no answers: the question section is echoed as DNS requires.
            let mut answer = buf[..n].to_vec();
            answer[2] |= 0x80;
            answer[3] = (answer[3] & 0x70) | 0x80 | 0x02;
            let _ = socket.send_to(&answer, from).await;
        }
    });
    addr
}

async fn dry_run_with_dns(dns: SocketAddr, data_dir: &std::path::Path) -> Output {
    tokio::process::Command::new(STEWARD)
        .args(["init", "--dry-run", "--name=etcd-0", "--replicas=3"])
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--dns-server={dns}"))
        .arg("--listen-ip=127.0.0.1")
        .env("ETCD_STEWARD_LOG", "off")
        .env_remove("HOSTNAME")
        .output()
        .await
        .unwrap()
}

fn waits_on_dns(out: &Output) -> String {
    let decision = dry_run_decision(out).unwrap();
    assert_eq!(decision["action"], "wait", "{decision}");
    let reason = decision["reason"].as_str().unwrap().to_string();
    assert!(reason.contains("DNS lookup failed"), "{reason}");
    reason
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_refusing_queries_means_wait_and_a_dry_run_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 9: every query is refused.
    let out = dry_run_with_dns("127.0.0.1:9".parse().unwrap(), dir.path()).await;
    waits_on_dns(&out);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a dry run writes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_answering_servfail_means_wait_never_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let out = dry_run_with_dns(broken_dns(true).await, dir.path()).await;
    waits_on_dns(&out);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_that_never_answers_means_wait_never_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let out = dry_run_with_dns(broken_dns(false).await, dir.path()).await;
    let reason = waits_on_dns(&out);
    assert!(
        reason.contains("etcd-1") && reason.contains("etcd-2"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_answering_a_wrong_address_means_wait_never_bootstrap() {
    let mut set = Set::new(STEWARD, Etcd::V3_5, 3).await.unwrap();
    for o in 0..3 {
        set.set_dns(o, true).unwrap();
    }
    fake_sidecar(&set, 1, empty_report("etcd-1")).await.unwrap();
    fake_sidecar(&set, 2, empty_report("etcd-2")).await.unwrap();
    // Every peer answers empty at its own address: this is the proof a bootstrap needs.
    let control = set.dry_run(0).await.unwrap();
    assert_eq!(control["action"], "bootstrap", "{control}");

    // etcd-1's name now points at etcd-2: the answer comes from the wrong pod, so etcd-1
    // has said nothing about its volume.
    let wrong = set.pod(2).ip;
    set.set_dns_address(1, Some(wrong)).unwrap();
    let decision = set.dry_run(0).await.unwrap();
    assert_eq!(decision["action"], "wait", "{decision}");
    let reason = decision["reason"].as_str().unwrap();
    assert!(
        reason.contains("etcd-1: sidecar did not answer") && reason.contains("etcd-2"),
        "{reason}"
    );
    set.shutdown().await;
}
