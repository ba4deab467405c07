//! The etcd container's startup and liveness probe as the chart renders it
//! (`etcd-steward.etcdProbe` in `charts/etcd-steward/templates/_helpers.tpl`, checked for each
//! release by `scripts/chart-checks.py`), run as kubelet runs one: against etcd's own metrics
//! port, never the sidecar's.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::client::http_get;
use crate::Etcd;

/// The port of etcd's `--listen-metrics-urls` (the chart's `etcd.metricsPort`).
pub const METRICS_PORT: u16 = 2381;

/// The etcd flag that opens the metrics port on a pod's address.
pub fn metrics_flag(ip: Ipv4Addr) -> String {
    format!("--listen-metrics-urls=http://{ip}:{METRICS_PORT}")
}

/// Which probe the chart renders for an etcd release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdProbe {
    /// `httpGet /livez` (a serializable read of the local member): etcd 3.5.11+, 3.4.29+, 3.6+.
    Livez,
    /// `tcpSocket`: older releases, whose `/health` fails without a leader even with
    /// `serializable=true`.
    Tcp,
}

impl EtcdProbe {
    /// The chart's rule for the releases the harness runs: 3.5.30 has `/livez`; 3.5.1 and
    /// 3.4.23 do not.
    pub fn of(etcd: Etcd) -> EtcdProbe {
        match etcd {
            Etcd::V3_5Current => EtcdProbe::Livez,
            Etcd::V3_5 | Etcd::V3_5Tls | Etcd::V3_4 => EtcdProbe::Tcp,
        }
    }

    /// One probe of the etcd at `ip`, as kubelet runs it: a connection within `timeout`
    /// (Tcp), or an answer from 200 to 399 within `timeout` (Livez). `Err` says what failed.
    pub async fn run(self, ip: Ipv4Addr, timeout: Duration) -> Result<(), String> {
        let addr = SocketAddr::new(IpAddr::V4(ip), METRICS_PORT);
        match self {
            EtcdProbe::Tcp => {
                match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(format!("tcpSocket {addr}: {e}")),
                    Err(_) => Err(format!(
                        "tcpSocket {addr}: no connection within {timeout:?}"
                    )),
                }
            }
            EtcdProbe::Livez => match http_get(addr, "/livez", timeout, 1 << 16).await {
                Some((code, _)) if (200..400).contains(&code) => Ok(()),
                Some((code, body)) => Err(format!("GET {addr}/livez: {code} {body}")),
                None => Err(format!("GET {addr}/livez: no answer within {timeout:?}")),
            },
        }
    }
}
