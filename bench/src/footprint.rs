//! Figure 5: what the sidecar costs beside its member: peak RSS, CPU time (idle and under
//! a steady write load), and the requests it sends to etcd. Kubelet's probes are simulated
//! (GET /healthz and /ready every 10 s per pod, its default period).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use harness::client::http_get;
use harness::{Kind, Set};
use tokio::time::Instant;

use crate::env::{connect, Env};
use crate::stats::{fmt_num, Figure, Target};

pub struct Options {
    pub idle: Duration,
    pub load: Duration,
    pub writes_per_sec: u32,
}

/// utime + stime of a process, in seconds.
pub(crate) fn cpu_secs(pid: u32, clk_tck: f64) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("bad /proc/{pid}/stat"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the comm field: state is [0], utime is field 14 overall → [11], stime [12].
    let utime: f64 = fields.get(11).ok_or_else(|| anyhow!("no utime"))?.parse()?;
    let stime: f64 = fields.get(12).ok_or_else(|| anyhow!("no stime"))?.parse()?;
    Ok((utime + stime) / clk_tck)
}

/// A `/proc/PID/status` field in KiB (VmRSS, VmHWM).
pub(crate) fn status_kib(pid: u32, field: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("no {field} in /proc/{pid}/status"))
}

pub(crate) fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Sum of etcd's `grpc_server_handled_total` by method, over every member.
async fn grpc_counts(set: &Set) -> Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for o in 0..set.replicas {
        let addr = SocketAddr::new(IpAddr::V4(set.pod(o).ip), 2379);
        let (status, body) = http_get(addr, "/metrics", Duration::from_secs(3), 16 << 20)
            .await
            .ok_or_else(|| anyhow!("etcd metrics of pod {o}: no answer within 3 s"))?;
        if status != 200 {
            return Err(anyhow!("etcd metrics of pod {o}: HTTP {status}"));
        }
        for line in body.lines() {
            let Some(rest) = line.strip_prefix("grpc_server_handled_total{") else {
                continue;
            };
            let method = rest
                .split("grpc_method=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("?")
                .to_string();
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            *out.entry(method).or_insert(0.0) += value;
        }
    }
    Ok(out)
}

struct Snapshot {
    at: Instant,
    cpu: Vec<f64>,
    etcd_cpu: Vec<f64>,
    grpc: BTreeMap<String, f64>,
}

async fn snapshot(set: &Set, pids: &[u32], etcd_pids: &[u32], tck: f64) -> Result<Snapshot> {
    Ok(Snapshot {
        at: Instant::now(),
        cpu: pids
            .iter()
            .map(|p| cpu_secs(*p, tck))
            .collect::<Result<_>>()?,
        etcd_cpu: etcd_pids
            .iter()
            .map(|p| cpu_secs(*p, tck))
            .collect::<Result<_>>()?,
        grpc: grpc_counts(set).await?,
    })
}

/// Requests per second per sidecar (every gRPC call but the bench's own Puts), and the
/// per-method breakdown.
fn request_rate(a: &Snapshot, b: &Snapshot, sidecars: usize) -> (f64, String) {
    let secs = b.at.duration_since(a.at).as_secs_f64();
    let mut total = 0.0;
    let mut parts = Vec::new();
    for (method, v) in &b.grpc {
        if method == "Put" {
            continue;
        }
        let d = v - a.grpc.get(method).copied().unwrap_or(0.0);
        if d > 0.0 {
            let rate = d / secs / sidecars as f64;
            total += rate;
            parts.push(format!("{method} {}", fmt_num(rate)));
        }
    }
    (total, parts.join(", "))
}

fn per_hour(a: &[f64], b: &[f64], secs: f64) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(x, y)| (y - x) * 3600.0 / secs)
        .collect()
}

