//! The project's test API server (`tests/kube-apiserver/`, built by
//! `scripts/build-test-apiserver.sh`): Kubernetes' own API server libraries — the generic
//! server, its etcd3 storage and the watch cache in front of it — serving core/v1 Pods,
//! apps/v1 StatefulSets, events.k8s.io/v1 Events, coordination.k8s.io/v1 Leases and
//! CustomResourceDefinitions from the etcd endpoints it is given, over https with a
//! self-signed certificate, clients authenticated by bearer token.
//!
//! Three tokens ([`Token`]): an administrator's (system:masters), a reader's (get, list and
//! watch only) and a nobody's (refused everything with 403, as RBAC refuses a
//! ServiceAccount without a role).
//!
//! Found at `$STEWARD_TEST_APISERVER` or `.tools/steward-test-apiserver` of the checkout.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::{Error, Result};

/// Who a client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// system:masters: anything.
    Admin,
    /// get, list and watch only.
    Reader,
    /// nothing: every request is refused with 403.
    Nobody,
}

impl Token {
    fn value(self) -> &'static str {
        match self {
            Token::Admin => "steward-test-admin",
            Token::Reader => "steward-test-reader",
            Token::Nobody => "steward-test-nobody",
        }
    }
}

/// How the API server reaches etcd.
#[derive(Debug, Clone, Default)]
pub struct EtcdAccess {
    /// The client URLs (`--etcd-servers`).
    pub servers: Vec<String>,
    /// For https: the CA, and the client certificate and key.
    pub tls: Option<(PathBuf, PathBuf, PathBuf)>,
}

/// A running test API server; killed when dropped.
pub struct KubeApiServer {
    child: tokio::process::Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    /// The URL clients use.
    pub url: String,
}

/// The built server: `$STEWARD_TEST_APISERVER`, or `.tools/steward-test-apiserver` of the
/// checkout.
pub fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("STEWARD_TEST_APISERVER") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.tools/steward-test-apiserver")
        .to_path_buf()
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(Error::io("binding a port for the API server"))?;
    let port = l
        .local_addr()
        .map_err(Error::io("the API server's port"))?
        .port();
    Ok(port)
}

impl KubeApiServer {
    /// Starts the API server on `etcd` and waits until its `/readyz` passes.
    pub async fn start(etcd: &EtcdAccess) -> Result<KubeApiServer> {
        Self::start_with(etcd, &[]).await
    }

    /// [`KubeApiServer::start`] with more of kube-apiserver's generic flags (for example
    /// `--etcd-compaction-interval=2s`).
    pub async fn start_with(etcd: &EtcdAccess, more: &[&str]) -> Result<KubeApiServer> {
        let bin = binary();
        if !bin.exists() {
            return Err(Error::Failed(format!(
                "no test API server at {} (scripts/build-test-apiserver.sh builds it; \
                 $STEWARD_TEST_APISERVER names another)",
                bin.display()
            )));
        }
        let dir = tempfile::tempdir().map_err(Error::io("the API server's directory"))?;
        let tokens = dir.path().join("tokens.csv");
        let csv = [
            (Token::Admin, "admin", "system:masters"),
            (Token::Reader, "reader", "steward:read-only"),
            (Token::Nobody, "nobody", "steward:nothing"),
        ]
        .iter()
        .enumerate()
        .map(|(i, (t, user, group))| format!("{},{user},{i},\"{group}\"\n", t.value()))
        .collect::<String>();
        std::fs::write(&tokens, csv).map_err(Error::io("writing the API server's tokens"))?;
        for t in [Token::Admin, Token::Reader, Token::Nobody] {
            std::fs::write(dir.path().join(format!("{t:?}.token")), t.value())
                .map_err(Error::io("writing a token file"))?;
        }
        let port = free_port()?;
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.arg(format!("--etcd-servers={}", etcd.servers.join(",")))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", dir.path().join("certs").display()))
            .arg(format!("--token-auth-file={}", tokens.display()))
            // As kube-apiserver's default: the watch cache in front of etcd.
            .arg("--watch-cache=true")
            .args(more);
        if let Some((ca, cert, key)) = &etcd.tls {
            cmd.arg(format!("--etcd-cafile={}", ca.display()))
                .arg(format!("--etcd-certfile={}", cert.display()))
                .arg(format!("--etcd-keyfile={}", key.display()));
        }
        let log = std::fs::File::create(dir.path().join("apiserver.log"))
            .map_err(Error::io("the API server's log"))?;
        let err = log.try_clone().map_err(Error::io("the API server's log"))?;
        cmd.stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            program: bin.clone(),
            source,
        })?;
        let server = KubeApiServer {
            child,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            dir,
            url: format!("https://127.0.0.1:{port}"),
        };
        server.wait_ready(Duration::from_secs(60)).await?;
        Ok(server)
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA of its serving certificate (the bundle it wrote: its certificate and its CA).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("certs/apiserver.crt")
    }

    /// A file holding `token`, for the agent's `--kube-token-file`.
    pub fn token_file(&self, token: Token) -> PathBuf {
        self.dir.path().join(format!("{token:?}.token"))
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default()
    }

    /// A client as `token`.
    pub fn client(&self, token: Token) -> Result<kube::Client> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pem = std::fs::read(self.ca_file()).map_err(Error::io("the API server's CA"))?;
        let roots = rustls_pki_types::pem::PemObject::pem_slice_iter(&pem)
            .filter_map(
                |c: std::result::Result<rustls_pki_types::CertificateDer<'static>, _>| c.ok(),
            )
            .map(|c| c.as_ref().to_vec())
            .collect();
        let uri = self
            .url
            .parse()
            .map_err(|e| Error::Failed(format!("the API server's URL: {e}")))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        config.root_cert = Some(roots);
        config.auth_info.token = Some(token.value().to_string().into());
        config.read_timeout = Some(Duration::from_secs(30));
        kube::Client::try_from(config)
            .map_err(|e| Error::Failed(format!("a client of the test API server: {e}")))
    }

    /// `/readyz` as the administrator: its status code and body (`None`: no answer).
    pub async fn readyz(&self) -> Option<(u16, String)> {
        let client = self.client(Token::Admin).ok()?;
        let req = http::Request::get("/readyz?verbose")
            .body(Vec::new())
            .ok()?;
        match tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await {
            Ok(Ok(body)) => Some((200, body)),
            Ok(Err(kube::Error::Api(s))) => Some((s.code, s.message)),
            _ => None,
        }
    }

    /// Waits until `/readyz` passes and a list of Pods answers (right after a start, lists
    /// can answer 429 while the watch cache initializes).
    pub async fn wait_ready(&self, within: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            // The serving certificate is written once the server has started.
            if let Ok(client) = self.client(Token::Admin) {
                let pods: Api<Pod> = Api::namespaced(client, "default");
                if self.readyz().await.is_some_and(|(c, _)| c == 200)
                    && pods.list(&ListParams::default().limit(1)).await.is_ok()
                {
                    return Ok(start.elapsed());
                }
            }
            if start.elapsed() > within {
                return Err(Error::Failed(format!(
                    "the test API server was not ready within {within:?}; its log:\n{}",
                    tail(&self.log(), 40)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}
