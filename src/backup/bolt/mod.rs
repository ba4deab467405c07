//! etcd's backend file (a bbolt database), read and **appended to** without bbolt: what the
//! archive's replay needs to add revisions to a restored snapshot at disk speed instead of
//! one transaction at a time through etcd's API.
//!
//! Reading: [`Db::open`] finds the current meta; [`Db::bucket`] a top-level bucket;
//! [`Db::for_each`] visits a bucket's entries in key order; [`Db::last_key`] its last key.
//!
//! Writing never touches a page in use: [`Append`] writes new pages after the file's
//! high-water mark — the new entries, the bucket's rightmost path rebuilt over them
//! ([`Append::extend`]: every entry must sort after the bucket's last), small buckets
//! rebuilt whole ([`Append::rebuild`]) —, then [`Append::commit`] writes the next meta page
//! (the older of the two) pointing at the new root bucket, with its freelist marked as not
//! written (bbolt, and etcd, find the free pages by walking the file when they open it).
//! Only the agent's scratch copies are written (a copy of a snapshot, a throw-away
//! member's file), so nothing is synced here: a restore point's file is synced whole when
//! it is sealed, and a crash before means writing it again.
//! [`Db::create`] starts a new file the same way: its trees streamed in by
//! [`Append::build`], then committed.

pub mod page;

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use page::{Header, LeafEntry, Meta, PageError, BRANCH, BUCKET_FLAG, LEAF, NO_FREELIST};

#[derive(Debug, Error)]
pub enum BoltError {
    #[error("{path:?}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path:?}: {source}")]
    Page { path: PathBuf, source: PageError },
    #[error("{path:?}: {what}")]
    Unexpected { path: PathBuf, what: String },
}

/// What [`Db::for_each`] calls with each entry: flags, key, value.
pub type Visit<'a> = dyn FnMut(u32, &[u8], &[u8]) -> Result<(), BoltError> + 'a;

/// A bucket's tree: at a page, or inline in its parent's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Root {
    Page(u64),
    Inline(Vec<u8>),
}

/// A top-level bucket: its tree and sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub root: Root,
    pub sequence: u64,
}

/// An open database file, read at its current meta.
pub struct Db {
    path: PathBuf,
    file: File,
    pub meta: Meta,
}

