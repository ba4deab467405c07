//! bbolt's on-disk pages, pure: bytes in, bytes out. The layout etcd's backend file has
//! (bbolt 1.3, native little-endian):
//!
//! - every page starts with a 16-byte header: `u64 id, u16 flags, u16 count, u32 overflow`
//!   (a page longer than the page size runs on over `overflow` more pages);
//! - a **meta** page (pages 0 and 1; the valid one with the higher transaction ID counts)
//!   holds `u32 magic, u32 version, u32 page size, u32 flags, u64 root bucket's page,
//!   u64 root bucket's sequence, u64 freelist page, u64 high-water page, u64 txid,
//!   u64 checksum` (FNV-1a 64 of the 56 bytes before it);
//! - a **leaf** page holds `count` elements `u32 flags, u32 pos, u32 key size, u32 value
//!   size` (16 bytes each), `pos` counted from the element itself to its key, the value
//!   right after the key; flag 1 marks a nested bucket, whose value is `u64 root page,
//!   u64 sequence` followed, when the root is 0, by the bucket's whole (inline) leaf page;
//! - a **branch** page holds `count` elements `u32 pos, u32 key size, u64 child page`, each
//!   key the first key under that child.

use thiserror::Error;

pub const HEADER: usize = 16;
const ELEMENT: usize = 16;
pub const MAGIC: u32 = 0xED0C_DAED;
pub const VERSION: u32 = 2;
/// The meta's freelist page when the free pages are not written down (etcd's
/// `NoFreelistSync`): bbolt finds them by walking the file when it opens it.
pub const NO_FREELIST: u64 = u64::MAX;

pub const BRANCH: u16 = 0x01;
pub const LEAF: u16 = 0x02;
pub const META: u16 = 0x04;
/// A leaf element's flag: its value is a nested bucket.
pub const BUCKET_FLAG: u32 = 0x01;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PageError {
    #[error("page {page}: {what}")]
    Malformed { page: u64, what: String },
    #[error("no valid meta page (magic, version and checksum of both checked)")]
    NoMeta,
}

fn malformed(page: u64, what: impl Into<String>) -> PageError {
    PageError::Malformed {
        page,
        what: what.into(),
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// A page's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub id: u64,
    pub flags: u16,
    pub count: u16,
    pub overflow: u32,
}

impl Header {
    pub fn read(b: &[u8]) -> Header {
        Header {
            id: u64_at(b, 0),
            flags: u16_at(b, 8),
            count: u16_at(b, 10),
            overflow: u32_at(b, 12),
        }
    }
}

/// The database's meta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub page_size: u32,
    pub flags: u32,
    /// The root bucket's root page and sequence.
    pub root: u64,
    pub sequence: u64,
    pub freelist: u64,
    /// The high-water mark: the first page never used.
    pub pgid: u64,
    pub txid: u64,
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Meta {
    /// The meta of a meta page (`b` starts at the page), when valid.
    pub fn read(b: &[u8]) -> Option<Meta> {
        if b.len() < HEADER + 64 || Header::read(b).flags & META == 0 {
            return None;
        }
        let m = &b[HEADER..HEADER + 64];
        if u32_at(m, 0) != MAGIC || u32_at(m, 4) != VERSION || fnv1a64(&m[..56]) != u64_at(m, 56) {
            return None;
        }
        Some(Meta {
            page_size: u32_at(m, 8),
            flags: u32_at(m, 12),
            root: u64_at(m, 16),
            sequence: u64_at(m, 24),
            freelist: u64_at(m, 32),
            pgid: u64_at(m, 40),
            txid: u64_at(m, 48),
        })
    }

    /// Its meta page, `page_size` bytes, written as page `id` (0 or 1).
    pub fn page(&self, id: u64) -> Vec<u8> {
        let mut b = vec![0u8; self.page_size as usize];
        b[..8].copy_from_slice(&id.to_le_bytes());
        b[8..10].copy_from_slice(&META.to_le_bytes());
        let mut m = Vec::with_capacity(64);
        for x in [MAGIC, VERSION, self.page_size, self.flags] {
            m.extend_from_slice(&x.to_le_bytes());
        }
        for x in [
            self.root,
            self.sequence,
            self.freelist,
            self.pgid,
            self.txid,
        ] {
            m.extend_from_slice(&x.to_le_bytes());
        }
        let sum = fnv1a64(&m);
        m.extend_from_slice(&sum.to_le_bytes());
        b[HEADER..HEADER + 64].copy_from_slice(&m);
        b
    }
}

/// One element of a leaf page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafEntry {
    pub flags: u32,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// A leaf element, borrowed from its page: flags, key, value.
pub type Element<'a> = (u32, &'a [u8], &'a [u8]);

/// The elements of leaf page `b` (a whole page, overflow included), borrowed.
pub fn leaf_elements(b: &[u8]) -> Result<Vec<Element<'_>>, PageError> {
    let h = Header::read(b);
    if h.flags & LEAF == 0 {
        return Err(malformed(
            h.id,
            format!("not a leaf (flags {:#x})", h.flags),
        ));
    }
    let mut out = Vec::with_capacity(usize::from(h.count));
    for i in 0..usize::from(h.count) {
        let at = HEADER + i * ELEMENT;
        if at + ELEMENT > b.len() {
            return Err(malformed(h.id, "elements run past the page"));
        }
        let flags = u32_at(b, at);
        let key_at = at + u32_at(b, at + 4) as usize;
        let ksize = u32_at(b, at + 8) as usize;
        let vsize = u32_at(b, at + 12) as usize;
        let end = key_at + ksize + vsize;
        if end > b.len() {
            return Err(malformed(h.id, format!("element {i} runs past the page")));
        }
        out.push((flags, &b[key_at..key_at + ksize], &b[key_at + ksize..end]));
    }
    Ok(out)
}

