//! One archive segment: every event of a contiguous run of revisions, as the watch
//! delivered them, with the granted TTL of every lease its puts name. Encoded in a small
//! length-prefixed binary form, compressed with zstd (and, with a backup key, encrypted
//! like the snapshots by the caller). Pure: bytes in, bytes out.
//!
//! The encoding (before compression), all integers little-endian:
//! `ESARCH1\n`, then `u32` lease count and per lease `i64 id, i64 ttl_seconds`, then
//! `u32` revision count and per revision `i64 revision, u64 time_unix_ms, u32 op count`
//! and per op a tag byte (`0` put, `1` delete), the key (`u32` length, bytes) and, for a
//! put, the value (`u32` length, bytes) and `i64 lease` (0: none).

use std::collections::BTreeMap;

use thiserror::Error;

const MAGIC: &[u8; 8] = b"ESARCH1\n";
/// zstd's level for segments: fast, and still several times smaller than the events.
pub const ZSTD_LEVEL: i32 = 3;

/// One change inside a revision, in the order etcd applied it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `lease` is the lease ID the key is attached to (0: none).
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: i64,
    },
    Delete {
        key: Vec<u8>,
    },
}

/// Every change etcd made at one revision: replayed as one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    pub revision: i64,
    /// When the archiver received it (the watch carries no time): within a fraction of a
    /// second of the write while the archive keeps up.
    pub time_unix_ms: u64,
    pub ops: Vec<Op>,
}

/// What one segment object holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Segment {
    /// Revisions in increasing order, each once.
    pub revisions: Vec<Revision>,
    /// Lease ID → its granted TTL in seconds, for every lease a put of this segment names
    /// (-1: the lease was already gone when the archiver asked).
    pub leases: BTreeMap<i64, i64>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not an etcd-steward archive segment (bad magic)")]
    Magic,
    #[error("segment is truncated at byte {0}")]
    Truncated(usize),
    #[error("segment holds an unknown operation tag {tag} at byte {at}")]
    Tag { tag: u8, at: usize },
    #[error("segment revisions are not increasing: {before} then {after}")]
    Order { before: i64, after: i64 },
    #[error("segment does not decompress: {0}")]
    Zstd(String),
    #[error("segment has {0} trailing bytes")]
    Trailing(usize),
}

impl Segment {
    pub fn first_revision(&self) -> Option<i64> {
        self.revisions.first().map(|r| r.revision)
    }

    pub fn last_revision(&self) -> Option<i64> {
        self.revisions.last().map(|r| r.revision)
    }

    /// Events in the segment (puts and deletes).
    pub fn events(&self) -> usize {
        self.revisions.iter().map(|r| r.ops.len()).sum()
    }