impl Db {
    pub fn open(path: &Path) -> Result<Db, BoltError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| BoltError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        let mut db = Db {
            path: path.to_path_buf(),
            file,
            meta: Meta {
                page_size: 4096,
                flags: 0,
                root: 0,
                sequence: 0,
                freelist: 0,
                pgid: 0,
                txid: 0,
            },
        };
        let first = db.read_at(0, 4096)?;
        let size = Meta::read(&first).map_or(4096, |m| m.page_size as usize);
        let mut best: Option<Meta> = None;
        for id in 0..2u64 {
            let b = db.read_at(id * size as u64, size)?;
            if let Some(m) = Meta::read(&b).filter(|m| m.page_size as usize == size) {
                if best.is_none_or(|b| m.txid > b.txid) {
                    best = Some(m);
                }
            }
        }
        db.meta = best.ok_or_else(|| db.page_err(PageError::NoMeta))?;
        Ok(db)
    }

    fn io(&self, source: std::io::Error) -> BoltError {
        BoltError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn page_err(&self, source: PageError) -> BoltError {
        BoltError::Page {
            path: self.path.clone(),
            source,
        }
    }

    fn unexpected(&self, what: impl Into<String>) -> BoltError {
        BoltError::Unexpected {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    fn read_at(&self, at: u64, len: usize) -> Result<Vec<u8>, BoltError> {
        let mut b = vec![0u8; len];
        self.file
            .read_exact_at(&mut b, at)
            .map_err(|e| self.io(e))?;
        Ok(b)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn page_size(&self) -> usize {
        self.meta.page_size as usize
    }

    /// Page `id`, its overflow included.
    pub fn page(&self, id: u64) -> Result<Vec<u8>, BoltError> {
        if id < 2 || id >= self.meta.pgid {
            return Err(self.unexpected(format!(
                "page {id} is outside the data pages (2..{})",
                self.meta.pgid
            )));
        }
        let ps = self.page_size();
        let mut b = self.read_at(id * ps as u64, ps)?;
        let h = Header::read(&b);
        if h.id != id {
            return Err(self.unexpected(format!("page {id} says it is page {}", h.id)));
        }
        if h.overflow > 0 {
            let more = self.read_at((id + 1) * ps as u64, h.overflow as usize * ps)?;
            b.extend_from_slice(&more);
        }
        Ok(b)
    }

    /// The top-level bucket `name`, if there is one.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Bucket>, BoltError> {
        let mut found = None;
        self.for_each(&Root::Page(self.meta.root), &mut |flags, k, v| {
            if k == name && flags & BUCKET_FLAG != 0 {
                found = Some(v.to_vec());
            }
            Ok(())
        })?;
        let Some(v) = found else { return Ok(None) };
        let (root, sequence, inline) = page::bucket_value(&v)
            .ok_or_else(|| self.unexpected("a bucket's value is shorter than its header"))?;
        let root = match root {
            0 => Root::Inline(inline.to_vec()),
            p => Root::Page(p),
        };
        Ok(Some(Bucket { root, sequence }))
    }

    /// Visits every entry of the tree at `root` in key order: `(flags, key, value)`.
    pub fn for_each(&self, root: &Root, f: &mut Visit<'_>) -> Result<(), BoltError> {
        match root {
            Root::Inline(b) => {
                for (flags, k, v) in page::leaf_elements(b).map_err(|e| self.page_err(e))? {
                    f(flags, k, v)?;
                }
                Ok(())
            }
            Root::Page(id) => self.visit(*id, f, 0),
        }
    }

    fn visit(&self, id: u64, f: &mut Visit<'_>, depth: usize) -> Result<(), BoltError> {
        if depth > 64 {
            return Err(self.unexpected("a tree deeper than 64 levels"));
        }
        let b = self.page(id)?;
        match Header::read(&b).flags {
            LEAF => {
                for (flags, k, v) in page::leaf_elements(&b).map_err(|e| self.page_err(e))? {
                    f(flags, k, v)?;
                }
                Ok(())
            }
            BRANCH => {
                for (_, child) in page::branch_elements(&b).map_err(|e| self.page_err(e))? {
                    self.visit(child, f, depth + 1)?;
                }
                Ok(())
            }
            other => Err(self.unexpected(format!("page {id} has flags {other:#x} in a tree"))),
        }
    }

    /// The pages from `root` down to its rightmost leaf, each with its bytes.
    fn spine(&self, root: u64) -> Result<Vec<(u64, Vec<u8>)>, BoltError> {
        let mut out = Vec::new();
        let mut id = root;
        loop {
            let b = self.page(id)?;
            match Header::read(&b).flags {
                LEAF => {
                    out.push((id, b));
                    return Ok(out);
                }
                BRANCH => {
                    let last = page::branch_elements(&b)
                        .map_err(|e| self.page_err(e))?
                        .last()
                        .map(|(_, c)| *c)
                        .ok_or_else(|| self.unexpected(format!("branch page {id} is empty")))?;
                    out.push((id, b));
                    if out.len() > 64 {
                        return Err(self.unexpected("a tree deeper than 64 levels"));
                    }
                    id = last;
                }
                other => {
                    return Err(self.unexpected(format!("page {id} has flags {other:#x} in a tree")))
                }
            }
        }
    }

    /// The last key of the tree at `root` (None: empty).
    pub fn last_key(&self, root: &Root) -> Result<Option<Vec<u8>>, BoltError> {
        let leaf = match root {
            Root::Inline(b) => b.clone(),
            Root::Page(id) => match self.spine(*id)?.pop() {
                Some((_, b)) => b,
                None => return Ok(None),
            },
        };
        Ok(page::leaf_elements(&leaf)
            .map_err(|e| self.page_err(e))?
            .last()
            .map(|(_, k, _)| k.to_vec()))
    }

    /// A new database file at `path` (which must not exist) with `like`'s page size, flags
    /// and root sequence, holding nothing yet: its first meta points at an empty root leaf.
    /// Filled through [`Db::append`]; [`Append::commit`] writes the second meta.
    pub fn create(path: &Path, like: &Meta) -> Result<Db, BoltError> {
        let failed = |source| BoltError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(failed)?;
        let meta = Meta {
            root: 2,
            freelist: NO_FREELIST,
            pgid: 3,
            txid: 0,
            ..*like
        };
        let ps = meta.page_size as usize;
        let mut b = meta.page(0);
        b.resize(2 * ps, 0);
        b.extend_from_slice(&page::leaf_page(2, &[], ps));
        file.write_all_at(&b, 0).map_err(failed)?;
        Ok(Db {
            path: path.to_path_buf(),
            file,
            meta,
        })
    }

    /// Starts writing new pages after the high-water mark.
    pub fn append(&mut self) -> Result<Append<'_>, BoltError> {
        let at = self.meta.pgid * self.page_size() as u64;
        let mut file = self.file.try_clone().map_err(|e| self.io(e))?;
        file.seek(SeekFrom::Start(at)).map_err(|e| self.io(e))?;
        Ok(Append {
            next: self.meta.pgid,
            out: BufWriter::with_capacity(1 << 20, file),
            db: self,
        })
    }
}

/// New pages being written after the high-water mark, then committed by a new meta.
pub struct Append<'a> {
    db: &'a mut Db,
    out: BufWriter<File>,
    /// The next page to write.
    next: u64,
}

