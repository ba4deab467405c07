//! Talking to pods: etcd clients (one per endpoint, kept while it works) and GETs from a
//! sidecar's HTTP port.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, Member, StatusResponse, TlsOptions};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::{Error, Result};

/// The etcd clients of one set of pods: with `reuse`, one per endpoint kept until a call
/// through it fails (the benchmark: reconnecting for every poll would add the connection to
/// what is measured); without, a new client for every call (the tests: each question is
/// asked afresh, as a new client of the cluster would).
pub struct Clients {
    connect_timeout: Duration,
    timeout: Duration,
    tls: Option<TlsOptions>,
    reuse: bool,
    cache: Mutex<HashMap<String, Client>>,
}

impl Clients {
    /// Clients that give up connecting after `connect_timeout` and a call after `timeout`;
    /// with `tls`, over TLS; kept per endpoint with `reuse`.
    pub fn new(
        connect_timeout: Duration,
        timeout: Duration,
        tls: Option<TlsOptions>,
        reuse: bool,
    ) -> Clients {
        Clients {
            connect_timeout,
            timeout,
            tls,
            reuse,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Connects over `tls` from now on (the certificates were replaced); drops kept clients.
    pub fn set_tls(&mut self, tls: Option<TlsOptions>) {
        self.tls = tls;
        if let Ok(mut m) = self.cache.lock() {
            m.clear();
        }
    }

    /// Connection options with a call time-out of `timeout`.
    pub fn options(&self, timeout: Duration) -> ConnectOptions {
        let opts = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(timeout);
        match &self.tls {
            Some(tls) => opts.with_tls(tls.clone()),
            None => opts,
        }
    }

    /// A client balanced over `urls` (not kept).
    pub async fn connect(&self, urls: &[String], timeout: Duration) -> Result<Client> {
        Client::connect(urls, Some(self.options(timeout)))
            .await
            .map_err(|source| Error::Etcd {
                url: urls.join(","),
                source,
            })
    }

    /// The client of one endpoint.
    pub async fn get(&self, url: &str) -> Result<Client> {
        if !self.reuse {
            return self.connect(&[url.to_string()], self.timeout).await;
        }
        if let Some(c) = self.cache.lock().ok().and_then(|m| m.get(url).cloned()) {
            return Ok(c);
        }
        let c = self.connect(&[url.to_string()], self.timeout).await?;
        if let Ok(mut m) = self.cache.lock() {
            m.insert(url.to_string(), c.clone());
        }
        Ok(c)
    }

    /// Drops the client of one endpoint (its pod was killed, or a call failed).
    pub fn forget(&self, url: &str) {
        if let Ok(mut m) = self.cache.lock() {
            m.remove(url);
        }
    }

    /// Runs one call on the endpoint's client, bounded by the call time-out plus a second;
    /// a failed call drops the client.
    async fn call<T, F, Fut>(&self, url: &str, f: F) -> Result<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let c = self.get(url).await?;
        let after = self.timeout + Duration::from_secs(1);
        let r = match tokio::time::timeout(after, f(c)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(source)) => Error::Etcd {
                url: url.to_string(),
                source,
            },
            Err(_) => Error::Unanswered {
                url: url.to_string(),
                after,
            },
        };
        self.forget(url);
        Err(r)
    }

    /// The endpoint's status.
    pub async fn status(&self, url: &str) -> Result<StatusResponse> {
        self.call(url, |mut c| async move { c.status().await })
            .await
    }

    /// The member list as the endpoint sees it.
    pub async fn members(&self, url: &str) -> Result<Vec<Member>> {
        self.call(url, |mut c| async move {
            c.member_list().await.map(|r| r.members().to_vec())
        })
        .await
    }

    /// The endpoint's own member ID.
    pub async fn member_id(&self, url: &str) -> Result<u64> {
        let s = self.status(url).await?;
        header(url, &s).map(|h| h.member_id())
    }

    /// The ID of the cluster the endpoint belongs to.
    pub async fn cluster_id(&self, url: &str) -> Result<u64> {
        let s = self.status(url).await?;
        header(url, &s).map(|h| h.cluster_id())
    }

    /// How many keys under `prefix` the endpoint holds in its own copy (serializable).
    pub async fn count_keys(&self, url: &str, prefix: &str) -> Result<i64> {
        let prefix = prefix.to_string();
        self.call(url, |mut c| async move {
            let opts = GetOptions::new()
                .with_prefix()
                .with_count_only()
                .with_serializable();
            c.get(prefix, Some(opts)).await.map(|r| r.count())
        })
        .await
    }
}

fn header<'a>(url: &str, s: &'a StatusResponse) -> Result<&'a etcd_client::ResponseHeader> {
    s.header()
        .ok_or_else(|| Error::Failed(format!("etcd at {url} answered a status without header")))
}

/// The value of `series` (a metric's name, with its labels if it has any) in a Prometheus
/// text exposition such as a sidecar's `/metrics`; `None` when it is not there.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (s, v) = l.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok()).flatten()
    })
}

/// GETs `path` from a plain HTTP port (a sidecar's, etcd's metrics): (status, body),
/// `None` when it does not answer within `timeout` or answers more than `max_body` bytes.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Option<(u16, String)> {
    tokio::time::timeout(timeout, exchange(addr, path, max_body))
        .await
        .ok()
        .flatten()
}

async fn exchange(addr: SocketAddr, path: &str, max_body: usize) -> Option<(u16, String)> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, "harness")
        .body(Empty::<Bytes>::new())
        .ok()?;
    let resp = sender.send_request(req).await.ok()?;
    let status = resp.status().as_u16();
    let body = http_body_util::Limited::new(resp.into_body(), max_body)
        .collect()
        .await
        .ok()?
        .to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}
