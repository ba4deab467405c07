//! One archive segment: every event of a contiguous run of revisions, as the watch
//! delivered them, with the granted TTL of every lease its puts name. Encoded in a small
//! length-prefixed binary form, compressed with zstd (and, with a backup key, encrypted
//! like the snapshots by the caller). Pure: bytes in, bytes out.
//!
//! The stored object is one zstd frame per [`FRAME`] bytes of the encoding, one after
//! another (zstd reads concatenated frames as one stream; segments written as a single
//! frame before read the same way).
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
/// Bytes of the encoding compressed at a time, each block one zstd frame: zstd's memory
/// is then this block and level 3's tables for it, not a window over the whole segment.
pub const FRAME: usize = 256 << 10;

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
    /// segment is up to the cap: a buffer grown by doubling would hold up to twice that,
    /// and the old and new buffers both while it grows).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_head(&mut out);
        for r in &self.revisions {
            encode_revision(&mut out, r);
        }
        out
    }

    /// The encoding up to the revisions: magic, leases, revision count.
    fn encode_head(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        put_u32(out, self.leases.len());
        for (id, ttl) in &self.leases {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&ttl.to_le_bytes());
        }
        put_u32(out, self.revisions.len());
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

/// A segment built as the watch delivers it, compressed as it grows: each revision is
/// encoded and compressed [`FRAME`] bytes at a time (each block one zstd frame) and its
/// events dropped at once, so a segment in the making holds its compressed bytes, not its
/// events, nor its plain encoding (the archiver's memory at a high write rate:
/// BENCHMARKS.md, *Cost of the continuous archive*). The part before the revisions (the
/// lease table and the revision count, known only at the end) is one more frame, put
/// first when the segment is finished: the frames, one after another, decompress to
/// exactly [`Segment::encode`]'s bytes.
pub struct Builder {
    /// The revisions' encoding compressed so far, frame after frame.
    body: Vec<u8>,
    /// The revisions' encoding not compressed yet (less than a frame).
    block: Vec<u8>,
    compressor: zstd::bulk::Compressor<'static>,
    leases: BTreeMap<i64, i64>,
    revisions: usize,
    events: usize,
    /// Bytes of the revisions' encoding.
    plain: usize,
    first: Option<(i64, u64)>,
    last: Option<(i64, u64)>,
}

/// A finished segment: the stored object (before any encryption) in two parts, the head's
/// frame then the revisions' frames, and what its manifest says of it.
#[derive(Debug)]
pub struct Built {
    pub parts: [Vec<u8>; 2],
    /// The plain encoding's length.
    pub plain_size: usize,
    pub revisions: usize,
    pub events: usize,
    pub leases: usize,
    /// First and last revision, each with its time (Unix ms).
    pub first: (i64, u64),
    pub last: (i64, u64),
}

impl Builder {
    /// An empty segment, its compressed bytes' room reserved for about `expected` plain
    /// bytes (the cap: pages never written cost no memory, and a buffer grown by doubling
    /// would copy itself).
    pub fn new(expected: usize) -> std::io::Result<Self> {
        let frames = expected.div_ceil(FRAME).max(1);
        Ok(Builder {
            body: Vec::with_capacity(zstd::zstd_safe::compress_bound(FRAME) * frames),
            block: Vec::new(),
            compressor: zstd::bulk::Compressor::new(ZSTD_LEVEL)?,
            leases: BTreeMap::new(),
            revisions: 0,
            events: 0,
            plain: 0,
            first: None,
            last: None,
        })
    }

    /// A whole segment, built.
    pub fn of(s: &Segment) -> std::io::Result<Self> {
        let mut b = Builder::new(s.encoded_len())?;
        b.leases = s.leases.clone();
        for r in &s.revisions {
            b.push(r)?;
        }
        Ok(b)
    }

    /// Appends revision `r` (after the last one).
    pub fn push(&mut self, r: &Revision) -> std::io::Result<()> {
        let before = self.block.len();
        encode_revision(&mut self.block, r);
        self.plain += self.block.len() - before;
        self.revisions += 1;
        self.events += r.ops.len();
        self.first.get_or_insert((r.revision, r.time_unix_ms));
        self.last = Some((r.revision, r.time_unix_ms));
        if self.block.len() >= FRAME {
            self.flush()?;
        }
        Ok(())
    }

    /// Records lease `id`'s granted TTL.
    pub fn lease(&mut self, id: i64, ttl: i64) {
        self.leases.insert(id, ttl);
    }

    pub fn has_lease(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    pub fn lease_ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.leases.keys().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.revisions == 0
    }

    /// The last revision and its time, when any.
    pub fn last(&self) -> Option<(i64, u64)> {
        self.last
    }

    /// Compresses the block, [`FRAME`] bytes per frame, onto the body.
    fn flush(&mut self) -> std::io::Result<()> {
        for chunk in self.block.chunks(FRAME) {
            compress_onto(&mut self.compressor, chunk, &mut self.body)?;
        }
        self.block.clear();
        Ok(())
    }

