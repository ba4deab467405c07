//! A writer that records every write etcd acknowledged, so a scenario can prove none was
//! lost. Like an assertion, it panics when it cannot go on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::time::Instant;

/// The key of the `i`-th write.
pub fn write_key(i: u64) -> String {
    format!("w/{i:08}")
}

/// The value of the `i`-th write: distinctive enough to be found in a database file (the
/// chaos runner corrupts one there), and known for every key (a member serving another value
/// under a writer's key serves one that was never written).
pub fn write_value(i: u64) -> String {
    format!("written-{i:08}")
}

/// A gap between acknowledgements longer than this is a refusal of writes: a write through
/// a live cluster takes milliseconds.
pub const REFUSAL: Duration = Duration::from_millis(300);

/// Writes `w/<n>` one after another (about 100 a second) through every given endpoint in
/// turn, counting a write only once etcd acknowledged it. A write that failed is retried
/// with the same key through the next endpoint.
pub struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<WriterReport>,
    acked: Arc<AtomicU64>,
    pause: Arc<Pause>,
    revisions: Arc<Mutex<Vec<i64>>>,
    started: Instant,
}

/// Holding the writer between two writes: `wanted` asks, `held` says it stopped writing.
#[derive(Default)]
struct Pause {
    wanted: AtomicBool,
    held: AtomicBool,
}

/// What the writer saw, once stopped.
#[derive(Debug, Clone)]
pub struct WriterReport {
    /// Writes 0..acked were acknowledged.
    pub acked: u64,
    /// Writes that failed (and were retried).
    pub failures: u64,
    /// The longest time between two acknowledgements (or the start and the first).
    pub max_gap: Duration,
    /// When that gap ended, since the writer started.
    pub max_gap_at: Duration,
    /// Every stretch without an acknowledgement longer than [`REFUSAL`]: when it began and
    /// ended, since the writer started (the gap after a pause starts when the pause ends).
    pub refusals: Vec<(Duration, Duration)>,
    /// The last failure, said in a sentence.
    pub last_error: String,
    /// The revision etcd acknowledged each write at: `revisions[i]` is `w/i`'s.
    pub revisions: Vec<i64>,
    /// When each write was acknowledged, since the writer started: `acked_at[i]` is `w/i`'s.
    pub acked_at: Vec<Duration>,
}

impl WriterReport {
    /// A report of nothing written yet.
    pub(crate) fn new() -> WriterReport {
        WriterReport {
            acked: 0,
            failures: 0,
            max_gap: Duration::ZERO,
            max_gap_at: Duration::ZERO,
            refusals: Vec::new(),
            last_error: String::new(),
            revisions: Vec::new(),
            acked_at: Vec::new(),
        }
    }

    /// Records a write acknowledged now, by a writer started at `started` whose last
    /// acknowledgement (or start, or end of a pause) was `last_ack`: its time, and the gap
    /// before it as a refusal when longer than [`REFUSAL`]. `last_ack` becomes now.
    pub(crate) fn acknowledged(&mut self, started: Instant, last_ack: &mut Instant) {
        let now = Instant::now();
        self.acked_at.push(now - started);
        if now - *last_ack > REFUSAL {
            self.refusals.push((*last_ack - started, now - started));
        }
        if now - *last_ack > self.max_gap {
            self.max_gap = now - *last_ack;
            self.max_gap_at = now - started;
        }
        *last_ack = now;
    }
}

