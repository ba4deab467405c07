//! Taking a snapshot: etcd's Maintenance.Snapshot stream goes straight into a multipart
//! upload (memory bounded whatever the database's size) while two SHA-256s run over it:
//! one over the whole object (for later downloads) and one over the database, checked
//! against the 32-byte SHA-256 etcd appends to the stream. The manifest is written last.

use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::compress::{Compressing, Compression};
use super::crypt::{Encrypting, Key};
use super::manifest::{self, Encryption, Manifest};
use super::store::{Store, StoreError};

/// The length of etcd's SHA-256 trailer.
pub const TRAILER: usize = 32;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SourceError {
    #[error("etcd at {endpoint} is unreachable: {detail}")]
    Unreachable { endpoint: String, detail: String },
    /// The requested revision is older than the member's compacted revision.
    #[error("revision {revision} is compacted away at etcd {endpoint}")]
    Compacted { endpoint: String, revision: i64 },
    #[error("etcd at {endpoint}: {detail}")]
    Other { endpoint: String, detail: String },
}

/// The member a snapshot is taken from, as it describes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    pub cluster_id: u64,
    pub member_id: u64,
    pub revision: i64,
    pub version: String,
}

/// A member's key-value hash at a revision (`HashKV`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvHash {
    pub hash: u32,
    /// The compacted revision the hash starts from: two hashes compare only when equal.
    pub compact_revision: i64,
}

pub type Chunks = BoxStream<'static, Result<Bytes, SourceError>>;

/// Where snapshots come from: one etcd member.
pub trait SnapshotSource: Send + Sync {
    fn info(&self) -> impl Future<Output = Result<SourceInfo, SourceError>> + Send;
    /// The snapshot stream: the database, then etcd's 32-byte SHA-256 of it.
    fn snapshot(&self) -> impl Future<Output = Result<Chunks, SourceError>> + Send;
    /// `HashKV` at `revision`.
    fn hash_kv(&self, revision: i64) -> impl Future<Output = Result<KvHash, SourceError>> + Send;
    /// The leases the keys present at `revision` name, with their granted TTLs (what the
    /// drills compare besides the hash, which does not cover leases).
    fn leases_at(
        &self,
        revision: i64,
    ) -> impl Future<Output = Result<crate::backup::archive::leases::LeaseView, SourceError>> + Send;
}

/// The etcd-client implementation: one connection to one member, with no per-request
/// time-out on the snapshot stream (a large database streams for minutes).
#[derive(Clone)]
pub struct EtcdSource {
    client: etcd_client::Client,
    endpoint: String,
}

/// How to reach the member: TLS and credentials as the rest of the agent uses them.
#[derive(Debug, Clone)]
pub struct EtcdTarget {
    pub host: String,
    pub ip: IpAddr,
    pub port: u16,
    pub tls: Option<crate::tls::TlsMaterial>,
    pub auth: Option<crate::etcd::Auth>,
}

impl EtcdTarget {
    /// This pod's own member, reached at `ip` (its local address) with the agent's etcd
    /// access.
    pub fn local(id: &crate::identity::Identity, ip: IpAddr, access: &crate::etcd::Access) -> Self {
        EtcdTarget {
            host: id.host(id.ordinal),
            ip,
            port: id.client_port,
            tls: access.tls.clone(),
            auth: access.auth.clone(),
        }
    }
}

/// Calls other than the stream get this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn source_error(endpoint: &str, e: etcd_client::Error) -> SourceError {
    let detail = match &e {
        etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
        other => other.to_string(),
    };
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            SourceError::Unreachable {
                endpoint: endpoint.to_string(),
                detail,
            }
        }
        _ => SourceError::Other {
            endpoint: endpoint.to_string(),
            detail,
        },
    }
}

impl EtcdSource {
    pub async fn connect(target: &EtcdTarget) -> Result<EtcdSource, SourceError> {
        let addr = std::net::SocketAddr::new(target.ip, target.port);
        let scheme = if target.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let endpoint = format!("{}:{}", target.host, target.port);
        let mut options =
            etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(3));
        if let Some(tls) = &target.tls {
            options = options.with_tls(tls.etcd_client_tls(&target.host));
        }
        if let Some(auth) = &target.auth {
            options = options
                .with_user(auth.username.clone(), auth.password.clone())
                .with_auto_token_refresh(true);
        }
        let client = tokio::time::timeout(
            CALL_TIMEOUT,
            etcd_client::Client::connect([format!("{scheme}://{addr}")], Some(options)),
        )
        .await
        .map_err(|_| SourceError::Unreachable {
            endpoint: endpoint.clone(),
            detail: "connect timed out".into(),
        })?
        .map_err(|e| source_error(&endpoint, e))?;
        Ok(EtcdSource { client, endpoint })
    }

    /// The connection, for the archive's calls (`archive::watch`).
    pub fn client(&self) -> etcd_client::Client {
        self.client.clone()
    }

    /// `host:port` of the member, as errors name it.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn timed<T>(
        &self,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, SourceError> {
        match tokio::time::timeout(CALL_TIMEOUT, f).await {
            Ok(r) => r.map_err(|e| source_error(&self.endpoint, e)),
            Err(_) => Err(SourceError::Other {
                endpoint: self.endpoint.clone(),
                detail: "no answer in time".into(),
            }),
        }
    }
}

