//! Figure 6: `/healthz` and `/ready` under load from a second process (wrk), with a new
//! connection per request as kubelet makes them, while the cluster is healthy, while the
//! member's etcd is hung, and while etcd has no quorum.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use harness::procs::signal;
use harness::{Kind, Set};

use crate::env::Env;
use crate::stats::{Figure, Target};

pub const WRK_THREADS: u32 = 1;
pub const WRK_CONNECTIONS: u32 = 4;

#[derive(Debug, Default, Clone)]
pub struct WrkResult {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub rps: f64,
    pub requests: u64,
    pub non_2xx: u64,
    pub timeouts: u64,
    pub errors: u64,
}

fn to_ms(v: &str) -> Option<f64> {
    let (num, unit) = v
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| v.split_at(i))?;
    let n: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => return None,
    })
}

pub fn parse_wrk(out: &str) -> Result<WrkResult> {
    let mut r = WrkResult::default();
    let mut seen = 0;
    for line in out.lines() {
        let t = line.trim();
        let mut words = t.split_whitespace();
        match (words.next(), words.next()) {
            (Some("50%"), Some(v)) => {
                r.p50_ms = to_ms(v).ok_or_else(|| anyhow!("bad p50 {v}"))?;
                seen += 1;
            }
            (Some("90%"), Some(v)) => r.p90_ms = to_ms(v).unwrap_or(f64::NAN),
            (Some("99%"), Some(v)) => {
                r.p99_ms = to_ms(v).ok_or_else(|| anyhow!("bad p99 {v}"))?;
                seen += 1;
            }
            (Some("Requests/sec:"), Some(v)) => {
                r.rps = v.parse()?;
                seen += 1;
            }
            _ => {}
        }
        if let Some(n) = t
            .split(" requests in ")
            .next()
            .filter(|_| t.contains(" requests in "))
        {
            r.requests = n.trim().parse().unwrap_or(0);
        }
        if let Some(n) = t.strip_prefix("Non-2xx or 3xx responses:") {
            r.non_2xx = n.trim().parse().unwrap_or(0);
        }
        if let Some(rest) = t.strip_prefix("Socket errors:") {
            for part in rest.split(',') {
                let mut kv = part.split_whitespace();
                if let (Some(k), Some(v)) = (kv.next(), kv.next()) {
                    let v: u64 = v.parse().unwrap_or(0);
                    if k == "timeout" {
                        r.timeouts = v;
                    } else {
                        r.errors += v;
                    }
                }
            }
        }
    }
    if seen < 3 {
        bail!("cannot read wrk's output:\n{out}");
    }
    Ok(r)
}

async fn wrk(url: &str, secs: u64) -> Result<WrkResult> {
    let out = tokio::process::Command::new("wrk")
        .arg(format!("-t{WRK_THREADS}"))
        .arg(format!("-c{WRK_CONNECTIONS}"))
        .arg(format!("-d{secs}s"))
        .args(["--timeout", "2s", "--latency", "-H", "Connection: close"])
        .arg(url)
        .output()
        .await
        .context("wrk must be installed (apt-get install wrk)")?;
    if !out.status.success() {
        bail!("wrk failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    parse_wrk(&String::from_utf8_lossy(&out.stdout))
}

async fn expect_status(set: &Set, path: &str, want: u16) -> Result<()> {
    for _ in 0..300 {
        if let Some((s, _)) = set.http(0, path).await {
            if s == want {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = set.http(0, path).await;
    bail!("{path} on pod 0 did not turn {want}: {got:?}")
}

pub async fn run(env: &Env, secs: u64) -> Result<Vec<Figure>> {
    let mut set = env.set(Kind::Agent, 3).await?;
    set.start_all(Duration::from_secs(90)).await?;
    let base = format!("http://{}:8080", set.pod(0).ip);
    let mut figures = Vec::new();
    let mut measure = |cond: &str, r: WrkResult, path: &str| {
        let mut f = Figure::new(
            format!("6. `{path}` p99 latency, {cond}"),
            "ms",
            Target::Below(5.0),
        );
        f.agent = vec![r.p99_ms];
        f.note = format!(
            "p50 {:.2} ms, p90 {:.2} ms; {:.0} req/s ({} requests, {} non-2xx, {} time-outs, {} socket errors)",
            r.p50_ms, r.p90_ms, r.rps, r.requests, r.non_2xx, r.timeouts, r.errors
        );
        eprintln!("bench: {}: {:.2} ms; {}", f.name, r.p99_ms, f.note);
        figures.push(f);
    };

    expect_status(&set, "/ready", 200).await?;
    for path in ["/healthz", "/ready"] {
        measure(
            "healthy cluster",
            wrk(&format!("{base}{path}"), secs).await?,
            path,
        );
    }

    // The member's etcd hangs (SIGSTOP): the probes must still answer at once.
    let pid = set.etcd_pid(0).context("etcd pid")?;
    signal(pid, "STOP")?;
    let hung = async {
        expect_status(&set, "/ready", 503).await?;
        let mut out = Vec::new();
        for path in ["/healthz", "/ready"] {
            out.push((wrk(&format!("{base}{path}"), secs).await?, path));
        }
        anyhow::Ok(out)
    }
    .await;
    signal(pid, "CONT")?;
    for (r, path) in hung? {
        measure("etcd hung (SIGSTOP)", r, path);
    }

    // No quorum: the two other pods are gone.
    set.kill_processes(1).await;
    set.kill_processes(2).await;
    expect_status(&set, "/ready", 503).await?;
    expect_status(&set, "/healthz", 200).await?;
    for path in ["/healthz", "/ready"] {
        measure(
            "no quorum",
            wrk(&format!("{base}{path}"), secs).await?,
            path,
        );
    }
    set.shutdown().await;
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_wrk_output() {
        let out = "Running 2s test @ http://127.0.0.1:8080/healthz
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   420.10us  200.00us   3.10ms   90.00%
    Req/Sec     8.00k   500.00     9.00k    70.00%
  Latency Distribution
     50%  380.00us
     75%  450.00us
     90%  600.00us
     99%    1.20ms
  16000 requests in 2.00s, 2.00MB read
  Socket errors: connect 0, read 3, write 0, timeout 1
  Non-2xx or 3xx responses: 16000
Requests/sec:   7999.50
Transfer/sec:      1.00MB
";
        let r = parse_wrk(out).expect("parsed");
        assert!((r.p50_ms - 0.38).abs() < 1e-9);
        assert!((r.p99_ms - 1.2).abs() < 1e-9);
        assert_eq!(r.requests, 16000);
        assert_eq!(r.non_2xx, 16000);
        assert_eq!((r.timeouts, r.errors), (1, 3));
        assert!((r.rps - 7999.5).abs() < 1e-9);
    }
}
