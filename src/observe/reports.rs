//! The peers' reports of their volumes, asked of their sidecars: the evidence a formation
//! and a recovery rest on. [`PeerReports`] is the narrow trait; [`HttpReports`] asks over
//! HTTP (mutual TLS with peer TLS on).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::versions::parse_peer_version;
use crate::facts::{PeerReport, PeerVersion};
use crate::http_client;
use crate::report::{parse_report, MAX_REPORT_BYTES};

/// Asks a peer's sidecar for its report of its volume: the evidence a formation rests on.
pub trait PeerReports: Send + Sync {
    /// The report of pod `name` (DNS name `host`) at `ip`, or why there is none.
    fn report(
        &self,
        name: &str,
        host: &str,
        ip: IpAddr,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<PeerReport, String>> + Send;

    /// What the etcd of pod `name` answers at `/version` on its peer port: its release and
    /// the cluster version. Not asked by default (fakes that do not model versions).
    fn version(
        &self,
        name: &str,
        host: &str,
        ip: IpAddr,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<PeerVersion, String>> + Send {
        let _ = (name, host, ip, timeout);
        std::future::ready(Err("not asked".to_string()))
    }
}

/// Reports over HTTP from the peers' sidecars, on their peer-report port; with peer TLS,
/// only over mutual TLS with the peer certificates. Without peer TLS a pod of the previous
/// release serves its report on the probe port only: when nothing listens on the
/// peer-report port, the probe port is asked.
#[derive(Clone)]
pub struct HttpReports {
    port: u16,
    /// Without peer TLS: the probe port, asked when the peer-report port refuses.
    fallback: Option<u16>,
    /// The peer TLS material, as its files hold it at each request.
    tls: Option<crate::tls::TlsMaterial>,
    /// etcd's peer port, where `/version` is asked (over the peer TLS, when on).
    peer_port: u16,
}

impl HttpReports {
    /// Asks each peer's sidecar on `port` (its peer-report port), and without peer TLS on
    /// `fallback` (its probe port) when nothing listens there; etcd's `/version` on
    /// `peer_port`.
    pub fn new(
        port: u16,
        fallback: Option<u16>,
        tls: Option<crate::tls::TlsMaterial>,
        peer_port: u16,
    ) -> Self {
        HttpReports {
            port,
            fallback,
            tls,
            peer_port,
        }
    }
}

impl PeerReports for HttpReports {
    async fn report(
        &self,
        name: &str,
        host: &str,
        ip: IpAddr,
        timeout: Duration,
    ) -> Result<PeerReport, String> {
        let addr = SocketAddr::new(ip, self.port);
        let tls = self
            .tls
            .as_ref()
            .map(crate::tls::TlsMaterial::client_config);
        match (
            fetch_report(addr, host, name, tls.as_ref(), timeout).await,
            self.fallback,
        ) {
            (Err(ReportError::Refused(_)), Some(port)) => {
                let addr = SocketAddr::new(ip, port);
                fetch_report(addr, host, name, None, timeout)
                    .await
                    .map_err(|e| e.to_string())
            }
            (r, _) => r.map_err(|e| e.to_string()),
        }
    }

    async fn version(
        &self,
        name: &str,
        host: &str,
        ip: IpAddr,
        timeout: Duration,
    ) -> Result<PeerVersion, String> {
        let addr = SocketAddr::new(ip, self.peer_port);
        let tls = self
            .tls
            .as_ref()
            .map(crate::tls::TlsMaterial::client_config);
        let (code, body) =
            http_client::get_with(addr, host, "/version", timeout, 4096, tls.as_ref())
                .await
                .map_err(|e| e.to_string())?;
        if code != 200 {
            return Err(format!("/version answered {code}"));
        }
        parse_peer_version(name, &body)
    }
}

impl HttpReports {
    /// Pod `name`'s part of `status --history` (`/peer/history` on its peer-report port,
    /// over peer TLS when on), or why there is none.
    pub async fn history(
        &self,
        name: &str,
        host: &str,
        ip: IpAddr,
        timeout: Duration,
    ) -> Result<crate::facts::history::PodHistory, String> {
        use crate::facts::history::{PodHistory, MAX_ANSWER_BYTES};
        let addr = SocketAddr::new(ip, self.port);
        let tls = self
            .tls
            .as_ref()
            .map(crate::tls::TlsMaterial::client_config);
        let (status, body) = http_client::get_with(
            addr,
            host,
            "/peer/history",
            timeout,
            MAX_ANSWER_BYTES,
            tls.as_ref(),
        )
        .await
        .map_err(|e| e.to_string())?;
        match status {
            200 => {}
            404 => return Err("its sidecar serves no history (an older release)".into()),
            // A sidecar that cannot read its volume's journal says which file, and why.
            other => return Err(answered(other, &body)),
        }
        let history: PodHistory = serde_json::from_slice(&body)
            .map_err(|e| format!("not a history of the expected shape: {e}"))?;
        if history.name != name {
            return Err(format!(
                "the history names pod {:?}, expected {name:?}",
                history.name
            ));
        }
        Ok(history)
    }
}

/// GETs and checks a peer's report of its volume.
pub async fn fetch_report(
    addr: SocketAddr,
    host: &str,
    name: &str,
    tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
    timeout: Duration,
) -> Result<PeerReport, ReportError> {
    let (status, body) =
        http_client::get_with(addr, host, "/peer/report", timeout, MAX_REPORT_BYTES, tls)
            .await
            .map_err(|e| match e {
                http_client::GetError::Refused(a) => ReportError::Refused(a),
                other => ReportError::Failed(other.to_string()),
            })?;
    if status != 200 {
        return Err(ReportError::Failed(answered(status, &body)));
    }
    parse_report(&body, name).map_err(|e| ReportError::Failed(e.to_string()))
}

/// A sidecar's answer other than 200: the status, and what it said (a sidecar that cannot
/// read its volume's records names the file).
fn answered(status: u16, body: &[u8]) -> String {
    let said = String::from_utf8_lossy(body);
    match said.trim() {
        "" => format!("answered HTTP {status}"),
        said => format!(
            "answered HTTP {status}: {}",
            said.chars().take(2000).collect::<String>()
        ),
    }
}

/// Why a peer's report was not had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// Nothing listens at the address (a pod of the previous release, on the peer-report
    /// port).
    #[error("connection to {0} refused")]
    Refused(SocketAddr),
    #[error("{0}")]
    Failed(String),
}