/// The children of branch page `b`: each child's first key and page.
pub fn branch_elements(b: &[u8]) -> Result<Vec<(&[u8], u64)>, PageError> {
    let h = Header::read(b);
    if h.flags & BRANCH == 0 {
        return Err(malformed(
            h.id,
            format!("not a branch (flags {:#x})", h.flags),
        ));
    }
    let mut out = Vec::with_capacity(usize::from(h.count));
    for i in 0..usize::from(h.count) {
        let at = HEADER + i * ELEMENT;
        if at + ELEMENT > b.len() {
            return Err(malformed(h.id, "elements run past the page"));
        }
        let key_at = at + u32_at(b, at) as usize;
        let ksize = u32_at(b, at + 4) as usize;
        let child = u64_at(b, at + 8);
        if key_at + ksize > b.len() {
            return Err(malformed(h.id, format!("element {i} runs past the page")));
        }
        out.push((&b[key_at..key_at + ksize], child));
    }
    Ok(out)
}

/// A nested bucket's value: its root page (0: inline) and sequence, and the inline page.
pub fn bucket_value(v: &[u8]) -> Option<(u64, u64, &[u8])> {
    (v.len() >= 16).then(|| (u64_at(v, 0), u64_at(v, 8), &v[16..]))
}

/// A nested bucket's value pointing at root page `root`.
pub fn bucket_value_of(root: u64, sequence: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&root.to_le_bytes());
    v.extend_from_slice(&sequence.to_le_bytes());
    v
}

/// The bytes a leaf element takes on its page.
pub fn leaf_size(key: &[u8], value: &[u8]) -> usize {
    ELEMENT + key.len() + value.len()
}

/// The bytes a branch element takes on its page.
pub fn branch_size(key: &[u8]) -> usize {
    ELEMENT + key.len()
}

/// Pages (of `page_size`) a page of `bytes` spans, less one: its `overflow`.
pub fn overflow_of(bytes: usize, page_size: usize) -> u32 {
    u32::try_from(bytes.div_ceil(page_size).max(1) - 1).unwrap_or(u32::MAX)
}

fn header(b: &mut [u8], id: u64, flags: u16, count: usize, overflow: u32) {
    b[..8].copy_from_slice(&id.to_le_bytes());
    b[8..10].copy_from_slice(&flags.to_le_bytes());
    b[10..12].copy_from_slice(&u16::try_from(count).unwrap_or(u16::MAX).to_le_bytes());
    b[12..16].copy_from_slice(&overflow.to_le_bytes());
}

