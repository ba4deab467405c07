//! Archive segments made from a real etcd, for the tests that restore them: a watch from a
//! revision, its events grouped by `mod_revision` into `segment::Revision`s (in the order
//! the watch delivered them), each lease's granted TTL asked once, and `stored::put`.

#![allow(dead_code)]

use std::collections::BTreeMap;

use etcd_client::{Client, EventType, WatchOptions};
use etcd_steward::backup::archive::segment::{Op, Revision, Segment};
use etcd_steward::backup::archive::{stored, SegmentManifest};
use etcd_steward::backup::store::Store;

/// Every revision of `client`'s etcd from `from` to `to` (inclusive), as the watch gives
/// them; `time_of(revision)` is the time recorded for each (Unix ms).
pub async fn revisions(
    client: &mut Client,
    from: i64,
    to: i64,
    time_of: impl Fn(i64) -> u64,
) -> (Vec<Revision>, BTreeMap<i64, i64>) {
    let mut stream = client
        .watch(
            "",
            Some(
                WatchOptions::new()
                    .with_all_keys()
                    .with_start_revision(from),
            ),
        )
        .await
        .unwrap();
    let mut out: Vec<Revision> = Vec::new();
    let mut leases = BTreeMap::new();
    while out.last().map_or(from - 1, |r| r.revision) < to {
        let resp = tokio::time::timeout(std::time::Duration::from_secs(10), stream.message())
            .await
            .expect("the watch delivers every revision up to the last one")
            .unwrap()
            .expect("the watch stays open");
        for e in resp.events() {
            let kv = e.kv().unwrap();
            let revision = kv.mod_revision();
            if revision > to {
                continue;
            }
            let op = match e.event_type() {
                EventType::Put => {
                    if kv.lease() != 0 {
                        leases.insert(kv.lease(), -1);
                    }
                    Op::Put {
                        key: kv.key().to_vec(),
                        value: kv.value().to_vec(),
                        lease: kv.lease(),
                    }
                }
                EventType::Delete => Op::Delete {
                    key: kv.key().to_vec(),
                },
            };
            match out.last_mut() {
                Some(r) if r.revision == revision => r.ops.push(op),
                _ => out.push(Revision {
                    revision,
                    time_unix_ms: time_of(revision),
                    ops: vec![op],
                }),
            }
        }
    }
    drop(stream);
    for (id, ttl) in leases.iter_mut() {
        if let Ok(r) = client.lease_time_to_live(*id, None).await {
            if r.ttl() >= 0 {
                *ttl = r.granted_ttl();
            }
        }
    }
    (out, leases)
}

/// Stores `revs` as segments of at most `per` revisions each, for cluster `cluster_id`.
pub async fn put_segments(
    store: &Store,
    cluster_id: u64,
    revs: &[Revision],
    leases: &BTreeMap<i64, i64>,
    per: usize,
) -> Vec<SegmentManifest> {
    let mut out = Vec::new();
    for chunk in revs.chunks(per) {
        let named: Vec<i64> = chunk
            .iter()
            .flat_map(|r| r.ops.iter())
            .filter_map(|op| match op {
                Op::Put { lease, .. } if *lease != 0 => Some(*lease),
                _ => None,
            })
            .collect();
        let segment = Segment {
            revisions: chunk.to_vec(),
            leases: leases
                .iter()
                .filter(|(id, _)| named.contains(id))
                .map(|(id, ttl)| (*id, *ttl))
                .collect(),
        };
        out.push(stored::put(store, cluster_id, segment).await.unwrap());
    }
    out
}

/// Archives `client`'s revisions `from..=to` into `store` in segments of `per`.
pub async fn archive(
    client: &mut Client,
    store: &Store,
    cluster_id: u64,
    from: i64,
    to: i64,
    per: usize,
    time_of: impl Fn(i64) -> u64,
) -> Vec<SegmentManifest> {
    let (revs, leases) = revisions(client, from, to, time_of).await;
    put_segments(store, cluster_id, &revs, &leases, per).await
}