    /// The length of [`Segment::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        let ops: usize = self
            .revisions
            .iter()
            .flat_map(|r| &r.ops)
            .map(|op| match op {
                Op::Put { key, value, .. } => 1 + 4 + key.len() + 4 + value.len() + 8,
                Op::Delete { key } => 1 + 4 + key.len(),
            })
            .sum();
        MAGIC.len() + 4 + self.leases.len() * 16 + 4 + self.revisions.len() * 20 + ops
    }

    /// The plain (uncompressed) encoding, in one allocation of exactly its length (a
    /// segment is up to the 4 MiB cap: a buffer grown by doubling would hold up to twice
    /// that, and the old and new buffers both while it grows).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, self.leases.len());
        for (id, ttl) in &self.leases {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&ttl.to_le_bytes());
        }
        put_u32(&mut out, self.revisions.len());
        for r in &self.revisions {
            out.extend_from_slice(&r.revision.to_le_bytes());
            out.extend_from_slice(&r.time_unix_ms.to_le_bytes());
            put_u32(&mut out, r.ops.len());
            for op in &r.ops {
                match op {
                    Op::Put { key, value, lease } => {
                        out.push(0);
                        put_bytes(&mut out, key);
                        put_bytes(&mut out, value);
                        out.extend_from_slice(&lease.to_le_bytes());
                    }
                    Op::Delete { key } => {
                        out.push(1);
                        put_bytes(&mut out, key);
                    }
                }
            }
        }
        out
    }

    /// Decodes [`Segment::encode`]'s output, checking the revisions increase.
    pub fn decode(bytes: &[u8]) -> Result<Segment, DecodeError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(MAGIC.len())? != MAGIC {
            return Err(DecodeError::Magic);
        }
        let mut seg = Segment::default();
        for _ in 0..r.u32()? {
            let id = r.i64()?;
            let ttl = r.i64()?;
            seg.leases.insert(id, ttl);
        }
        let count = r.u32()?;
        seg.revisions.reserve(count.min(1 << 20));
        for _ in 0..count {
            let revision = r.i64()?;
            let time_unix_ms = r.u64()?;
            let n = r.u32()?;
            let mut ops = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                let at = r.at;
                match r.take(1)?[0] {
                    0 => {
                        let key = r.bytes()?;
                        let value = r.bytes()?;
                        let lease = r.i64()?;
                        ops.push(Op::Put { key, value, lease });
                    }
                    1 => ops.push(Op::Delete { key: r.bytes()? }),
                    tag => return Err(DecodeError::Tag { tag, at }),
                }
            }
            if let Some(before) = seg.last_revision() {
                if revision <= before {
                    return Err(DecodeError::Order {
                        before,
                        after: revision,
                    });
                }
            }
            seg.revisions.push(Revision {
                revision,
                time_unix_ms,
                ops,
            });
        }
        if r.at != bytes.len() {
            return Err(DecodeError::Trailing(bytes.len() - r.at));
        }
        Ok(seg)
    }

    /// The encoding, compressed with zstd: what is stored (before any encryption).
    pub fn compress(&self) -> Vec<u8> {
        // Compressing an in-memory buffer cannot fail short of running out of memory.
        zstd::bulk::compress(&self.encode(), ZSTD_LEVEL).unwrap_or_default()
    }

    /// [`Segment::compress`]'s output back, at most `limit` bytes once decompressed.
    pub fn decompress(bytes: &[u8], limit: usize) -> Result<Segment, DecodeError> {
        let plain =
            zstd::bulk::decompress(bytes, limit).map_err(|e| DecodeError::Zstd(e.to_string()))?;
        Segment::decode(&plain)
    }

    /// The revisions up to and including `last`, and the leases they name.
    pub fn up_to(&self, last: i64) -> Segment {
        let revisions: Vec<Revision> = self
            .revisions
            .iter()
            .take_while(|r| r.revision <= last)
            .cloned()
            .collect();
        let leases = self
            .leases
            .iter()
            .filter(|(id, _)| {
                revisions.iter().any(|r| {
                    r.ops
                        .iter()
                        .any(|op| matches!(op, Op::Put { lease, .. } if lease == *id))
                })
            })
            .map(|(id, ttl)| (*id, *ttl))
            .collect();
        Segment { revisions, leases }
    }
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or(DecodeError::Truncated(self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u32(&mut self) -> Result<usize, DecodeError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b) as usize)
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(i64::from_le_bytes(b))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32()?;
        Ok(self.take(n)?.to_vec())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample() -> Segment {
        Segment {
            revisions: vec![
                Revision {
                    revision: 7,
                    time_unix_ms: 1_795_000_000_000,
                    ops: vec![
                        Op::Put {
                            key: b"/registry/pods/a".to_vec(),
                            value: vec![0, 1, 2, 255],
                            lease: 0,
                        },
                        Op::Delete {
                            key: b"/registry/pods/b".to_vec(),
                        },
                    ],
                },
                Revision {
                    revision: 8,
                    time_unix_ms: 1_795_000_000_250,
                    ops: vec![Op::Put {
                        key: b"lease-key".to_vec(),
                        value: Vec::new(),
                        lease: 0x694d_7a5b_1c2d,
                    }],
                },
            ],
            leases: BTreeMap::from([(0x694d_7a5b_1c2d, 15)]),
        }
    }

    #[test]
    fn the_encoding_is_exactly_as_long_as_announced() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(bytes.len(), s.encoded_len());
        assert_eq!(bytes.capacity(), s.encoded_len());
        assert_eq!(
            Segment::default().encode().len(),
            Segment::default().encoded_len()
        );
    }

    #[test]
    fn a_segment_reads_back_exactly_as_written() {
        let s = sample();
        assert_eq!(Segment::decode(&s.encode()).unwrap(), s);
        assert_eq!(Segment::decompress(&s.compress(), 1 << 20).unwrap(), s);
        assert_eq!(
            (s.first_revision(), s.last_revision(), s.events()),
            (Some(7), Some(8), 3)
        );
    }

    #[test]
    fn a_cut_or_altered_segment_is_an_error_not_fewer_events() {
        let bytes = sample().encode();
        for cut in [0, 5, 20, bytes.len() - 1] {
            assert!(Segment::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Segment::decode(&longer), Err(DecodeError::Trailing(1)));
        let mut swapped = sample();
        swapped.revisions.swap(0, 1);
        assert!(matches!(
            Segment::decode(&swapped.encode()),
            Err(DecodeError::Order {
                before: 8,
                after: 7
            })
        ));
        assert!(Segment::decompress(b"not zstd at all", 1 << 20).is_err());
    }

    #[test]
    fn up_to_keeps_whole_revisions_and_only_the_leases_they_name() {
        let s = sample().up_to(7);
        assert_eq!(s.last_revision(), Some(7));
        assert!(s.leases.is_empty());
        assert_eq!(sample().up_to(100), sample());
    }
}
