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
    etcd_steward::http_client::get(addr, "x", "/healthz", Duration::from_secs(1), 4096)
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
    // At most 512 are served at once: the others were closed as they came (EOF at once).
    let mut shed = 0;
    for c in &idle {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(20), c.peek(&mut byte)).await
        {
            shed += 1;
        }
    }
    assert!(
        (800 - 512..800).contains(&shed),
        "{shed} of 800 idle connections closed at once: want every one past the 512 served"
    );
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

/// This file's address for a test with a real etcd: 127.0.`STEWARD_TEST_NET`.`last`, apart
/// from the networks other runs on the machine use.
fn own_ip(last: u8) -> String {
    let net = std::env::var("STEWARD_TEST_NET")
        .ok()
        .and_then(|n| n.parse::<u8>().ok())
        .filter(|n| (20..=200).contains(n))
        .unwrap_or(19);
    format!("127.0.{net}.{last}")
}

async fn post(addr: SocketAddr, path: &str, bearer: Option<&str>, body: String) -> (u16, String) {
    let post = etcd_steward::http_client::Post {
        body: body.into_bytes(),
        authorization: bearer.map(|t| format!("Bearer {t}")),
    };
    let (status, body) = etcd_steward::http_client::post_json(
        addr,
        "etcd-0",
        path,
        post,
        Duration::from_secs(20),
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("POST {path} to {addr}: {e}"));
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The value of the sample `name` (with its labels) in a `/metrics` text.
fn sample(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{metrics}"))
}

/// A one-member etcd 3.5.1 on `ip` with its data in `data`, serving.
async fn start_etcd(ip: &str, data: &std::path::Path) -> Child {
    let etcd_bin = harness::Etcd::V3_5.bin();
    let (peer, client) = (format!("http://{ip}:2380"), format!("http://{ip}:2379"));
    let etcd = Command::new(&etcd_bin)
        .arg("--name=etcd-0")
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=etcd-0={peer}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client_addr: SocketAddr = format!("{ip}:2379").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let health = etcd_steward::http_client::get(
            client_addr,
            "x",
            "/health",
            Duration::from_secs(1),
            4096,
        )
        .await;
        if matches!(health, Ok((200, _))) {
            break;
        }
        assert!(Instant::now() < deadline, "etcd did not serve: {health:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    etcd
}

/// The sidecar stops etcd at most once per request ID, however often it is asked: a
/// restart of etcd afterwards (init deciding to start it again) is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_is_stopped_at_most_once_per_request_id() {
    use etcd_steward::sidecar::recovery::{Stop, Stopper};
    let ip = own_ip(241);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut etcd = start_etcd(&ip, &data).await;
    let mut stopper = Stopper::with_cooldown(&data, Duration::ZERO);
    let pid = etcd.id().unwrap();
    assert_eq!(stopper.stop("restore-1"), Stop::Signalled(pid as i32));
    let exited = tokio::time::timeout(Duration::from_secs(10), etcd.wait()).await;
    assert!(exited.is_ok(), "etcd did not stop on SIGTERM");
    // init starts etcd again (the request was not founded here, say).
    let mut again = start_etcd(&ip, &data).await;
    for _ in 0..5 {
        assert_eq!(stopper.stop("restore-1"), Stop::Done);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        again.try_wait().unwrap().is_none(),
        "etcd was stopped a second time for the same request"
    );
    let _ = again.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_fresh_control_requests_naming_a_missing_snapshot_stops_no_etcd() {
    let ip = own_ip(240);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "flood-test-token\n").unwrap();
    let etcd_bin = harness::Etcd::V3_5.bin();
    let mut etcd = start_etcd(&ip, &data).await;
    let etcd_pid = etcd.id().unwrap();
    let mut sidecar = Command::new(env!("CARGO_BIN_EXE_etcd-steward"))
        .args([
            "sidecar",
            "--name=etcd-0",
            "--replicas=1",
            "--dns-server=127.0.0.1:9",
            "--backup-interval=1h",
        ])
        .arg(format!("--listen-ip={ip}"))
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--etcd-bin={}", etcd_bin.display()))
        .arg(format!(
            "--etcdutl-bin={}",
            harness::Etcd::V3_5.offline_tool().display()
        ))
        .arg(format!("--backup-url=file://{}", store.display()))
        // etcdutl 3.5.1 cannot move a restore's revision forward.
        .arg("--restore-bump-revision=0")
        .arg(format!("--control-token-file={}", token_file.display()))
        .env("ETCD_STEWARD_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let probe: SocketAddr = format!("{ip}:8080").parse().unwrap();
    let peer_port: SocketAddr = format!("{ip}:8443").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while healthz(probe).await != Some(200) {
        assert!(Instant::now() < deadline, "sidecar did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Control requests are not served on the probe port, token or not.
    let restore = |id: String| {
        serde_json::json!({"id": id, "snapshot": "20260101T000000.000Z-r1", "expires_unix": etcd_steward::clock::unix_now() + 600}).to_string()
    };
    let recovery = |id: String| {
        serde_json::json!({"id": id, "survivor": "etcd-0", "force_lost": [], "expires_unix": etcd_steward::clock::unix_now() + 600}).to_string()
    };
    for path in ["/peer/restore", "/peer/recovery"] {
        let (status, _) = post(probe, path, Some("flood-test-token"), restore("p".into())).await;
        assert_eq!(status, 404, "{path} on the probe port");
    }

    // ~10 s of fresh requests: well-formed, authenticated, naming a snapshot that does not
    // exist (and a few recoveries this pod's own plan refuses: its cluster has quorum), with
    // unauthenticated and wrong-token ones between them.
    let started = Instant::now();
    let (mut invalid, mut unauthenticated, mut n) = (0u64, 0u64, 0u64);
    while started.elapsed() < Duration::from_secs(10) {
        n += 1;
        let (status, text) = post(
            peer_port,
            "/peer/restore",
            Some("flood-test-token"),
            restore(format!("flood-{n}")),
        )
        .await;
        assert_eq!(status, 422, "restore request {n}: {text}");
        invalid += 1;
        if n % 20 == 0 {
            let (status, text) = post(
                peer_port,
                "/peer/recovery",
                Some("flood-test-token"),
                recovery(format!("flood-recovery-{n}")),
            )
            .await;
            assert_eq!(status, 422, "recovery request {n}: {text}");
            invalid += 1;
        }
        let bearer = if n % 2 == 0 {
            None
        } else {
            Some("wrong-token")
        };
        let (status, text) = post(
            peer_port,
            "/peer/restore",
            bearer,
            restore(format!("x-{n}")),
        )
        .await;
        assert_eq!(status, 401, "{text}");
        unauthenticated += 1;
    }
    assert!(n >= 20, "only {n} requests in 10 s");
    // The loop ticks a few more times with whatever it holds: nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        etcd.try_wait().unwrap().is_none(),
        "etcd (pid {etcd_pid}) was stopped by a flood of requests naming a missing snapshot"
    );
    assert_eq!(etcd.id(), Some(etcd_pid));
    let (_, metrics) =
        etcd_steward::http_client::get(probe, "x", "/metrics", Duration::from_secs(2), 1 << 20)
            .await
            .unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    assert_eq!(
        sample(
            &metrics,
            "etcd_steward_control_requests_refused_total{reason=\"invalid\"}"
        ),
        invalid
    );
    assert_eq!(
        sample(
            &metrics,
            "etcd_steward_control_requests_refused_total{reason=\"unauthenticated\"}"
        ),
        unauthenticated
    );
    assert!(
        sidecar.try_wait().unwrap().is_none(),
        "the sidecar is alive"
    );
    let _ = sidecar.kill().await;
    let _ = etcd.kill().await;
}