impl SnapshotSource for EtcdSource {
    async fn info(&self) -> Result<SourceInfo, SourceError> {
        let mut c = self.client.clone();
        let s = self.timed(c.status()).await?;
        let (cluster_id, member_id, revision) = s
            .header()
            .map(|h| (h.cluster_id(), h.member_id(), h.revision()))
            .unwrap_or_default();
        Ok(SourceInfo {
            cluster_id,
            member_id,
            revision,
            version: s.version().to_string(),
        })
    }

    async fn snapshot(&self) -> Result<Chunks, SourceError> {
        let mut c = self.client.clone();
        let stream = self.timed(c.snapshot()).await?;
        let endpoint = self.endpoint.clone();
        let chunks = futures_util::stream::unfold(Some(stream), move |state| {
            let endpoint = endpoint.clone();
            async move {
                let mut stream = state?;
                match stream.message().await {
                    Ok(Some(resp)) => Some((Ok(Bytes::copy_from_slice(resp.blob())), Some(stream))),
                    Ok(None) => None,
                    Err(e) => Some((Err(source_error(&endpoint, e)), None)),
                }
            }
        });
        Ok(chunks.boxed())
    }

    async fn hash_kv(&self, revision: i64) -> Result<KvHash, SourceError> {
        let mut c = self.client.clone();
        let answer = tokio::time::timeout(CALL_TIMEOUT, c.hash_kv(revision))
            .await
            .map_err(|_| SourceError::Other {
                endpoint: self.endpoint.clone(),
                detail: "no answer in time".into(),
            })?;
        match answer {
            Ok(r) => Ok(KvHash {
                hash: r.hash(),
                compact_revision: r.compact_version(),
            }),
            // etcd's ErrGRPCCompacted.
            Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::OutOfRange => {
                Err(SourceError::Compacted {
                    endpoint: self.endpoint.clone(),
                    revision,
                })
            }
            Err(e) => Err(source_error(&self.endpoint, e)),
        }
    }

    async fn leases_at(
        &self,
        revision: i64,
    ) -> Result<crate::backup::archive::leases::LeaseView, SourceError> {
        use crate::backup::archive::lease_read::{self, ReadError, Scope};
        match lease_read::read(&self.client, revision, Scope::Named, CALL_TIMEOUT).await {
            Ok(v) => Ok(v),
            Err(ReadError::Compacted) => Err(SourceError::Compacted {
                endpoint: self.endpoint.clone(),
                revision,
            }),
            Err(ReadError::Failed(detail)) => Err(SourceError::Other {
                endpoint: self.endpoint.clone(),
                detail,
            }),
        }
    }
}

/// The running checksums of a snapshot stream: SHA-256 of every byte (what the store
/// holds), and etcd's trailer check (the last 32 bytes seen are held back from the
/// database hash, since they may be etcd's trailer). Each is kept only where it is used:
/// hashing a gigabyte costs about a second.
pub struct StreamCheck {
    whole: Option<Sha256>,
    db: Option<Sha256>,
    tail: Vec<u8>,
    size: u64,
}

impl Default for StreamCheck {
    /// Both checks.
    fn default() -> Self {
        StreamCheck {
            whole: Some(Sha256::new()),
            db: Some(Sha256::new()),
            tail: Vec::new(),
            size: 0,
        }
    }
}

/// What the checksums found once the stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub size: u64,
    /// SHA-256 of every byte, hexadecimal (empty when not kept).
    pub sha256: String,
    /// `Err(why)` when etcd's trailer is missing or does not match the database (`Ok`
    /// when not checked).
    pub trailer: Result<(), String>,
}

impl StreamCheck {
    /// etcd's trailer check only (the plaintext of an encrypted snapshot).
    pub fn trailer_only() -> Self {
        StreamCheck {
            whole: None,
            ..Self::default()
        }
    }

