//! What the benchmark runs and where: the binaries, its networks, and how its loopback sets
//! (the shared harness's [`Set`]) are made.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use etcd_client::{Client, ConnectOptions};
use harness::loopback::{next_net, Keep};
use harness::{Kind, Set, Setup};

/// What the bench runs and where.
#[derive(Debug, Clone)]
pub struct Env {
    pub steward: PathBuf,
    pub etcd: PathBuf,
    /// This benchmark's own executable: it doubles as a fake etcd for the start-up figure.
    pub me: PathBuf,
    pub net_base: u8,
    pub net_count: u8,
    pub keep: bool,
}

impl Env {
    /// A set of `replicas` pods of `kind` on the next of the bench's networks, none
    /// started. Its directory is kept with `--keep`, or when the scenario fails (it never
    /// reaches [`Set::shutdown`]).
    pub async fn set(&self, kind: Kind, replicas: u32) -> Result<Set> {
        let net = next_net(self.net_base, self.net_count);
        let setup = Setup {
            steward: self.steward.clone(),
            etcd: self.etcd.clone(),
            tls: false,
            replicas,
            net,
            dir_prefix: format!("steward-bench-{net}-"),
            // The agent's log filter: `BENCH_STEWARD_LOG` (e.g. `debug`), or `info`.
            log_filter: std::env::var("BENCH_STEWARD_LOG").unwrap_or_else(|_| "info".into()),
            stall_timeout: None,
            keep: if self.keep {
                Keep::Always
            } else {
                Keep::UnlessShutDown
            },
            connect_timeout: Duration::from_millis(300),
            timeout: Duration::from_secs(3),
            http_timeout: Duration::from_millis(500),
            reuse_clients: true,
        };
        Ok(Set::with(setup, kind).await?)
    }
}

/// A client of one endpoint, with the bench's time-outs.
pub async fn connect(url: &str) -> Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(300))
        .with_timeout(Duration::from_secs(3));
    Ok(Client::connect([url], Some(opts)).await?)
}