/// Leaves filled in order as entries come: each page as full as its page size allows
/// (an entry too big for a page gets one of its own, run on over overflow pages).
pub struct Leaves {
    page: Vec<LeafEntry>,
    bytes: usize,
    /// Each leaf written: its first key and page.
    written: Vec<(Vec<u8>, u64)>,
    last: Option<Vec<u8>>,
}

impl<'a> Append<'a> {
    fn write(&mut self, b: &[u8]) -> Result<u64, BoltError> {
        let id = self.next;
        self.out.write_all(b).map_err(|e| self.db.io(e))?;
        self.next += (b.len() / self.db.page_size()) as u64;
        Ok(id)
    }

    pub fn leaves(&self) -> Leaves {
        Leaves {
            page: Vec::new(),
            bytes: page::HEADER,
            written: Vec::new(),
            last: None,
        }
    }

    /// Adds an entry; it must sort after the one before.
    pub fn push(&mut self, l: &mut Leaves, e: LeafEntry) -> Result<(), BoltError> {
        if l.last
            .as_deref()
            .is_some_and(|last| last >= e.key.as_slice())
        {
            return Err(self
                .db
                .unexpected("entries to append are not in increasing key order"));
        }
        let size = page::leaf_size(&e.key, &e.value);
        if !l.page.is_empty() && l.bytes + size > self.db.page_size() {
            self.flush(l)?;
        }
        l.bytes += size;
        l.last = Some(e.key.clone());
        l.page.push(e);
        Ok(())
    }

    fn flush(&mut self, l: &mut Leaves) -> Result<(), BoltError> {
        if l.page.is_empty() {
            return Ok(());
        }
        let b = page::leaf_page(self.next, &l.page, self.db.page_size());
        let id = self.write(&b)?;
        l.written.push((l.page[0].key.clone(), id));
        l.page.clear();
        l.bytes = page::HEADER;
        Ok(())
    }

    /// Branch pages over `children`, filled in order: the next level up.
    fn branches(&mut self, children: &[(Vec<u8>, u64)]) -> Result<Vec<(Vec<u8>, u64)>, BoltError> {
        let ps = self.db.page_size();
        let mut out = Vec::new();
        let mut start = 0;
        let mut bytes = page::HEADER;
        for (i, (k, _)) in children.iter().enumerate() {
            let size = page::branch_size(k);
            if i > start && bytes + size > ps {
                let b = page::branch_page(self.next, &children[start..i], ps);
                out.push((children[start].0.clone(), self.write(&b)?));
                start = i;
                bytes = page::HEADER;
            }
            bytes += size;
        }
        if start < children.len() {
            let b = page::branch_page(self.next, &children[start..], ps);
            out.push((children[start].0.clone(), self.write(&b)?));
        }
        Ok(out)
    }

    /// Branch levels over `children` up to one root (an empty tree gets an empty leaf).
    fn root_over(&mut self, mut children: Vec<(Vec<u8>, u64)>) -> Result<u64, BoltError> {
        if children.is_empty() {
            let b = page::leaf_page(self.next, &[], self.db.page_size());
            return self.write(&b);
        }
        while children.len() > 1 {
            children = self.branches(&children)?;
        }
        Ok(children[0].1)
    }

