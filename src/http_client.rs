//! A bounded HTTP/1 GET (and a small JSON POST): one connection, a deadline for the whole exchange, and a cap on
//! the body, for talking to peers' sidecars and etcd's peer API.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Either, Empty, Full, Limited};
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
    send(addr, host, path, None, timeout, max_body, tls).await
}

/// A POST's JSON body and its `Authorization` header, if any.
pub struct Post {
    pub body: Vec<u8>,
    pub authorization: Option<String>,
}

/// POSTs the JSON `post.body` to `path` (as [`get_with`] GETs), with its `Authorization`
/// header when given.
pub async fn post_json(
    addr: SocketAddr,
    host: &str,
    path: &str,
    post: Post,
    timeout: Duration,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<(u16, Vec<u8>), GetError> {
    send(addr, host, path, Some(post), timeout, 16 * 1024, tls).await
}

async fn send(
    addr: SocketAddr,
    host: &str,
    path: &str,
    post: Option<Post>,
    timeout: Duration,
    max_body: usize,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<(u16, Vec<u8>), GetError> {
    let method = if post.is_some() { "POST" } else { "GET" };
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionRefused => GetError::Refused(addr),
                _ => GetError::Failed(format!("connect {addr}: {e}")),
            })?;
        match tls {
            None => exchange(TokioIo::new(stream), addr, host, path, post, max_body).await,
            Some(config) => {
                let name = ServerName::try_from(host.to_string()).map_err(|e| {
                    GetError::Failed(format!("{host:?} is not a TLS server name: {e}"))
                })?;
                let stream = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, stream)
                    .await
                    .map_err(|e| GetError::Failed(format!("TLS with {host} at {addr}: {e}")))?;
                exchange(TokioIo::new(stream), addr, host, path, post, max_body).await
            }
        }
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| {
        GetError::Failed(format!(
            "{method} {path} to {addr}: no answer within {timeout:?}"
        ))
    })?
}

/// Asks etcd's peer API at `ip` (pod `ordinal`'s peer port) for `/version`: whether that
/// etcd serves its peers yet. With peer TLS, over mutual TLS with the peer certificate.
pub async fn etcd_peer_version(
    id: &crate::identity::Identity,
    peer_tls: Option<&crate::tls::TlsMaterial>,
    ordinal: u32,
    ip: std::net::IpAddr,
    timeout: Duration,
) -> Result<(), GetError> {
    let tls = peer_tls.map(|t| t.client_config());
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
    post: Option<Post>,
    max_body: usize,
) -> Result<(u16, Vec<u8>), GetError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| GetError::Failed(format!("handshake with {addr}: {e}")))?;
    let conn = tokio::spawn(conn);
    let req = match post {
        None => hyper::Request::get(path)
            .header(hyper::header::HOST, host)
            .body(Either::Left(Empty::<Bytes>::new())),
        Some(post) => {
            let mut req = hyper::Request::post(path)
                .header(hyper::header::HOST, host)
                .header(hyper::header::CONTENT_TYPE, "application/json");
            if let Some(a) = post.authorization {
                req = req.header(hyper::header::AUTHORIZATION, a);
            }
            req.body(Either::Right(Full::new(Bytes::from(post.body))))
        }
    }
    .map_err(|e| GetError::Failed(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| GetError::Failed(format!("{path} at {addr}: {e}")))?;
    let status = resp.status().as_u16();
    let body = Limited::new(resp.into_body(), max_body)
        .collect()
        .await
        .map_err(|e| GetError::Failed(format!("reading {path} from {addr}: {e}")))?
        .to_bytes();
    conn.abort();
    Ok((status, body.to_vec()))
}
