//! The replay through the throw-away etcd's API ([`Method::Api`]): one guarded
//! transaction per archived revision, a window of them in flight ([`Pipeline`]), each
//! lease granted before the first transaction naming it. Used when the snapshot's file
//! cannot take the revisions ([`super::direct`]).

use etcd_client::{Client, Txn};

use super::leases::Leases;
use super::{
    applied_key, guards, leases_to_grant, step, stored, txn_ops, Answer, EarlyStop, Pipeline,
    ReplayError, Replayed, Segment, SegmentManifest, Step, Target, CALL_TIMEOUT,
};
use crate::backup::archive::segment::Revision;
use crate::backup::store::Store;

/// Applies the segments one guarded transaction per revision through the scratch etcd's
/// API ([`super::Method::Api`]).
pub(super) async fn apply_through_api(
    store: &Store,
    client: &Client,
    leases: &mut Leases,
    segments: &[SegmentManifest],
    target: Target,
    mut done: Replayed,
) -> Result<Replayed, ReplayError> {
    let mut applier = Applier {
        kv: client.kv_client(),
        leases,
        current: done.snapshot_revision,
        guard: None,
    };
    let started = tokio::time::Instant::now();
    let mut reached = false;
    for m in segments {
        if m.last_revision <= applier.current {
            continue;
        }
        let segment = match super::usable(m, stored::get(store, m).await)? {
            Ok(s) => s,
            Err(stop) => {
                done.stopped = Some(stop);
                break;
            }
        };
        let before = done.revisions;
        let flow = applier.apply(&segment, target, &mut done).await?;
        if done.revisions > before {
            done.segments.push(m.name.clone());
        }
        match flow {
            Flow::Continue => {}
            Flow::Reached => {
                reached = true;
                break;
            }
            Flow::Stop(why) => {
                done.stopped = Some(why);
                break;
            }
        }
    }
    done.applying = started.elapsed();
    if let (Target::Revision(n), None, false) = (target, &done.stopped, reached) {
        if applier.current < n {
            done.stopped = Some(EarlyStop::ArchiveEnds {
                last: applier.current,
                target: n,
            });
        }
    }
    Ok(done)
}

/// Transactions in flight at once ([`Pipeline`]).
const WINDOW: usize = 32;

/// Where one segment's replay left off.
enum Flow {
    Continue,
    Reached,
    Stop(EarlyStop),
}

struct Applier<'a> {
    kv: etcd_client::KvClient,
    leases: &'a mut Leases,
    /// The scratch etcd's revision, as its last answer said.
    current: i64,
    /// A key the revision `current` left written at `current` (its successor's guard).
    guard: Option<Vec<u8>>,
}

impl Applier<'_> {
    /// Applies `segment`'s revisions above `current`, up to `target`.
    async fn apply(
        &mut self,
        segment: &Segment,
        target: Target,
        done: &mut Replayed,
    ) -> Result<Flow, ReplayError> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let mut todo: Vec<&Revision> = Vec::new();
        let mut flow = Flow::Continue;
        for rev in &segment.revisions {
            match step(
                todo.last().map_or(self.current, |r| r.revision),
                rev,
                target,
            ) {
                Step::Skip => {}
                Step::Apply => todo.push(rev),
                Step::Done => {
                    flow = Flow::Reached;
                    break;
                }
                Step::Stop(why) => {
                    flow = Flow::Stop(why);
                    break;
                }
            }
        }
        let pred = |pos: usize| match pos.checked_sub(1) {
            Some(p) => applied_key(todo[p]),
            None => self.guard.as_deref(),
        };
        let proofs = (0..todo.len()).map(|pos| guards(pred(pos), todo[pos]).1);
        let mut pipeline = Pipeline::new(self.current + 1, proofs.collect(), WINDOW);
        let mut inflight = FuturesUnordered::new();
        // Leases are granted before the first transaction naming them is sent.
        let mut granted = 0;
        let mut mismatch = None;
        while !pipeline.finished() {
            while let Some(send) = pipeline.send() {
                let rev = todo[send.pos];
                if send.pos >= granted {
                    for (id, ttl) in leases_to_grant(rev, &segment.leases, &self.leases.known) {
                        self.leases.grant(id, ttl, rev.revision).await?;
                    }
                    granted = send.pos + 1;
                }
                let (compares, _) = guards(pred(send.pos), rev);
                let txn = Txn::new().when(compares).and_then(txn_ops(rev));
                let mut kv = self.kv.clone();
                inflight.push(async move {
                    (send, tokio::time::timeout(CALL_TIMEOUT, kv.txn(txn)).await)
                });
            }
            let Some((send, answer)) = inflight.next().await else {
                return Err(ReplayError::Apply {
                    revision: pipeline.revision(pipeline.applied()),
                    detail: "nothing in flight and nothing to send: the replay cannot go on".into(),
                });
            };
            let failed = |detail: String| ReplayError::Apply {
                revision: todo[send.pos].revision,
                detail,
            };
            let answer = answer
                .map_err(|_| failed(format!("no answer within {CALL_TIMEOUT:?}")))?
                .map_err(|e| failed(e.to_string()))?;
            let served = answer.header().map(|h| h.revision()).unwrap_or(0);
            let answer = match answer.succeeded() {
                true => Answer::Applied { served },
                false => Answer::Failed { served },
            };
            if let Err(m) = pipeline.answered(send, answer) {
                mismatch = Some((m, matches!(answer, Answer::Applied { .. })));
                break;
            }
        }
        // Every answer is read before the replay goes on or stops: nothing is left in flight.
        while inflight.next().await.is_some() {}
        done.resent += pipeline.resent;
        done.overtaken += pipeline.overtaken;
        if let Some(last) = pipeline.applied().checked_sub(1).map(|p| todo[p]) {
            self.current = last.revision;
            self.guard = applied_key(last).map(<[u8]>::to_vec);
            done.revisions += u64::try_from(pipeline.applied()).unwrap_or(u64::MAX);
            done.last_revision = last.revision;
            done.last_time_unix_ms = Some(last.time_unix_ms);
        }
        if let Some((m, applied)) = mismatch {
            // Whatever a transaction did is in the scratch etcd now, and in its snapshot.
            if applied && m.served > self.current {
                self.current = m.served;
                done.last_revision = m.served;
            }
            return Ok(Flow::Stop(EarlyStop::Mismatch {
                archived: m.archived,
                served: m.served,
            }));
        }
        Ok(flow)
    }
}