/// Leaf page `id` holding `entries` in order, padded to whole pages.
pub fn leaf_page(id: u64, entries: &[LeafEntry], page_size: usize) -> Vec<u8> {
    let size = HEADER
        + entries
            .iter()
            .map(|e| leaf_size(&e.key, &e.value))
            .sum::<usize>();
    let overflow = overflow_of(size, page_size);
    let mut b = vec![0u8; (overflow as usize + 1) * page_size];
    header(&mut b, id, LEAF, entries.len(), overflow);
    let mut data = HEADER + entries.len() * ELEMENT;
    for (i, e) in entries.iter().enumerate() {
        let at = HEADER + i * ELEMENT;
        let fields = [
            e.flags,
            u32::try_from(data - at).unwrap_or(u32::MAX),
            u32::try_from(e.key.len()).unwrap_or(u32::MAX),
            u32::try_from(e.value.len()).unwrap_or(u32::MAX),
        ];
        for (j, f) in fields.iter().enumerate() {
            b[at + 4 * j..at + 4 * j + 4].copy_from_slice(&f.to_le_bytes());
        }
        b[data..data + e.key.len()].copy_from_slice(&e.key);
        data += e.key.len();
        b[data..data + e.value.len()].copy_from_slice(&e.value);
        data += e.value.len();
    }
    b
}

/// Branch page `id` over `children` (each child's first key and page), padded to whole
/// pages.
pub fn branch_page(id: u64, children: &[(Vec<u8>, u64)], page_size: usize) -> Vec<u8> {
    let size = HEADER + children.iter().map(|(k, _)| branch_size(k)).sum::<usize>();
    let overflow = overflow_of(size, page_size);
    let mut b = vec![0u8; (overflow as usize + 1) * page_size];
    header(&mut b, id, BRANCH, children.len(), overflow);
    let mut data = HEADER + children.len() * ELEMENT;
    for (i, (key, child)) in children.iter().enumerate() {
        let at = HEADER + i * ELEMENT;
        b[at..at + 4].copy_from_slice(&u32::try_from(data - at).unwrap_or(u32::MAX).to_le_bytes());
        b[at + 4..at + 8]
            .copy_from_slice(&u32::try_from(key.len()).unwrap_or(u32::MAX).to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&child.to_le_bytes());
        b[data..data + key.len()].copy_from_slice(key);
        data += key.len();
    }
    b
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn entry(k: &str, v: &str, flags: u32) -> LeafEntry {
        LeafEntry {
            flags,
            key: k.as_bytes().to_vec(),
            value: v.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_leaf_page_reads_back_as_written_and_a_big_one_overflows() {
        let entries = vec![entry("a", "1", 0), entry("bb", "", 0), entry("key", "x", 1)];
        let b = leaf_page(7, &entries, 4096);
        assert_eq!(b.len(), 4096);
        let h = Header::read(&b);
        assert_eq!((h.id, h.flags, h.count, h.overflow), (7, LEAF, 3, 0));
        let read: Vec<LeafEntry> = leaf_elements(&b)
            .unwrap()
            .into_iter()
            .map(|(f, k, v)| LeafEntry {
                flags: f,
                key: k.to_vec(),
                value: v.to_vec(),
            })
            .collect();
        assert_eq!(read, entries);
        let big = vec![LeafEntry {
            flags: 0,
            key: b"k".to_vec(),
            value: vec![9; 10_000],
        }];
        let b = leaf_page(9, &big, 4096);
        assert_eq!((b.len(), Header::read(&b).overflow), (3 * 4096, 2));
        assert_eq!(leaf_elements(&b).unwrap()[0].2.len(), 10_000);
    }

    #[test]
    fn a_branch_page_reads_back_as_written() {
        let children = vec![(b"a".to_vec(), 3), (b"m".to_vec(), 4)];
        let b = branch_page(5, &children, 4096);
        let read: Vec<(Vec<u8>, u64)> = branch_elements(&b)
            .unwrap()
            .into_iter()
            .map(|(k, p)| (k.to_vec(), p))
            .collect();
        assert_eq!(read, children);
        assert!(leaf_elements(&b).is_err(), "a branch is not read as a leaf");
    }

    #[test]
    fn a_meta_page_checks_its_checksum() {
        let m = Meta {
            page_size: 4096,
            flags: 0,
            root: 3,
            sequence: 0,
            freelist: NO_FREELIST,
            pgid: 10,
            txid: 42,
        };
        let mut b = m.page(0);
        assert_eq!(Meta::read(&b), Some(m));
        b[HEADER + 40] ^= 1;
        assert_eq!(Meta::read(&b), None, "a changed byte fails the checksum");
    }
}
