//! Defragmentation's executor: the step runs under a lease-held lock key in etcd, so that
//! one member at a time defragments even when two sidecars decide at the same moment (the
//! decision is [`crate::sidecar::plan::defrag`]).

use crate::etcd::{Etcd, EtcdError};
pub use crate::sidecar::plan::defrag::LOCK_KEY;

/// The lock's lease: released (revoked) right after; expires on its own if the sidecar dies.
/// Longer than the longest defragmentation the sidecar waits for
/// ([`crate::etcd::DEFRAG_TIMEOUT`]), so a slow one never lets a second member start.
pub const LOCK_TTL_SECS: i64 = crate::etcd::DEFRAG_TIMEOUT.as_secs() as i64 + 60;

/// Defragments the local member, under the lock key when `lock`; `Ok(false)` when another
/// sidecar holds the lock.
pub async fn defragment<E: Etcd>(local: &E, lock: bool) -> Result<bool, EtcdError> {
    let lease = match lock {
        true => match local
            .try_lock(LOCK_KEY, local.endpoint(), LOCK_TTL_SECS)
            .await?
        {
            Some(lease) => Some(lease),
            None => return Ok(false),
        },
        false => None,
    };
    let started = tokio::time::Instant::now();
    tracing::info!(locked = lock, "defragmentation started");
    let result = local.defragment().await;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        ok = result.is_ok(),
        "defragmentation ended"
    );
    if let Some(lease) = lease {
        if let Err(e) = local.unlock(lease).await {
            tracing::warn!(error = %e, "could not release the defragmentation lock; its lease expires on its own");
        }
    }
    result.map(|()| true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::Connector;
    use crate::fake::{FakeCluster, Op};

    /// Two followers whose sidecars decide to defragment at the same moment: one takes the
    /// lock and defragments, the other finds it held and does nothing (waits its turn).
    #[tokio::test]
    async fn two_members_defragmenting_at_once_take_turns_by_the_lock() {
        let cluster = FakeCluster::new(0xc1);
        for (id, o) in [(0xa0, 0), (0xa1, 1), (0xa2, 2)] {
            let host = format!("etcd-{o}");
            cluster.add_member(
                id,
                &host,
                &format!("http://{host}:2380"),
                &format!("http://{host}:2379"),
                false,
            );
        }
        cluster.set_leader(0xa0);
        let ip = std::net::IpAddr::from([127, 0, 0, 1]);
        let mut members = Vec::new();
        for o in [1, 2] {
            let host = format!("etcd-{o}");
            cluster.delay(
                &format!("{host}:2379"),
                Op::Defragment,
                std::time::Duration::from_millis(200),
            );
            members.push(
                cluster
                    .connect(&host, ip, 2379)
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
        let (a, b) = tokio::join!(defragment(&members[0], true), defragment(&members[1], true));
        let done: Vec<bool> = [a, b]
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(
            done.iter().filter(|d| **d).count(),
            1,
            "exactly one defragmented, the other found the lock held: {done:?}"
        );
        assert_eq!(cluster.calls_of(Op::Defragment).len(), 1);
        assert!(cluster.locks().is_empty(), "the lock is released after");
    }
}
