//! A snapshot's download in one pass, on one blocking thread: the stored object is read in
//! large blocks (a `file://` object straight from its file, any other store's stream
//! through a short channel), hashed as stored, decrypted when the manifest says so,
//! decompressed when it says so, checked against etcd's trailer as plaintext, and written
//! to the destination — each byte read once, memory bounded by a few blocks and zstd's
//! window whatever the snapshot's size. The destination is not synced to disk.
//!
//! What the bytes showed is returned, not judged: [`super::restore::fetch_verified`] compares
//! it with the manifest and says which check failed.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures_util::StreamExt;

use super::compress;
use super::crypt::{self, CryptError, Keys};
use super::manifest::Manifest;
use super::snapshot::{Checked, StreamCheck};
use super::store::{Reading, Store, StoreError};

/// The download could not be done: the store's or the local disk's fault, not the bytes'.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("download: {op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The size of each read of the stored object and each write of the plaintext.
const BLOCK: usize = 256 * 1024;
/// Chunks of a remote object's stream held between the network and the blocking thread.
const CHANNEL_CHUNKS: usize = 4;

/// Why the plaintext could not be read out of the stored bytes.
#[derive(Debug)]
pub enum Undecodable {
    /// No configured key opens it, or the ciphertext fails its authentication.
    Decrypt(CryptError),
    /// The bytes are not the zstd stream the manifest says.
    Decompress(std::io::Error),
}

/// What a download found.
#[derive(Debug)]
pub struct Fetched {
    /// The stored object's size and SHA-256, every byte read; `None` when the download
    /// stopped before reading them all (no configured key opens the object).
    pub stored: Option<Checked>,
    /// etcd's trailer over the plaintext (`Err(why)` when it does not match), or why the
    /// plaintext could not be read.
    pub plain: Result<Result<(), String>, Undecodable>,
}

/// The stored object's bytes as they arrive, hashed on the way; the first error reading
/// them is kept, so the stages above can tell it from their own.
struct Raw {
    source: Source,
    check: StreamCheck,
    failed: Option<FetchError>,
}

enum Source {
    Local {
        file: std::io::Take<std::fs::File>,
        path: PathBuf,
    },
    Remote {
        chunks: tokio::sync::mpsc::Receiver<Result<Bytes, StoreError>>,
        left: Bytes,
    },
}

impl Raw {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = match &mut self.source {
            Source::Local { file, path } => match file.read(buf) {
                Ok(n) => n,
                Err(e) => {
                    let failed = std::io::Error::new(e.kind(), e.to_string());
                    self.failed = Some(FetchError::Io {
                        op: "read",
                        path: path.clone(),
                        source: e,
                    });
                    return Err(failed);
                }
            },
            Source::Remote { chunks, left } => {
                while left.is_empty() {
                    match chunks.blocking_recv() {
                        Some(Ok(chunk)) => *left = chunk,
                        Some(Err(e)) => {
                            let failed = std::io::Error::other(e.to_string());
                            self.failed = Some(FetchError::Store(e));
                            return Err(failed);
                        }
                        None => return Ok(0),
                    }
                }
                let n = left.len().min(buf.len());
                buf[..n].copy_from_slice(&left.split_to(n));
                n
            }
        };
        self.check.update(&buf[..n]);
        Ok(n)
    }
}

/// The raw reader, shared between the decoding stages (which own a handle) and the
/// pipeline (which drains it after a decoding error, so the object's checksum is known).
#[derive(Clone)]
struct Shared(Arc<Mutex<Raw>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Raw> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Read for Shared {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.lock().read(buf)
    }
}

/// A stage's reader whose errors are noted, so they are told from the stages around it.
struct Noted<R> {
    inner: R,
    error: Arc<Mutex<Option<std::io::Error>>>,
}

impl<R: Read> Read for Noted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).map_err(|e| {
            let said = std::io::Error::new(e.kind(), e.to_string());
            *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            said
        })
    }
}

/// Reads until `buf` is full or the stream ends.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> FetchError + 'a {
    move |source| FetchError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Downloads `m`'s object from `store`, writing the plaintext to `to`. An error is the
