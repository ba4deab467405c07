//! moto's S3-compatible server (its server mode) on a loopback port, shared by the S3 tests
//! of one test process (`tests/backup.rs`, `tests/backup_cluster.rs`).
//!
//! It is started once, on first use, and stops when the test process exits (it runs until
//! its standard input closes). The `AWS_*` variables an S3 store reads, and every sidecar
//! inherits, are set once, before the first bucket is created.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The port of this process's moto server, starting it on first use.
///
/// Panics, saying how to install it, when python3 with `moto[server]` is missing
/// (`scripts/install-test-deps.sh`), or when the server does not start.
pub fn port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap_or_else(|e| panic!("no free loopback port for moto: {e}"))
            .port();
        let script = format!(
            "import sys\nfrom moto.server import ThreadedMotoServer\n\
             s = ThreadedMotoServer(ip_address='127.0.0.1', port={port}, verbose=False)\n\
             s.start()\nprint('up', flush=True)\nsys.stdin.read()\ns.stop()\n"
        );
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("python3 with moto[server] (scripts/install-test-deps.sh): {e}")
            });
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        assert_eq!(line.trim(), "up", "moto server did not start");
        // Keep its stdin open for the life of the process: leak the child.
        std::mem::forget(child);
        for (k, v) in [
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", &format!("http://127.0.0.1:{port}")),
            ("AWS_ALLOW_HTTP", "true"),
        ] {
            std::env::set_var(k, v);
        }
        port
    })
}

/// Creates `bucket` on the moto server (starting it on first use); the URL of `prefix` in
/// it: `s3://<bucket>/<prefix>`.
pub fn s3_url(bucket: &str, prefix: &str) -> String {
    let port = port();
    let created = Command::new("curl")
        .args([
            "-sf",
            "-X",
            "PUT",
            &format!("http://127.0.0.1:{port}/{bucket}"),
        ])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(created, "cannot create bucket {bucket}");
    format!("s3://{bucket}/{prefix}")
}
