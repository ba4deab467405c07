//! The archive's etcd calls, on the backup rounds' connection to the local member
//! ([`EtcdSource`]): where the member is (one Get's header), the changes after a revision
//! (a watch from there, grouped by revision, closed once a given revision has come), and
//! a lease's granted TTL.

use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions, WatchStream};
use thiserror::Error;

use super::segment::{Op, Revision};
use crate::backup::snapshot::{source_error, EtcdSource, SourceError};

/// How long one call, or the wait for the next watch response, may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WatchError {
    /// etcd no longer holds the revisions from `from` on: the chain cannot be continued.
    #[error("revisions from {from} are compacted away at etcd {endpoint} (compacted up to {compact_revision})")]
    Compacted {
        endpoint: String,
        from: i64,
        compact_revision: i64,
    },
    #[error(transparent)]
    Source(#[from] SourceError),
}

/// The member's cluster and current revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current {
    pub cluster_id: u64,
    pub revision: i64,
}

fn timed_out(source: &EtcdSource, what: &str) -> SourceError {
    SourceError::Other {
        endpoint: source.endpoint().to_string(),
        detail: format!("{what}: no answer within {CALL_TIMEOUT:?}"),
    }
}

/// The member's cluster ID and revision, from the header of one linearizable Get (so
/// every revision up to it has been applied by this member).
pub async fn current(source: &EtcdSource) -> Result<Current, SourceError> {
    let mut c = source.client();
    let get = c.get(vec![0u8], Some(GetOptions::new().with_count_only()));
    let r = tokio::time::timeout(CALL_TIMEOUT, get)
        .await
        .map_err(|_| timed_out(source, "get"))?
        .map_err(|e| source_error(source.endpoint(), e))?;
    let h = r.header().ok_or_else(|| SourceError::Other {
        endpoint: source.endpoint().to_string(),
        detail: "a Get's answer carries no header".into(),
    })?;
    Ok(Current {
        cluster_id: h.cluster_id(),
        revision: h.revision(),
    })
}

/// The granted TTL of lease `id` in seconds, or -1 when the lease is already gone.
pub async fn lease_ttl(source: &EtcdSource, id: i64) -> Result<i64, SourceError> {
    let mut c = source.client();
    let asked = tokio::time::timeout(CALL_TIMEOUT, c.lease_time_to_live(id, None))
        .await
        .map_err(|_| timed_out(source, "lease time-to-live"))?;
    match asked {
        // etcd answers TTL -1 for a lease it does not hold (expired or revoked).
        Ok(r) if r.ttl() == -1 && r.granted_ttl() == 0 => Ok(-1),
        Ok(r) => Ok(r.granted_ttl()),
        Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => Ok(-1),
        Err(e) => Err(source_error(source.endpoint(), e)),
    }
}

/// Every change after a revision, up to a revision known to exist, as the watch delivers
/// them.
pub struct Changes {
    stream: WatchStream,
    endpoint: String,
    from: i64,
    upto: i64,
    watch_id: Option<i64>,
    /// The last revision received.
    reached: i64,
}

/// Opens a watch on every key from revision `from` on, to be read until `upto` (a revision
/// the member has applied) has come. A compacted `from` is [`WatchError::Compacted`],
/// here or at the first [`Changes::next`].
pub async fn changes(source: &EtcdSource, from: i64, upto: i64) -> Result<Changes, WatchError> {
    let mut c = source.client();
    let options = WatchOptions::new()
        .with_all_keys()
        .with_start_revision(from);
    let stream = tokio::time::timeout(CALL_TIMEOUT, c.watch(vec![0u8], Some(options)))
        .await
        .map_err(|_| timed_out(source, "watch"))?
        .map_err(|e| source_error(source.endpoint(), e))?;
    Ok(Changes {
        stream,
        endpoint: source.endpoint().to_string(),
        from,
        upto,
        watch_id: None,
        reached: from - 1,
    })
}

impl Changes {
    /// The next revisions received, whole (etcd sends all of a revision's events in one
    /// response), each stamped `now_ms`'s time when it came; `None` once `upto` has come.
    pub async fn next(
        &mut self,
        now_ms: impl Fn() -> u64,
    ) -> Result<Option<Vec<Revision>>, WatchError> {
        while self.reached < self.upto {
            let message = tokio::time::timeout(CALL_TIMEOUT, self.stream.message())
                .await
                .map_err(|_| SourceError::Other {
                    endpoint: self.endpoint.clone(),
                    detail: format!(
                        "the watch sent nothing for {CALL_TIMEOUT:?} while revisions {}..{} were due",
                        self.reached + 1,
                        self.upto
                    ),
                })?
                .map_err(|e| source_error(&self.endpoint, e))?;
            let Some(r) = message else {
                return Err(SourceError::Other {
                    endpoint: self.endpoint.clone(),
                    detail: "the watch stream ended".into(),
                }
                .into());
            };
            if r.created() {
                self.watch_id = Some(r.watch_id());
            }
            if r.compact_revision() != 0 {
                return Err(WatchError::Compacted {
                    endpoint: self.endpoint.clone(),
                    from: self.from,
                    compact_revision: r.compact_revision(),
                });
            }
            if r.canceled() {
                return Err(SourceError::Other {
                    endpoint: self.endpoint.clone(),
                    detail: format!("the watch was canceled: {}", r.cancel_reason()),
                }
                .into());
            }
            if r.events().is_empty() {
                continue;
            }
            let at = now_ms();
            let mut out: Vec<Revision> = Vec::new();
            for event in r.events() {
                let Some(kv) = event.kv() else { continue };
                let op = match event.event_type() {
                    EventType::Put => Op::Put {
                        key: kv.key().to_vec(),
                        value: kv.value().to_vec(),
                        lease: kv.lease(),
                    },
                    EventType::Delete => Op::Delete {
                        key: kv.key().to_vec(),
                    },
                };
                match out.last_mut() {
                    Some(last) if last.revision == kv.mod_revision() => last.ops.push(op),
                    _ => out.push(Revision {
                        revision: kv.mod_revision(),
                        time_unix_ms: at,
                        ops: vec![op],
                    }),
                }
            }
            if let Some(last) = out.last() {
                self.reached = self.reached.max(last.revision);
            }
            return Ok(Some(out));
        }
        Ok(None)
    }

    /// Cancels the watch (best effort: the stream closes when dropped anyway).
    pub async fn close(mut self) {
        if let Some(id) = self.watch_id {
            let _ = tokio::time::timeout(Duration::from_secs(2), self.stream.cancel(id)).await;
        }
    }
}