pub async fn run(env: &Env, opts: &Options) -> Result<Vec<Figure>> {
    let mut set = env.set(Kind::Agent, 3).await?;
    set.start_all(Duration::from_secs(90)).await?;
    crate::load::small(&set, 0, 1000).await?;
    let tck = clk_tck();
    let pids: Vec<u32> = (0..3)
        .map(|o| set.sidecar_pid(o).context("sidecar pid"))
        .collect::<Result<_>>()?;
    let etcd_pids: Vec<u32> = (0..3)
        .map(|o| set.etcd_pid(o).context("etcd pid"))
        .collect::<Result<_>>()?;

    // kubelet: GET /healthz and /ready every 10 s on each pod.
    let stop = Arc::new(AtomicBool::new(false));
    let addrs: Vec<SocketAddr> = (0..3)
        .map(|o| SocketAddr::new(IpAddr::V4(set.pod(o).ip), 8080))
        .collect();
    let kubelet = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                for a in &addrs {
                    for path in ["/healthz", "/ready"] {
                        let _ = http_get(*a, path, Duration::from_secs(1), 4096).await;
                    }
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        })
    };
    // Peak resident set, sampled every second (VmHWM is read at the end too).
    let rss_peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak, pids) = (stop.clone(), rss_peak.clone(), pids.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                for p in &pids {
                    if let Ok(k) = status_kib(*p, "VmRSS") {
                        peak.fetch_max(k as u64, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };

    eprintln!(
        "bench: footprint: idle for {:?}, then {} writes/s for {:?}",
        opts.idle, opts.writes_per_sec, opts.load
    );
    let s0 = snapshot(&set, &pids, &etcd_pids, tck).await?;
    tokio::time::sleep(opts.idle).await;
    let s1 = snapshot(&set, &pids, &etcd_pids, tck).await?;

    let writes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, writes) = (stop.clone(), writes.clone());
        let url = set.client_url(0);
        let rate = opts.writes_per_sec.max(1);
        tokio::spawn(async move {
            let mut c = connect(&url).await?;
            let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
            let value = vec![b'w'; crate::load::VALUE_BYTES];
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                c.put(format!("soak/{:06}", i % 100_000), value.clone(), None)
                    .await?;
                writes.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        })
    };
    let s2 = snapshot(&set, &pids, &etcd_pids, tck).await?;
    tokio::time::sleep(opts.load).await;
    let s3 = snapshot(&set, &pids, &etcd_pids, tck).await?;
    stop.store(true, Ordering::Relaxed);
    writer.await??;
    let _ = kubelet.await;
    let _ = sampler.await;

    let hwm: Vec<f64> = pids
        .iter()
        .map(|p| status_kib(*p, "VmHWM").map(|k| k / 1024.0))
        .collect::<Result<_>>()?;
    let etcd_hwm: Vec<f64> = etcd_pids
        .iter()
        .map(|p| status_kib(*p, "VmHWM").map(|k| k / 1024.0))
        .collect::<Result<_>>()?;
    let idle_secs = s1.at.duration_since(s0.at).as_secs_f64();
    let load_secs = s3.at.duration_since(s2.at).as_secs_f64();
    let wrote = writes.load(Ordering::Relaxed) as f64 / load_secs;
    let span = format!(
        "{:.0} s idle + {:.0} s at {:.0} writes/s",
        idle_secs, load_secs, wrote
    );

    let mut rss = Figure::new("5. Sidecar peak RSS (VmHWM)", "MiB", Target::AtMost(15.0));
    rss.agent = hwm;
    rss.note = format!(
        "one value per sidecar after {span}; etcd's own VmHWM {:.0} MiB",
        crate::stats::median(&etcd_hwm).unwrap_or(f64::NAN)
    );

    let mut cpu_idle = Figure::new("5a. Sidecar CPU, idle cluster", "CPU-s/h", Target::None);
    cpu_idle.agent = per_hour(&s0.cpu, &s1.cpu, idle_secs);
    cpu_idle.note = format!(
        "over {idle_secs:.0} s, per sidecar; etcd beside it: {} CPU-s/h",
        fmt_num(
            crate::stats::median(&per_hour(&s0.etcd_cpu, &s1.etcd_cpu, idle_secs))
                .unwrap_or(f64::NAN)
        )
    );
    let mut cpu_load = Figure::new(
        format!("5b. Sidecar CPU, {:.0} writes/s", wrote),
        "CPU-s/h",
        Target::None,
    );
    cpu_load.agent = per_hour(&s2.cpu, &s3.cpu, load_secs);
    cpu_load.note = format!(
        "over {load_secs:.0} s, per sidecar; etcd beside it: {} CPU-s/h",
        fmt_num(
            crate::stats::median(&per_hour(&s2.etcd_cpu, &s3.etcd_cpu, load_secs))
                .unwrap_or(f64::NAN)
        )
    );

    let (idle_rate, idle_parts) = request_rate(&s0, &s1, pids.len());
    let (load_rate, load_parts) = request_rate(&s2, &s3, pids.len());
    let mut req_idle = Figure::new(
        "5c. Requests one sidecar sends to etcd, idle",
        "req/s",
        Target::None,
    );
    req_idle.agent = vec![idle_rate];
    req_idle.note =
        format!("etcd `grpc_server_handled_total` deltas over all members ÷ 3: {idle_parts}");
    let mut req_load = Figure::new(
        "5d. Requests one sidecar sends to etcd, under writes",
        "req/s",
        Target::None,
    );
    req_load.agent = vec![load_rate];
    req_load.note = format!("all but the bench's Puts, ÷ 3: {load_parts}");
    eprintln!(
        "bench: footprint: peak RSS {:?} MiB (sampled max {} KiB), idle {:.1} req/s per sidecar",
        rss.agent,
        rss_peak.load(Ordering::Relaxed),
        idle_rate
    );
    set.shutdown().await;
    Ok(vec![rss, cpu_idle, cpu_load, req_idle, req_load])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_and_memory() {
        let me = std::process::id();
        assert!(cpu_secs(me, 100.0).expect("cpu") >= 0.0);
        assert!(status_kib(me, "VmHWM").expect("hwm") > 0.0);
    }
}
