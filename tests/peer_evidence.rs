//! Peer reports are the evidence for forming a cluster, so only sound evidence counts.
//! With peer TLS on it is authenticated: only a holder of a certificate from the peer CA
//! can read a pod's report, and a pod believes only reports served with a peer
//! certificate. Peers that answer garbage, answer too slowly, or answer for another
//! cluster's data never lead to a bootstrap either.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::routing::get;
use etcd_steward::http_client::get_with;
use etcd_steward::report::parse_report;
use etcd_steward::tls::{TlsFiles, TlsMaterial};
use harness::loopback::{empty_report, fake_sidecar, Set};
use harness::pki::Pki;
use harness::{wait_for, Etcd};

/// The agent under test.
const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");

/// A loaded certificate/key/CA triple, e.g. ("peer", "peer-ca") or ("outsider", "peer-ca").
fn material(pki: &Pki, cert: &str, ca: &str) -> TlsMaterial {
    TlsMaterial::load(&TlsFiles {
        cert: pki.path(&format!("{cert}.pem")),
        key: pki.path(&format!("{cert}-key.pem")),
        ca: pki.path(&format!("{ca}.pem")),
    })
    .unwrap()
}

fn report_addr(set: &Set, o: u32) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(set.pod(o).ip), 8443)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_reports_are_served_only_to_holders_of_a_peer_certificate() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Tls, 3).await.unwrap();
    set.set_dns(0, true).unwrap();
    set.start_sidecar(0).unwrap();
    let pki = set.pki.as_ref().unwrap();
    let host = set.host(0);
    let addr = report_addr(&set, 0);
    let peer = material(pki, "peer", "peer-ca").client_config();
    wait_for(Duration::from_secs(10), "the report port", || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;

    let (status, body) = get_with(
        addr,
        &host,
        "/peer/report",
        Duration::from_secs(3),
        1 << 16,
        Some(&peer),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert!(!parse_report(&body, "etcd-0").unwrap().has_data);

    // No certificate, a certificate from the client CA, one from another CA: refused.
    assert!(get_with(
        addr,
        &host,
        "/peer/report",
        Duration::from_secs(3),
        1 << 16,
        None
    )
    .await
    .is_err());
    // (a client that trusts the peer CA for the server but presents another CA's certificate)
    let client_side = material(pki, "client", "peer-ca").client_config();
    assert!(get_with(
        addr,
        &host,
        "/peer/report",
        Duration::from_secs(3),
        1 << 16,
        Some(&client_side)
    )
    .await
    .is_err());
    let outsider = material(pki, "outsider", "peer-ca").client_config();
    assert!(get_with(
        addr,
        &host,
        "/peer/report",
        Duration::from_secs(3),
        1 << 16,
        Some(&outsider)
    )
    .await
    .is_err());

    // The kubelet-facing port serves no report.
    let plain = SocketAddr::new(IpAddr::V4(set.pod(0).ip), 8080);
    let (status, _) = etcd_steward::http_client::get(
        plain,
        &host,
        "/peer/report",
        Duration::from_secs(3),
        1 << 16,
    )
    .await
    .unwrap();
    assert_eq!(status, 404);
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impostors_claiming_empty_volumes_cannot_trigger_a_bootstrap() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Tls, 3).await.unwrap();
    for o in 0..3 {
        set.set_dns(o, true).unwrap();
    }
    set.start_sidecar(0).unwrap();
    // etcd-1: an impostor answering in plain HTTP on the report port.
    let plain = tokio::net::TcpListener::bind(report_addr(&set, 1))
        .await
        .unwrap();
    let body1 = empty_report("etcd-1");
    let fake = axum::Router::new().route("/peer/report", get(move || async move { body1 }));
    tokio::spawn(async move { axum::serve(plain, fake).await });
    // etcd-2: an impostor speaking TLS with a certificate from another CA.
    let tls = tokio::net::TcpListener::bind(report_addr(&set, 2))
        .await
        .unwrap();
    let outsider = material(set.pki.as_ref().unwrap(), "outsider", "peer-ca");
    let body2 = empty_report("etcd-2");
    let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let app = axum::Router::new().route("/peer/report", get(move || async move { body2 }));
    let limits = etcd_steward::sidecar::server::Limits::default();
    let impostor = etcd_steward::sidecar::server::serve(tls, Some(outsider), app, limits, stop_rx);
    tokio::spawn(impostor);

    let decision = set.dry_run(0).await.unwrap();
    assert_eq!(decision["action"], "wait", "{decision}");
    let reason = decision["reason"].as_str().unwrap();
    assert!(
        reason.contains("etcd-1: sidecar did not answer"),
        "{reason}"
    );
    assert!(
        reason.contains("etcd-2: sidecar did not answer"),
        "{reason}"
    );
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_silent_peers_mean_wait() {
    let mut set = Set::new(STEWARD, Etcd::V3_5, 3).await.unwrap();
    for o in 0..3 {
        set.set_dns(o, true).unwrap();
    }
    fake_sidecar(&set, 1, "<html>not a report</html>".into())
        .await
        .unwrap();
    // etcd-2 accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(set.pod(2).ip), 8080))
        .await
        .unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
        }
    });
    let decision = set.dry_run(0).await.unwrap();
    assert_eq!(decision["action"], "wait", "{decision}");
    let reason = decision["reason"].as_str().unwrap();
    assert!(
        reason.contains("etcd-1: sidecar did not answer: peer report is not valid JSON"),
        "{reason}"
    );
    assert!(
        reason.contains("etcd-2: sidecar did not answer") && reason.contains("no answer within"),
        "{reason}"
    );
    set.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_holding_another_clusters_data_means_wait() {
    let mut set = Set::new(STEWARD, Etcd::V3_5, 3).await.unwrap();
    for o in 0..3 {
        set.set_dns(o, true).unwrap();
    }
    let foreign = serde_json::json!({
        "name": "etcd-1", "has_data": true,
        "wal": {"member_id": "1234abcd", "cluster_id": "feedbeef"},
        "wal_error": null, "formation": null,
    });
    fake_sidecar(&set, 1, foreign.to_string()).await.unwrap();
    fake_sidecar(&set, 2, empty_report("etcd-2")).await.unwrap();
    let decision = set.dry_run(0).await.unwrap();
    assert_eq!(decision["action"], "wait", "{decision}");
    let reason = decision["reason"].as_str().unwrap();
    assert!(
        reason.contains("etcd-1 (member 1234abcd of cluster feedbeef)"),
        "{reason}"
    );
    set.shutdown().await;
}