    /// The stored object; `None` for a segment without a revision.
    pub fn finish(mut self) -> std::io::Result<Option<Built>> {
        let (Some(first), Some(last)) = (self.first, self.last) else {
            return Ok(None);
        };
        self.flush()?;
        let head = Segment {
            revisions: Vec::new(),
            leases: std::mem::take(&mut self.leases),
        };
        let mut plain = Vec::new();
        head.encode_head(&mut plain);
        // The real count, in place of the empty head's 0.
        let count_at = plain.len() - 4;
        plain[count_at..].copy_from_slice(
            &u32::try_from(self.revisions)
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        let mut head_frame = Vec::new();
        compress_onto(&mut self.compressor, &plain, &mut head_frame)?;
        Ok(Some(Built {
            parts: [head_frame, self.body],
            plain_size: plain.len() + self.plain,
            revisions: self.revisions,
            events: self.events,
            leases: head.leases.len(),
            first,
            last,
        }))
    }
}

/// Compresses `plain` as one zstd frame appended to `out`.
fn compress_onto(
    compressor: &mut zstd::bulk::Compressor<'static>,
    plain: &[u8],
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    out.reserve(zstd::zstd_safe::compress_bound(plain.len()));
    let mut at = std::io::Cursor::new(&mut *out);
    at.set_position(at.get_ref().len() as u64);
    compressor.compress_to_buffer(plain, &mut at)?;
    Ok(())
}

/// One revision's encoding: revision, time, op count, its ops.
fn encode_revision(out: &mut Vec<u8>, r: &Revision) {
    out.extend_from_slice(&r.revision.to_le_bytes());
    out.extend_from_slice(&r.time_unix_ms.to_le_bytes());
    put_u32(out, r.ops.len());
    for op in &r.ops {
        match op {
            Op::Put { key, value, lease } => {
                out.push(0);
                put_bytes(out, key);
                put_bytes(out, value);
                out.extend_from_slice(&lease.to_le_bytes());
            }
            Op::Delete { key } => {
                out.push(1);
                put_bytes(out, key);
            }
        }
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

    /// A segment of `revisions` puts of `value` bytes each (pseudo-random: incompressible),
    /// one lease.
    fn large(revisions: i64, value: usize) -> Segment {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut byte = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        };
        Segment {
            revisions: (1..=revisions)
                .map(|r| Revision {
                    revision: r,
                    time_unix_ms: 1_795_000_000_000 + r as u64,
                    ops: vec![Op::Put {
                        key: format!("k/{r}").into_bytes(),
                        value: (0..value).map(|_| byte()).collect(),
                        lease: 7,
                    }],
                })
                .collect(),
            leases: BTreeMap::from([(7, 30)]),
        }
    }

    /// The plain size of every zstd frame of `object`, in order.
    fn frame_sizes(mut object: &[u8]) -> Vec<u64> {
        let mut sizes = Vec::new();
        while !object.is_empty() {
            let len = zstd::zstd_safe::find_frame_compressed_size(object).unwrap();
            sizes.push(
                zstd::zstd_safe::get_frame_content_size(object)
                    .unwrap()
                    .unwrap(),
            );
            object = &object[len..];
        }
        sizes
    }

    #[test]
    fn a_segment_built_as_it_comes_reads_back_exactly_as_written() {
        // 5,000 revisions of 1 KiB (about 20 frames) and one revision larger than a frame.
        let mut s = large(5_000, 1024);
        s.revisions
            .extend(large(1, 3 * FRAME).revisions.into_iter().map(|mut r| {
                r.revision = 5_001;
                r
            }));
        for s in [s, sample()] {
            let built = Builder::of(&s).unwrap().finish().unwrap().unwrap();
            assert_eq!(built.plain_size, s.encoded_len());
            let object = built.parts.concat();
            assert_eq!(Segment::decompress(&object, built.plain_size).unwrap(), s);
            assert_eq!(
                (built.revisions, built.events, built.leases),
                (s.revisions.len(), s.events(), s.leases.len())
            );
            assert_eq!(built.first.0, s.first_revision().unwrap());
            assert_eq!(built.last.0, s.last_revision().unwrap());
        }
        assert!(Builder::new(0).unwrap().finish().unwrap().is_none());
    }

    #[test]
    fn a_segment_in_the_making_holds_frames_no_larger_than_a_block_not_its_events() {
        let s = large(5_000, 1024);
        let built = Builder::of(&s).unwrap().finish().unwrap().unwrap();
        let plain_len = built.plain_size;
        // The head first, alone in its frame.
        let head = frame_sizes(&built.parts[0]);
        assert_eq!(head, vec![8 + 4 + 16 + 4]);
        let sizes = frame_sizes(&built.parts[1]);
        assert!(sizes.len() >= plain_len / FRAME, "{sizes:?}");
        assert!(sizes.iter().all(|n| *n as usize <= FRAME), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<u64>() as usize, plain_len - 32);
    }

    #[test]
    fn up_to_keeps_whole_revisions_and_only_the_leases_they_name() {
        let s = sample().up_to(7);
        assert_eq!(s.last_revision(), Some(7));
        assert!(s.leases.is_empty());
        assert_eq!(sample().up_to(100), sample());
    }
}
