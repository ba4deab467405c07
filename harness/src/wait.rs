//! Polling until a condition holds: the one loop every scenario waits with.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, Result};

/// Polls `check` every `every` until it holds; how long that took, or
/// [`Error::TimedOut`] naming `what` after `timeout`.
pub async fn poll<F, Fut>(
    timeout: Duration,
    every: Duration,
    what: &str,
    mut check: F,
) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            return Err(Error::TimedOut {
                what: what.to_string(),
                after: timeout,
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `check` every 20 ms until it holds (the benchmark's pace: what it waits for is
/// measured); how long that took.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, check: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll(timeout, Duration::from_millis(20), what, check).await
}

/// Polls `check` every 200 ms until it holds; panics naming `what` after `timeout`.
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for_or(timeout, what, check, String::new).await
}

/// As [`wait_for`], appending `diagnostics()` (e.g. the pods' logs) to the panic.
pub async fn wait_for_or<F, Fut, D>(timeout: Duration, what: &str, check: F, diagnostics: D)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
    D: FnOnce() -> String,
{
    if let Err(e) = poll(timeout, Duration::from_millis(200), what, check).await {
        panic!("{e}{}", diagnostics());
    }
}
