//! The real sidecar process under abuse: huge headers, slow clients, wrong methods, a
//! flood of idle connections. It answers with limits and time-outs, stays alive, keeps
//! serving probes, and stops cleanly on SIGTERM. No etcd is needed: liveness then says
//! etcd is not running yet, which is itself a 200.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

struct Sidecar {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

async fn sidecar(ip: &str) -> Sidecar {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_etcd-steward"))
        .args([
            "sidecar",
            "--name=etcd-0",
            "--replicas=1",
            "--dns-server=127.0.0.1:9",
        ])
        .arg(format!("--listen-ip={ip}"))
        .arg(format!("--data-dir={}", dir.path().display()))
        .env("ETCD_STEWARD_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("{ip}:8080").parse().unwrap();
    let s = Sidecar {
        child,
        addr,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while healthz(s.addr).await != Some(200) {
        assert!(Instant::now() < deadline, "sidecar did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s
}

async fn healthz(addr: SocketAddr) -> Option<u16> {
    etcd_steward::http_get::get(addr, "x", "/healthz", Duration::from_secs(1), 4096)
        .await
        .ok()
        .map(|(s, _)| s)
}

/// Sends raw bytes and returns what came back before the server closed (or 5 s passed).
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(request).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test]
async fn huge_headers_are_refused_and_probes_go_on() {
    let s = sidecar("127.0.19.10").await;
    let big = "a".repeat(200 * 1024);
    let answer = raw(
        s.addr,
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(
        !answer.starts_with("HTTP/1.1 200"),
        "a 200 KiB header was accepted: {answer:.80}"
    );
    assert_eq!(healthz(s.addr).await, Some(200));
}

#[tokio::test]
async fn a_slow_client_is_cut_off_by_the_header_timeout() {
    let s = sidecar("127.0.19.11").await;
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 512];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the half-sent request was never cut off");
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(healthz(s.addr).await, Some(200));
}

#[tokio::test]
async fn wrong_methods_get_405() {
    let s = sidecar("127.0.19.12").await;
    for method in ["POST", "PUT", "DELETE"] {
        let answer = raw(s.addr, format!("{method} /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 405"), "{method}: {answer:.80}");
    }
}

#[tokio::test]
async fn a_flood_of_idle_connections_does_not_stop_the_probes() {
    let mut s = sidecar("127.0.19.13").await;
    let mut idle = Vec::new();
    for _ in 0..800 {
        if let Ok(c) = TcpStream::connect(s.addr).await {
            idle.push(c);
        }
    }
    // Probes keep answering while the flood holds its connections, or at the latest once
    // the header timeout has reclaimed them.
    let deadline = Instant::now() + Duration::from_secs(8);
    while healthz(s.addr).await != Some(200) {
        assert!(
            Instant::now() < deadline,
            "probes starved by idle connections"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "the sidecar is alive"
    );
    drop(idle);
}

#[tokio::test]
async fn sigterm_stops_the_sidecar_cleanly() {
    let mut s = sidecar("127.0.19.14").await;
    let pid = s.child.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(8), s.child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
}
