//! A cluster DNS on loopback: a dnsmasq answering the pods' stable names from a hosts file
//! it reloads on SIGHUP (a name resolves only while it is published, as a headless
//! service's), and a resolver on it without a cache to watch what it answers.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use tokio::process::{Child, Command};

use crate::{procs, Error, Result};

/// The cluster domain every set serves.
pub const DOMAIN: &str = "cluster.local";

/// A running dnsmasq serving `*.<DOMAIN>` from a hosts file.
pub struct Dnsmasq {
    ip: Ipv4Addr,
    hosts: PathBuf,
    /// What the hosts file holds now (an unchanged file is not rewritten or reloaded).
    written: String,
    child: Option<Child>,
    resolver: TokioResolver,
}

/// What a name resolves to now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// These addresses.
    Found(Vec<IpAddr>),
    /// No such name (NXDOMAIN or no records).
    NotFound,
    /// The server failed or did not answer.
    Failed,
}

impl Dnsmasq {
    /// Starts dnsmasq on `ip`:53 with an empty hosts file in `dir`, and waits until it
    /// answers (NXDOMAIN, not a time-out).
    pub async fn start(ip: Ipv4Addr, dir: &Path) -> Result<Dnsmasq> {
        let hosts = dir.join("hosts");
        std::fs::write(&hosts, "").map_err(Error::io(format!("writing {}", hosts.display())))?;
        let mut cmd = Command::new("dnsmasq");
        cmd.args([
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--port=53",
            "--user=root",
            "--local-ttl=0",
            "--no-negcache",
            "--log-facility=-",
        ])
        .arg(format!("--listen-address={ip}"))
        .arg(format!("--addn-hosts={}", hosts.display()))
        .arg(format!("--local=/{DOMAIN}/"))
        .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let child = procs::spawn(
            cmd,
            Path::new("dnsmasq (scripts/install-test-deps.sh installs it)"),
        )?;
        let mut ns = NameServerConfig::udp_and_tcp(IpAddr::V4(ip));
        for c in &mut ns.connections {
            c.port = 53;
        }
        let mut builder = TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(vec![ns]),
            TokioRuntimeProvider::default(),
        );
        let opts = builder.options_mut();
        opts.cache_size = 0;
        opts.timeout = Duration::from_millis(800);
        opts.attempts = 2;
        let resolver = builder
            .build()
            .map_err(|e| Error::Failed(format!("a resolver on {ip}: {e}")))?;
        let dns = Dnsmasq {
            ip,
            hosts,
            written: String::new(),
            child: Some(child),
            resolver,
        };
        let probe = format!("probe.{DOMAIN}");
        crate::wait_until(Duration::from_secs(10), "dnsmasq to answer", || {
            let dns = &dns;
            let probe = probe.as_str();
            async move { dns.resolve(probe).await == Answer::NotFound }
        })
        .await?;
        Ok(dns)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip), 53)
    }

    /// Serves exactly `records` (address, name) from now on; dnsmasq reloads on SIGHUP,
    /// asynchronously.
    pub fn serve(&mut self, records: &[(Ipv4Addr, String)]) -> Result<()> {
        let lines: String = records
            .iter()
            .map(|(ip, name)| format!("{ip} {name}\n"))
            .collect();
        if lines == self.written {
            return Ok(());
        }
        std::fs::write(&self.hosts, &lines)
            .map_err(Error::io(format!("writing {}", self.hosts.display())))?;
        self.written = lines;
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            procs::signal(pid, "HUP")?;
        }
        Ok(())
    }

    /// What `name` resolves to now.
    pub async fn resolve(&self, name: &str) -> Answer {
        match self.resolver.lookup_ip(format!("{name}.").as_str()).await {
            Ok(a) => {
                let ips: Vec<IpAddr> = a.iter().collect();
                if ips.is_empty() {
                    Answer::NotFound
                } else {
                    Answer::Found(ips)
                }
            }
            Err(e) if e.is_nx_domain() || e.is_no_records_found() => Answer::NotFound,
            Err(_) => Answer::Failed,
        }
    }

    /// Waits until `name` resolves as `want`.
    pub async fn wait_answer(&self, name: &str, want: Answer, timeout: Duration) -> Result<()> {
        let what = format!("{name} to resolve as {want:?}");
        crate::wait_until(timeout, &what, || {
            let want = &want;
            async move { self.resolve(name).await == *want }
        })
        .await
        .map(|_| ())
    }

    /// Stops dnsmasq and waits for it.
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }
}