/// Waits until `acked` counts `n` more than now, within `timeout`; `who` and `what` name
/// the writer and the moment in the panic when it does not.
pub(crate) async fn wait_acked(
    acked: &AtomicU64,
    n: u64,
    timeout: Duration,
    who: &str,
    what: &str,
) {
    let target = acked.load(Ordering::SeqCst) + n;
    let deadline = Instant::now() + timeout;
    while acked.load(Ordering::SeqCst) < target {
        assert!(
            Instant::now() < deadline,
            "{who} made no progress ({what}): {} acknowledged, wanted {target}",
            acked.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Writer {
    /// Starts writing through `endpoints` (plain-HTTP client URLs). The report's times count
    /// from this call.
    pub fn start(endpoints: Vec<String>) -> Writer {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let pause = Arc::new(Pause::default());
        let revisions = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (stop, acked, pause, revisions) = (
                stop.clone(),
                acked.clone(),
                pause.clone(),
                revisions.clone(),
            );
            tokio::spawn(async move {
                write_loop(endpoints, started, stop, acked, pause, revisions).await
            })
        };
        Writer {
            stop,
            task,
            acked,
            pause,
            revisions,
            started,
        }
    }

    /// The writer's clock: the time since it started (what the report's times count from).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Holds the writer once its write in flight ended (acknowledged or not); returns how
    /// many writes are acknowledged then: none more until [`Self::resume`].
    pub async fn pause(&self, timeout: Duration) -> u64 {
        self.pause.wanted.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        while !self.pause.held.load(Ordering::SeqCst) {
            assert!(
                Instant::now() < deadline,
                "the writer did not stop writing within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.acked()
    }

    /// Lets a paused writer go on.
    pub fn resume(&self) {
        self.pause.wanted.store(false, Ordering::SeqCst);
        self.pause.held.store(false, Ordering::SeqCst);
    }

    /// The revisions acknowledged so far (`w/i`'s at `i`).
    pub fn revisions(&self) -> Vec<i64> {
        self.revisions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many writes are acknowledged so far.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// Waits until `n` more writes than now are acknowledged.
    pub async fn wait_progress(&self, n: u64, timeout: Duration, what: &str) {
        wait_acked(&self.acked, n, timeout, "the writer", what).await;
    }

    /// Stops writing; what the writer saw.
    pub async fn stop(self) -> WriterReport {
        self.stop.store(true, Ordering::SeqCst);
        self.task
            .await
            .unwrap_or_else(|e| panic!("the writer task: {e}"))
    }
}

async fn write_loop(
    endpoints: Vec<String>,
    started: Instant,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    pause: Arc<Pause>,
    revisions: Arc<Mutex<Vec<i64>>>,
) -> WriterReport {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(300))
        .with_timeout(Duration::from_secs(2));
    let mut clients = Vec::new();
    for ep in &endpoints {
        clients.push(
            Client::connect([ep.as_str()], Some(opts.clone()))
                .await
                .unwrap_or_else(|e| panic!("a lazy client of {ep}: {e}")),
        );
    }
    let mut last_ack = started;
    let mut report = WriterReport::new();
    let mut failed_at: Vec<Option<Instant>> = vec![None; clients.len()];
    let mut turn = 0usize;
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        if pause.wanted.load(Ordering::SeqCst) {
            pause.held.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            // A pause is no refusal of writes: the gap starts again when it ends.
            last_ack = Instant::now();
            continue;
        }
        pause.held.store(false, Ordering::SeqCst);
        // The next endpoint that has not failed in the last second (any, if all have).
        let n = clients.len();
        let mut pick = turn % n;
        for k in 0..n {
            let idx = (turn + k) % n;
            if failed_at[idx].is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                pick = idx;
                break;
            }
        }
        turn = pick + 1;
        let put = clients[pick].put(write_key(i), write_value(i), None);
        match tokio::time::timeout(Duration::from_millis(2500), put).await {
            Ok(Ok(r)) => {
                let revision = r.header().map_or(0, |h| h.revision());
                revisions
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(revision);
                report.acknowledged(started, &mut last_ack);
                i += 1;
                acked.store(i, Ordering::SeqCst);
                failed_at[pick] = None;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(Err(e)) => {
                report.failures += 1;
                report.last_error = format!("{}: {e}", endpoints[pick]);
                failed_at[pick] = Some(Instant::now());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => {
                report.failures += 1;
                report.last_error = format!("{}: no answer within 2.5 s", endpoints[pick]);
                failed_at[pick] = Some(Instant::now());
            }
        }
    }
    report.acked = i;
    report.revisions = revisions
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    report
}
