//! Data for the clusters under test, and reading the agent's JSON logs.

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use etcd_client::{Client, Txn, TxnOp};
use harness::Set;
use tokio::task::JoinSet;

use crate::env::connect;

pub const PREFIX: &str = "bench/";
pub const VALUE_BYTES: usize = 1024;
const PER_TXN: u64 = 10;
const WORKERS: u64 = 4;

/// Writes `bytes` of values (1 KiB each, 10 per transaction, so the raft index follows the data; four
/// writers) through every
/// member; returns the number of keys.
pub async fn fill(set: &Set, bytes: u64) -> Result<u64> {
    let keys = bytes / VALUE_BYTES as u64;
    let batches = keys.div_ceil(PER_TXN);
    let urls: Vec<String> = (0..set.replicas).map(|o| set.client_url(o)).collect();
    let mut workers = JoinSet::new();
    for w in 0..WORKERS {
        let urls = urls.clone();
        workers.spawn(async move {
            let opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(1))
                .with_timeout(Duration::from_secs(30));
            let mut c = Client::connect(urls, Some(opts)).await?;
            let value = vec![b'v'; VALUE_BYTES];
            let mut b = w;
            while b < batches {
                let ops: Vec<TxnOp> = (b * PER_TXN..((b + 1) * PER_TXN).min(keys))
                    .map(|i| TxnOp::put(format!("{PREFIX}{i:010}"), value.clone(), None))
                    .collect();
                c.txn(Txn::new().and_then(ops)).await?;
                b += WORKERS;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = workers.join_next().await {
        r.context("a loader task panicked")??;
    }
    Ok(keys)
}

/// Puts `n` small keys through member `o`.
pub async fn small(set: &Set, o: u32, n: u64) -> Result<()> {
    let mut c = connect(&set.client_url(o)).await?;
    for i in 0..n {
        c.put(format!("small/{i:06}"), format!("v{i}"), None)
            .await?;
    }
    Ok(())
}

/// The wall-clock time of the first JSON log line whose `message` starts with `message`.
pub fn log_time(logs: &str, message: &str) -> Option<SystemTime> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
        })
        .and_then(|v| v["timestamp"].as_str().and_then(parse_time))
}

/// The time of the first JSON log line at all.
pub fn first_log_time(logs: &str) -> Option<SystemTime> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["timestamp"].as_str().and_then(parse_time))
}

fn parse_time(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(s.trim_end_matches('Z')).ok()
}

/// Seconds from `t0` to `t` (negative if before).
pub fn secs_since(t0: SystemTime, t: SystemTime) -> f64 {
    match t.duration_since(t0) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tracing_json_timestamps() {
        let logs = "not json\n{\"timestamp\":\"2025-11-22T05:27:01.250000Z\",\"level\":\"INFO\",\"message\":\"exec etcd\"}\n";
        let t = log_time(logs, "exec etcd").expect("found");
        let t0 = humantime::parse_rfc3339("2025-11-22T05:27:01Z").expect("t0");
        assert!((secs_since(t0, t) - 0.25).abs() < 1e-6);
        assert_eq!(first_log_time(logs), Some(t));
        assert!(log_time(logs, "decision").is_none());
    }
}