/// 127.0.`STEWARD_TEST_NET`.`last`: an address of this run's network no set uses.
fn own_ip(last: u8) -> IpAddr {
    let net = std::env::var("STEWARD_TEST_NET")
        .ok()
        .and_then(|n| n.parse::<u8>().ok())
        .filter(|n| (20..=200).contains(n))
        .unwrap_or(20);
    IpAddr::from([127, 0, net, last])
}

/// Serves `body` as `/peer/report` on `ip:port`.
async fn serve_report(ip: IpAddr, port: u16, body: String) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, port))
        .await
        .unwrap();
    let app = axum::Router::new().route("/peer/report", get(move || async move { body }));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

fn reports_config(extra: &[String]) -> etcd_steward::config::Config {
    use clap::Parser;
    let dir = std::env::temp_dir();
    let mut args: Vec<String> = ["etcd-steward", "status", "--name=etcd-0", "--replicas=3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(format!("--data-dir={}", dir.display()));
    args.extend(extra.iter().cloned());
    let cli = etcd_steward::config::Cli::try_parse_from(args).unwrap();
    let etcd_steward::config::Command::Status(a) = cli.command else {
        panic!("not the status command");
    };
    a.common.validate().unwrap()
}

/// Without peer TLS a pod asks a peer's peer-report port (8443) first, and its probe port
/// (8080) only when nothing listens on 8443: a pod of the previous release, which serves
/// its report on 8080 only, is still read during a rolling upgrade. With peer TLS, reports
/// are only ever read over mutual TLS on 8443.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_asked_on_the_peer_report_port_first_and_on_the_probe_port_only_when_nothing_listens_there(
) {
    use etcd_steward::observe::PeerReports;
    let timeout = Duration::from_secs(3);
    let reports = reports_config(&[]).peer_reports();

    // A pod of this release: its 8443 answers, and 8080 (garbage here) is never asked.
    let new = own_ip(242);
    let _a = serve_report(new, 8443, empty_report("etcd-1")).await;
    let _b = serve_report(new, 8080, "garbage".into()).await;
    let r = reports.report("etcd-1", "etcd-1", new, timeout).await;
    assert_eq!(r.map(|r| r.has_data), Ok(false), "read from 8443");

    // A pod of the previous release: nothing on 8443, its report on 8080.
    let old = own_ip(243);
    let _c = serve_report(old, 8080, empty_report("etcd-2")).await;
    let r = reports.report("etcd-2", "etcd-2", old, timeout).await;
    assert_eq!(
        r.map(|r| r.name),
        Ok("etcd-2".to_string()),
        "read from 8080"
    );

    // With peer TLS there is no plain fallback: an 8080 report is not evidence.
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path(), "etcd", "default", "cluster.local").unwrap();
    let tls_args: Vec<String> = pki
        .args()
        .into_iter()
        .filter(|a| a.starts_with("--peer-"))
        .collect();
    let tls_reports = reports_config(&tls_args).peer_reports();
    let r = tls_reports.report("etcd-2", "etcd-2", old, timeout).await;
    assert!(
        r.is_err(),
        "with peer TLS a plain 8080 report was taken: {r:?}"
    );
}
