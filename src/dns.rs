//! DNS through hickory with its cache turned off, so a pod that just appeared is seen at
//! once. "Not published" (NXDOMAIN, no records) is kept apart from "DNS is failing".

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use thiserror::Error;

pub use crate::facts::Lookup;

/// The one DNS question etcd-steward asks.
pub trait Dns: Send + Sync {
    fn lookup(&self, host: &str) -> impl Future<Output = Lookup> + Send;
}

#[derive(Debug, Error)]
#[error("cannot set up the DNS resolver: {0}; check /etc/resolv.conf or pass --dns-server IP:PORT")]
pub struct DnsSetupError(String);

/// hickory, either on the system configuration or on one given server.
#[derive(Clone)]
pub struct HickoryDns {
    resolver: TokioResolver,
}

impl HickoryDns {
    pub fn new(server: Option<SocketAddr>) -> Result<Self, DnsSetupError> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = match server {
            Some(addr) => {
                let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                for c in &mut ns.connections {
                    c.port = addr.port();
                }
                TokioResolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![ns]),
                    provider,
                )
            }
            None => TokioResolver::builder(provider).map_err(|e| DnsSetupError(e.to_string()))?,
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.cache_size = 0;
        opts.timeout = Duration::from_millis(800);
        opts.attempts = 2;
        let resolver = builder.build().map_err(|e| DnsSetupError(e.to_string()))?;
        Ok(Self { resolver })
    }
}

impl Dns for HickoryDns {
    async fn lookup(&self, host: &str) -> Lookup {
        // Fully qualified, so the pod's search list and ndots:5 do not multiply queries.
        let fqdn = if host.ends_with('.') {
            host.to_string()
        } else {
            format!("{host}.")
        };
        match self.resolver.lookup_ip(fqdn.as_str()).await {
            Ok(answer) => {
                let ips: Vec<IpAddr> = answer.iter().collect();
                if ips.is_empty() {
                    Lookup::NotFound
                } else {
                    Lookup::Found(ips)
                }
            }
            Err(e) if e.is_nx_domain() || e.is_no_records_found() => Lookup::NotFound,
            Err(e) => Lookup::Failed(e.to_string()),
        }
    }
}
