//! A bounded HTTP/1 GET: one connection, a deadline for the whole exchange, and a cap on
//! the body, for talking to peers' sidecars and etcd's peer API.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;

/// Why a GET got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GetError {
    /// Nothing listens at the address.
    #[error("connection to {0} refused")]
    Refused(SocketAddr),
    #[error("{0}")]
    Failed(String),
}

/// GETs `path` from `addr` (with `Host: host`) over plain HTTP; returns status and body.
pub async fn get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Result<(u16, Vec<u8>), GetError> {
    get_with(addr, host, path, timeout, max_body, None).await
}

/// As [`get`], over TLS when `tls` is given: the server's certificate must be valid for
/// `host` under that configuration's roots, and we present its client certificate.
pub async fn get_with(
    addr: SocketAddr,
    host: &str,
    path: &str,
    timeout: Duration,
    max_body: usize,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<(u16, Vec<u8>), GetError> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionRefused => GetError::Refused(addr),
                _ => GetError::Failed(format!("connect {addr}: {e}")),
            })?;
        match tls {
            None => exchange(TokioIo::new(stream), addr, host, path, max_body).await,
            Some(config) => {
                let name = ServerName::try_from(host.to_string()).map_err(|e| {
                    GetError::Failed(format!("{host:?} is not a TLS server name: {e}"))
                })?;
                let stream = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, stream)
                    .await
                    .map_err(|e| GetError::Failed(format!("TLS with {host} at {addr}: {e}")))?;
                exchange(TokioIo::new(stream), addr, host, path, max_body).await
            }
        }
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| {
        GetError::Failed(format!(
            "GET {path} from {addr}: no answer within {timeout:?}"
        ))
    })?
}

/// Asks etcd's peer API at `ip` (pod `ordinal`'s peer port) for `/version`: whether that
/// etcd serves its peers yet. With peer TLS, over mutual TLS with the peer certificate.
pub async fn etcd_peer_version(
    cfg: &crate::config::Config,
    ordinal: u32,
    ip: std::net::IpAddr,
    timeout: Duration,
) -> Result<(), GetError> {
    let id = &cfg.identity;
    let tls = cfg.peer_tls.as_ref().map(|t| t.client_config());
    get_with(
        SocketAddr::new(ip, id.peer_port),
        &id.host(ordinal),
        "/version",
        timeout,
        4096,
        tls.as_ref(),
    )
    .await
    .map(|_| ())
}

async fn exchange<S>(
    io: TokioIo<S>,
    addr: SocketAddr,
    host: &str,
    path: &str,
    max_body: usize,
) -> Result<(u16, Vec<u8>), GetError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| GetError::Failed(format!("handshake with {addr}: {e}")))?;
    let conn = tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .body(Empty::<Bytes>::new())
        .map_err(|e| GetError::Failed(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| GetError::Failed(format!("GET {path} from {addr}: {e}")))?;
    let status = resp.status().as_u16();
    let body = Limited::new(resp.into_body(), max_body)
        .collect()
        .await
        .map_err(|e| GetError::Failed(format!("reading {path} from {addr}: {e}")))?
        .to_bytes();
    conn.abort();
    Ok((status, body.to_vec()))
}
