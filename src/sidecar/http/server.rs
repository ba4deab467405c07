//! The sidecar's HTTP listener: plain for kubelet, or mutual TLS for peer reports, with
//! limits so that abuse (huge headers, slow or idle clients, floods) costs a connection,
//! never the agent: headers must arrive within a few seconds and fit a small buffer, a
//! whole exchange is bounded in time, past [`Limits::max_connections`] at once new ones are
//! shed, and accept errors (e.g. out of descriptors) back off.

use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::tls::TlsMaterial;

/// Limits every connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time from accept to a complete request head (slowloris, idle keep-alive).
    pub header_read_timeout: Duration,
    /// Longest life of one connection.
    pub connection_timeout: Duration,
    /// Largest request head accepted (bytes); larger ones get 431 or a closed connection.
    pub max_buf_size: usize,
    /// Time allowed for a TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Connections served at once; past it, a new one is accepted and closed at once (shed,
    /// not queued: a probe behind a flood is refused and asked again, never left waiting
    /// behind hundreds of idle connections), so a flood costs refusals, not memory.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(3),
            connection_timeout: Duration::from_secs(15),
            max_buf_size: 16 * 1024,
            tls_handshake_timeout: Duration::from_secs(3),
            max_connections: 512,
        }
    }
}

/// Serves `app` on `listener` until `stop` turns true; over mutual TLS when `tls` is given:
/// each handshake presents the certificate its files hold then and admits only clients
/// certified by the CA they hold then (rotated files are used from the next connection).
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsMaterial>,
    app: axum::Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // EMFILE under a flood: wait for connections to time out, stay alive.
                    tracing::warn!(error = %e, "accept failed; backing off");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Every slot taken: shed this one (dropped: closed).
            drop(tcp);
            continue;
        };
        let acceptor = tls
            .as_ref()
            .map(|m| tokio_rustls::TlsAcceptor::from(m.server_config()));
        let app = app.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = TowerToHyperService::new(app);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(limits.max_buf_size);
            match acceptor {
                None => {
                    let conn = builder.serve_connection(TokioIo::new(tcp), service);
                    let _ = tokio::time::timeout(limits.connection_timeout, conn).await;
                }
                Some(acceptor) => {
                    let tls = match tokio::time::timeout(
                        limits.tls_handshake_timeout,
                        acceptor.accept(tcp),
                    )
                    .await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "refused a TLS client without a valid peer certificate");
                            return;
                        }
                        Err(_) => return,
                    };
                    let conn = builder.serve_connection(TokioIo::new(tls), service);
                    let _ = tokio::time::timeout(limits.connection_timeout, conn).await;
                }
            }
        });
    }
}