/// store's or the local disk's; what the bytes themselves showed is in [`Fetched`].
pub async fn download(store: &Store, m: &Manifest, to: &Path) -> Result<Fetched, FetchError> {
    let object = m.db_object();
    let (source, forward) = match store.open_read(&object).await? {
        Reading::Local {
            mut file,
            path,
            start,
            len,
        } => {
            use std::io::Seek;
            file.seek(std::io::SeekFrom::Start(start))
                .map_err(io("seek", &path))?;
            (
                Source::Local {
                    file: file.take(len),
                    path,
                },
                None,
            )
        }
        Reading::Stream(mut stream) => {
            let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL_CHUNKS);
            // Ends when the stream does, or when the blocking side stops reading.
            let forward = tokio::spawn(async move {
                while let Some(chunk) = stream.next().await {
                    if tx.send(chunk).await.is_err() {
                        break;
                    }
                }
            });
            (
                Source::Remote {
                    chunks: rx,
                    left: Bytes::new(),
                },
                Some(forward),
            )
        }
    };
    let raw = Shared(Arc::new(Mutex::new(Raw {
        source,
        check: StreamCheck::whole_only(),
        failed: None,
    })));
    let (m, keys, to) = (m.clone(), store.keys().clone(), to.to_path_buf());
    let done = tokio::task::spawn_blocking(move || pipeline(raw, &m, &keys, &to)).await;
    if let Some(f) = forward {
        f.abort();
    }
    done.map_err(|e| FetchError::Io {
        op: "download",
        path: PathBuf::from(store.url()),
        source: std::io::Error::other(e),
    })?
}

/// The blocking part: stored bytes → (decrypt) → (decompress) → trailer check → `to`.
fn pipeline(raw: Shared, m: &Manifest, keys: &Keys, to: &Path) -> Result<Fetched, FetchError> {
    let input = std::io::BufReader::with_capacity(BLOCK, raw.clone());
    let decrypt_error = Arc::new(Mutex::new(None));
    let decrypted: Box<dyn Read + Send> = match &m.encryption {
        None => Box::new(input),
        Some(enc) => match crypt::decrypting(&m.name, &enc.key, keys, input) {
            Ok(r) => Box::new(Noted {
                inner: r,
                error: decrypt_error.clone(),
            }),
            Err(e @ CryptError::Corrupt { .. }) => {
                return undecodable(&raw, Undecodable::Decrypt(e));
            }
            Err(e) => {
                // The key, not the bytes: they need not all be read to say so.
                if let Some(failed) = raw.lock().failed.take() {
                    return Err(failed);
                }
                return Ok(Fetched {
                    stored: None,
                    plain: Err(Undecodable::Decrypt(e)),
                });
            }
        },
    };
    let mut plain: Box<dyn Read + Send> = match m.compression.as_deref() {
        None => decrypted,
        Some(_) => compress::decompressing(decrypted).map_err(io("decompress", to))?,
    };
    let mut file = std::fs::File::create(to).map_err(io("create", to))?;
    let mut trailer = StreamCheck::trailer_only();
    let mut buf = vec![0u8; BLOCK];
    loop {
        let n = match fill(&mut plain, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                if let Some(failed) = raw.lock().failed.take() {
                    return Err(failed);
                }
                let noted = decrypt_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                let why = match (noted, &m.encryption) {
                    (Some(d), Some(enc)) => {
                        Undecodable::Decrypt(crypt::read_error(&m.name, &enc.key, d))
                    }
                    _ => Undecodable::Decompress(e),
                };
                return undecodable(&raw, why);
            }
        };
        if n == 0 {
            break;
        }
        trailer.update(&buf[..n]);
        file.write_all(&buf[..n]).map_err(io("write", to))?;
    }
    // Not synced: the file is read once by etcd's tool and deleted, and syncing it would
    // write every byte to the disk for nothing (a few seconds per GiB, per pod, at the
    // moment the restore waits on the disk). A file a crash may have torn is never used:
    // only this process's own downloads are ([`super::restore::verified_here`]).
    drop(file);
    drop(plain);
    // Whatever follows the plaintext's end (nothing, in a good object) still counts
    // toward the stored object's checksum.
    let stored = drained(&raw)?;
    Ok(Fetched {
        stored: Some(stored),
        plain: Ok(trailer.finish().trailer),
    })
}

/// Reads the rest of the stored object (its checksum then says whether the bytes are the
/// manifest's: the cause, when they are not) and reports `why`.
fn undecodable(raw: &Shared, why: Undecodable) -> Result<Fetched, FetchError> {
    Ok(Fetched {
        stored: Some(drained(raw)?),
        plain: Err(why),
    })
}

fn drained(raw: &Shared) -> Result<Checked, FetchError> {
    let mut buf = vec![0u8; BLOCK];
    let mut r = raw.lock();
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                return Err(r.failed.take().unwrap_or_else(|| FetchError::Io {
                    op: "read",
                    path: PathBuf::new(),
                    source: e,
                }))
            }
        }
    }
    let check = std::mem::replace(&mut r.check, StreamCheck::whole_only());
    Ok(check.finish())
}