    /// The SHA-256 of every byte only (the ciphertext of an encrypted snapshot).
    pub fn whole_only() -> Self {
        StreamCheck {
            db: None,
            ..Self::default()
        }
    }

    pub fn update(&mut self, chunk: &[u8]) {
        if let Some(w) = self.whole.as_mut() {
            w.update(chunk);
        }
        self.size += chunk.len() as u64;
        let Some(db) = self.db.as_mut() else {
            return;
        };
        // The last TRAILER bytes seen stay in `tail`; everything before them is hashed,
        // straight from `chunk` when it is longer than the trailer (no copy).
        if chunk.len() >= TRAILER {
            db.update(&self.tail);
            let keep = chunk.len() - TRAILER;
            db.update(&chunk[..keep]);
            self.tail.clear();
            self.tail.extend_from_slice(&chunk[keep..]);
            return;
        }
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > TRAILER {
            let n = self.tail.len() - TRAILER;
            db.update(&self.tail[..n]);
            self.tail.drain(..n);
        }
    }

    pub fn finish(self) -> Checked {
        let trailer = match self.db {
            None => Ok(()),
            Some(_) if self.tail.len() < TRAILER => Err(format!(
                "the snapshot is {} bytes, too short to hold etcd's SHA-256 trailer",
                self.size
            )),
            Some(db) => {
                if db.finalize().as_slice() == self.tail.as_slice() {
                    Ok(())
                } else {
                    Err("etcd's SHA-256 trailer does not match the database".to_string())
                }
            }
        };
        Checked {
            size: self.size,
            sha256: self.whole.map(|w| hex(&w.finalize())).unwrap_or_default(),
            trailer,
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Error)]
pub enum TakeError {
    #[error("cannot encrypt the snapshot: {0}")]
    Encrypt(std::io::Error),
    #[error("cannot compress the snapshot: {0}")]
    Compress(std::io::Error),
    #[error("cannot take a snapshot: {0}")]
    Source(#[from] SourceError),
    #[error("cannot store the snapshot: {0}")]
    Store(#[from] StoreError),
}

/// Takes one snapshot from `source` into `store`, taken at `now`: uploads it, checks it
/// while streaming, and writes its manifest last. A snapshot whose trailer does not match
/// is still stored and listed, marked `verified: false` with the reason, and never restored;
/// the caller counts it as a failure.
pub async fn take<S: SnapshotSource>(
    source: &S,
    store: &Store,
    now: SystemTime,
) -> Result<Manifest, TakeError> {
    let info = source.info().await?;
    let name = manifest::snapshot_name(now, info.revision);
    let mut stream = source.snapshot().await?;
    let mut upload = store.upload(&manifest::db_object(&name)).await?;
    let encrypt_to = store.keys().write.clone();
    let compression = store.compression();
    let mut out = match Outgoing::new(compression, encrypt_to.as_ref()) {
        Ok(o) => o,
        Err(e) => {
            upload.abort().await;
            return Err(e);
        }
    };
    // The plaintext's checks (etcd's trailer) and the stored object's (what a restore
    // downloads): one pass over the same bytes unless the snapshot is compressed or
    // encrypted on its way out.
    let (mut plain, mut stored) = if out.transforms() {
        (StreamCheck::trailer_only(), Some(StreamCheck::whole_only()))
    } else {
        (StreamCheck::default(), None)
    };
    loop {
        let (bytes, last) = match stream.next().await {
            Some(Ok(chunk)) => {
                plain.update(&chunk);
                (out.push(&chunk), false)
            }
            Some(Err(e)) => {
                upload.abort().await;
                return Err(e.into());
            }
            None => (out.finish(), true),
        };
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => {
                upload.abort().await;
                return Err(e);
            }
        };
        if let Some(s) = stored.as_mut() {
            s.update(&bytes);
        }
        if let Err(e) = upload.write(&bytes).await {
            upload.abort().await;
            return Err(e.into());
        }
        if last {
            break;
        }
    }
    upload.finish().await?;
    let plain = plain.finish();
    let stored = match stored {
        Some(s) => s.finish(),
        None => plain.clone(),
    };
    let (time, time_unix) = manifest::timestamps(now);
    let m = Manifest {
        name,
        cluster_id: format!("{:x}", info.cluster_id),
        member_id: format!("{:x}", info.member_id),
        revision: info.revision,
        etcd_version: info.version,
        size: stored.size,
        sha256: stored.sha256,
        time,
        time_unix,
        verified: plain.trailer.is_ok(),
        unverified_reason: plain.trailer.err(),
        encryption: encrypt_to.map(|k| Encryption {
            scheme: "age-x25519".into(),
            key: k.fingerprint().to_string(),
        }),
        compression: compression.manifest_name(),
        drill: None,
    };
    write_manifest(store, &m).await?;
    Ok(m)
}

/// What happens to the plaintext on its way to the store: compressed (zstd), then
/// encrypted (age), either or both or neither.
struct Outgoing {
    compress: Option<Compressing>,
    encrypt: Option<Encrypting>,
}

impl Outgoing {
    fn new(compression: Compression, key: Option<&Key>) -> Result<Outgoing, TakeError> {
        Ok(Outgoing {
            compress: match compression {
                Compression::Zstd => Some(Compressing::new().map_err(TakeError::Compress)?),
                Compression::None => None,
            },
            encrypt: match key {
                Some(k) => Some(Encrypting::new(k).map_err(TakeError::Encrypt)?),
                None => None,
            },
        })
    }