    /// The tree at `root` with `more` after its entries (every key of `more` sorts after
    /// the tree's last): only its rightmost path is written again. Returns the new root.
    pub fn extend(
        &mut self,
        root: &Root,
        more: &mut dyn FnMut(&mut Self, &mut Leaves) -> Result<(), BoltError>,
    ) -> Result<u64, BoltError> {
        let mut leaves = self.leaves();
        let (spine, last_leaf) = match root {
            Root::Inline(b) => (Vec::new(), b.clone()),
            Root::Page(id) => {
                let mut spine = self.db.spine(*id)?;
                let (_, leaf) = spine
                    .pop()
                    .ok_or_else(|| self.db.unexpected("a tree without a leaf"))?;
                (spine, leaf)
            }
        };
        for (flags, k, v) in page::leaf_elements(&last_leaf).map_err(|e| self.db.page_err(e))? {
            let e = LeafEntry {
                flags,
                key: k.to_vec(),
                value: v.to_vec(),
            };
            self.push(&mut leaves, e)?;
        }
        more(self, &mut leaves)?;
        self.flush(&mut leaves)?;
        let mut children = leaves.written;
        // Each branch of the rightmost path, bottom up: its children but the last (the
        // page rewritten below it), then what replaced that page.
        for (_, b) in spine.iter().rev() {
            let mut level: Vec<(Vec<u8>, u64)> = page::branch_elements(b)
                .map_err(|e| self.db.page_err(e))?
                .into_iter()
                .map(|(k, c)| (k.to_vec(), c))
                .collect();
            level.pop();
            level.extend(children);
            children = self.branches(&level)?;
        }
        self.root_over(children)
    }

    /// A new tree holding exactly `entries` (sorted, distinct keys). Returns its root.
    pub fn rebuild(&mut self, mut entries: Vec<LeafEntry>) -> Result<u64, BoltError> {
        self.build(&mut |append, leaves| {
            for e in entries.drain(..) {
                append.push(leaves, e)?;
            }
            Ok(())
        })
    }

    /// A new tree holding what `fill` pushes (in increasing key order), streamed: only
    /// each leaf's first key is kept until the branches are written. Returns its root.
    pub fn build(
        &mut self,
        fill: &mut dyn FnMut(&mut Self, &mut Leaves) -> Result<(), BoltError>,
    ) -> Result<u64, BoltError> {
        let mut leaves = self.leaves();
        fill(self, &mut leaves)?;
        self.flush(&mut leaves)?;
        self.root_over(leaves.written)
    }

    /// Writes out the new pages, then the next meta: the root bucket at `root`. Nothing is
    /// synced: the files written here are the agent's scratch copies, which whoever keeps
    /// one syncs whole (a restore point's when it is sealed) and a crash has written again.
    pub fn commit(mut self, root: u64) -> Result<(), BoltError> {
        self.out.flush().map_err(|e| self.db.io(e))?;
        let meta = Meta {
            root,
            freelist: NO_FREELIST,
            pgid: self.next,
            txid: self.db.meta.txid + 1,
            ..self.db.meta
        };
        let at = meta.txid % 2;
        let b = meta.page(at);
        self.db
            .file
            .write_all_at(&b, at * self.db.page_size() as u64)
            .map_err(|e| self.db.io(e))?;
        self.db.meta = meta;
        Ok(())
    }

    pub fn db(&self) -> &Db {
        self.db
    }
}

/// The root bucket's entries with the top-level buckets in `replaced` pointing at new
/// roots (name, root page; their sequence kept): what [`Append::rebuild`] writes as the
/// new root bucket.
pub fn root_entries_with(db: &Db, replaced: &[(&[u8], u64)]) -> Result<Vec<LeafEntry>, BoltError> {
    let mut out = Vec::new();
    db.for_each(&Root::Page(db.meta.root), &mut |flags, k, v| {
        let value = match replaced.iter().find(|(name, _)| *name == k) {
            Some((_, root)) if flags & BUCKET_FLAG != 0 => {
                let (_, sequence, _) = page::bucket_value(v).unwrap_or((0, 0, &[]));
                page::bucket_value_of(*root, sequence)
            }
            _ => v.to_vec(),
        };
        out.push(LeafEntry {
            flags,
            key: k.to_vec(),
            value,
        });
        Ok(())
    })?;
    Ok(out)
}
