//! Asking an etcd for its leases at a revision ([`super::leases::LeaseView`]): the keys
//! present at the revision with the lease each names (a keys-only range at it, a page at a
//! time), then `LeaseTimeToLive` of each lease — of the live cluster only the leases those
//! keys name, without their keys (its lessor's keys are today's, not the revision's); of a
//! throw-away etcd every lease it holds (`LeaseLeases`), with its keys.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use etcd_client::{Client, GetOptions, LeaseTimeToLiveOptions};

use super::leases::{Held, LeaseView};

/// Keys asked per range call.
const PAGE: i64 = 10_000;

/// Why the leases could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The revision is compacted away.
    Compacted,
    /// An error or no answer: what was asked, and the answer.
    Failed(String),
}

/// Which leases [`read`] asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The leases the keys at the revision name, without their keys (a live cluster).
    Named,
    /// Every lease the member holds, with its keys (a throw-away etcd serving exactly the
    /// revision).
    All,
}

async fn timed<T>(
    what: &str,
    timeout: Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ReadError> {
    match tokio::time::timeout(timeout, f).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(etcd_client::Error::GRpcStatus(s))) if s.code() == tonic::Code::OutOfRange => {
            Err(ReadError::Compacted)
        }
        Ok(Err(e)) => Err(ReadError::Failed(format!("{what}: {e}"))),
        Err(_) => Err(ReadError::Failed(format!(
            "{what}: no answer within {timeout:?}"
        ))),
    }
}

/// The leases of `client`'s member at `revision`, each call bounded by `timeout`.
pub async fn read(
    client: &Client,
    revision: i64,
    scope: Scope,
    timeout: Duration,
) -> Result<LeaseView, ReadError> {
    let mut kv = client.kv_client();
    let mut view = LeaseView {
        at: revision,
        served: revision,
        ..LeaseView::default()
    };
    // etcd's smallest key: the empty key is not one.
    let mut from = vec![0u8];
    loop {
        let options = GetOptions::new()
            .with_from_key()
            .with_revision(revision)
            .with_keys_only()
            .with_limit(PAGE);
        let what = format!("range at revision {revision}");
        let page = timed(&what, timeout, kv.get(from.clone(), Some(options))).await?;
        for k in page.kvs() {
            if k.lease() != 0 {
                view.attached
                    .entry(k.lease())
                    .or_default()
                    .insert(k.key().to_vec());
            }
        }
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    let mut lease = client.lease_client();
    let ids: Vec<i64> = match scope {
        Scope::Named => view.attached.keys().copied().collect(),
        Scope::All => timed("lease list", timeout, lease.leases())
            .await?
            .leases()
            .iter()
            .map(|l| l.id())
            .collect(),
    };
    let mut held = BTreeMap::new();
    for id in ids {
        let options = (scope == Scope::All).then(|| LeaseTimeToLiveOptions::new().with_keys());
        let what = format!("lease {id:x}");
        let t = timed(&what, timeout, lease.time_to_live(id, options)).await?;
        // TTL -1: not held (revoked or expired since the revision).
        if t.ttl() < 0 {
            continue;
        }
        let keys = (scope == Scope::All).then(|| t.keys().iter().cloned().collect::<BTreeSet<_>>());
        held.insert(
            id,
            Held {
                granted_ttl: t.granted_ttl(),
                keys,
            },
        );
    }
    view.held = held;
    // Asked last: a lease that expired while it was read moved the member past `revision`.
    let probe = GetOptions::new().with_keys_only().with_limit(1);
    let now = timed("its revision", timeout, kv.get(vec![0u8], Some(probe))).await?;
    view.served = now.header().map_or(revision, |h| h.revision());
    Ok(view)
}