    /// Is what the store holds other than the plaintext?
    fn transforms(&self) -> bool {
        self.compress.is_some() || self.encrypt.is_some()
    }

    /// The bytes to store for `plain` (what each stage has ready so far).
    fn push(&mut self, plain: &[u8]) -> Result<Vec<u8>, TakeError> {
        let packed = match self.compress.as_mut() {
            Some(c) => c.update(plain).map_err(TakeError::Compress)?,
            None => plain.to_vec(),
        };
        match self.encrypt.as_mut() {
            Some(e) if !packed.is_empty() => e.update(&packed).map_err(TakeError::Encrypt),
            _ => Ok(packed),
        }
    }

    /// The rest: the compressed stream's end, then the last sealed chunk.
    fn finish(&mut self) -> Result<Vec<u8>, TakeError> {
        let mut packed = match self.compress.take() {
            Some(c) => c.finish().map_err(TakeError::Compress)?,
            None => Vec::new(),
        };
        if let Some(mut e) = self.encrypt.take() {
            packed = e.update(&packed).map_err(TakeError::Encrypt)?;
            packed.extend(e.finish().map_err(TakeError::Encrypt)?);
        }
        Ok(packed)
    }
}

/// Writes (or rewrites) a manifest.
pub async fn write_manifest(store: &Store, m: &Manifest) -> Result<(), StoreError> {
    let json = serde_json::to_vec_pretty(m).unwrap_or_default();
    store.put(&m.json_object(), json).await
}

/// An in-memory source for tests: a database and a trailer (right or wrong), in chunks.
#[derive(Debug, Clone)]
pub struct FakeSource {
    pub info: SourceInfo,
    /// The whole stream, trailer included.
    pub stream: Vec<u8>,
    pub chunk: usize,
    /// Fail the stream after this many bytes.
    pub fail_after: Option<usize>,
    pub hash: KvHash,
}

impl FakeSource {
    /// A source streaming `db` followed by its correct SHA-256.
    pub fn new(db: &[u8], revision: i64) -> Self {
        let mut stream = db.to_vec();
        stream.extend_from_slice(&Sha256::digest(db));
        FakeSource {
            info: SourceInfo {
                cluster_id: 0xc1,
                member_id: 0xa1,
                revision,
                version: "3.5.1".into(),
            },
            stream,
            chunk: 7,
            fail_after: None,
            hash: KvHash {
                hash: 1,
                compact_revision: 0,
            },
        }
    }
}

impl SnapshotSource for FakeSource {
    async fn info(&self) -> Result<SourceInfo, SourceError> {
        Ok(self.info.clone())
    }

    async fn snapshot(&self) -> Result<Chunks, SourceError> {
        let end = self.fail_after.unwrap_or(self.stream.len());
        let mut items: Vec<Result<Bytes, SourceError>> = self.stream[..end]
            .chunks(self.chunk.max(1))
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        if self.fail_after.is_some() {
            items.push(Err(SourceError::Unreachable {
                endpoint: "fake".into(),
                detail: "stream broken".into(),
            }));
        }
        Ok(futures_util::stream::iter(items).boxed())
    }

    async fn hash_kv(&self, _revision: i64) -> Result<KvHash, SourceError> {
        Ok(self.hash)
    }

    async fn leases_at(
        &self,
        _revision: i64,
    ) -> Result<crate::backup::archive::leases::LeaseView, SourceError> {
        Err(SourceError::Other {
            endpoint: "fake".into(),
            detail: "the fake source holds no leases".into(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
