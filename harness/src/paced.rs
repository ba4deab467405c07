//! A writer at a fixed rate (100 or 1,000 puts a second), for measurements: the put of
//! `w/<i>` is due at `i / rate` after the start, whatever the puts before it are doing
//! (up to [`IN_FLIGHT`] at once), and every acknowledgement is recorded with its time, so
//! a measurement can say which acknowledged writes a loss cost and how old they were.
//! Unlike [`crate::writer::Writer`], a failed put is not retried: it is simply not
//! acknowledged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::time::Instant;

use crate::rng::Rng;
use crate::writer::write_key;

/// At most this many puts in flight: past it the schedule waits (and the rate drops).
pub const IN_FLIGHT: usize = 256;

/// One acknowledged put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// The write's number: its key is [`write_key`]`(i)`.
    pub i: u64,
    /// When etcd acknowledged it, since the writer started.
    pub at: Duration,
    /// The revision etcd gave it.
    pub revision: i64,
}

/// What the writer saw, once stopped.
#[derive(Debug, Clone, Default)]
pub struct PacedReport {
    /// Puts started.
    pub started: u64,
    /// Puts acknowledged, in the order the acknowledgements came.
    pub acked: Vec<Acked>,
    /// Puts that failed or timed out.
    pub failures: u64,
    /// Bytes of keys and values acknowledged.
    pub bytes: u64,
}

/// Writes `w/<i>` at `rate` puts a second through `endpoints` (one client balancing
/// across them), each value `value_len` bytes: the same byte repeated, or seeded
/// pseudo-random bytes (`incompressible`).
pub struct PacedWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<PacedReport>,
    started: Instant,
}

impl PacedWriter {
    /// Starts writing. The report's times count from this call.
    pub fn start(
        endpoints: Vec<String>,
        rate: u32,
        value_len: usize,
        incompressible: Option<u64>,
    ) -> PacedWriter {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                paced(endpoints, rate, value_len, incompressible, started, stop).await
            })
        };
        PacedWriter {
            stop,
            task,
            started,
        }
    }

    /// The writer's clock: the time since it started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stops starting puts, waits (bounded) for those in flight; what the writer saw.
    pub async fn stop(self) -> PacedReport {
        self.stop.store(true, Ordering::SeqCst);
        self.task
            .await
            .unwrap_or_else(|e| panic!("the paced writer task: {e}"))
    }
}

async fn paced(
    endpoints: Vec<String>,
    rate: u32,
    value_len: usize,
    incompressible: Option<u64>,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> PacedReport {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(300))
        .with_timeout(Duration::from_secs(2));
    let client = Client::connect(endpoints.clone(), Some(opts))
        .await
        .unwrap_or_else(|e| panic!("a client of {endpoints:?}: {e}"));
    let report = Arc::new(Mutex::new(PacedReport::default()));
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut rng = incompressible.map(Rng::new);
    let period = Duration::from_secs(1) / rate.max(1);
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep_until(started + period * u32::try_from(i).unwrap_or(u32::MAX)).await;
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let value: Vec<u8> = match rng.as_mut() {
            Some(r) => (0..value_len.div_ceil(8))
                .flat_map(|_| r.next_u64().to_le_bytes())
                .take(value_len)
                .collect(),
            None => vec![b'x'; value_len],
        };
        let key = write_key(i);
        let bytes = (key.len() + value.len()) as u64;
        let mut c = client.clone();
        let report = report.clone();
        let n = i;
        tokio::spawn(async move {
            let put = tokio::time::timeout(Duration::from_millis(2500), c.put(key, value, None));
            let r = put.await;
            let at = started.elapsed();
            let mut rep = report
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match r {
                Ok(Ok(r)) => {
                    let revision = r.header().map_or(0, |h| h.revision());
                    rep.acked.push(Acked { i: n, at, revision });
                    rep.bytes += bytes;
                }
                _ => rep.failures += 1,
            }
            drop(slot);
        });
        i += 1;
    }
    // The puts in flight end within their time-out.
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        slots.acquire_many(u32::try_from(IN_FLIGHT).unwrap_or(u32::MAX)),
    )
    .await;
    let mut out = report
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    out.started = i;
    out
}

/// Nearest-rank percentile `p` (0–100) of `sorted` (ascending); `None` when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&d, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&d, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&d[..1], 99.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
