//! The object store behind a narrow API: built from a backup URL, it writes a stream as a
//! multipart upload with bounded memory, reads an object as a stream of chunks, lists and
//! deletes names. Names are relative to the URL's prefix; no other module sees
//! `object_store` types. A write returns only once the object is durable: S3, GCS and Azure
//! say so when they answer; a `file://` store fsyncs each file before renaming it into
//! place, then its directory, and every directory it creates.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::compress::Compression;
use super::crypt::Keys;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientConfigKey, GetResultPayload, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig, WriteMultipart,
};
use thiserror::Error;

/// Part size of a multipart upload (S3's minimum is 5 MiB).
pub const PART_SIZE: usize = 5 * 1024 * 1024;
/// Parts in flight at once: the upload holds at most about `(1 + this) × PART_SIZE` bytes.
const PARTS_IN_FLIGHT: usize = 2;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("backup URL {url:?} is not usable: {detail}")]
    BadUrl { url: String, detail: String },
    #[error("backup store {store}: {op} {name:?} failed: {detail}")]
    Io {
        store: String,
        op: &'static str,
        name: String,
        detail: String,
    },
    #[error("backup store {store}: {name:?} does not exist")]
    NotFound { store: String, name: String },
}

/// An error and its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// One backup location: a bucket (or directory) and a prefix inside it.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    /// The URL, for logs and errors (it carries no credentials).
    url: String,
    /// What snapshots are encrypted with on the way in and decrypted with on the way out.
    keys: Keys,
    /// How new snapshots are compressed (a download reads what the manifest says).
    compression: Compression,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("url", &self.url).finish()
    }
}

/// An object's name (relative to the prefix), size, and ETag when the store gives one
/// (it changes whenever the object is written again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub size: u64,
    pub e_tag: Option<String>,
}

/// Checks a backup URL's form without touching the network (config validation).
pub fn check_url(url: &str) -> Result<(), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "must look like s3://bucket/prefix or file:///path".to_string())?;
    match scheme {
        "s3" | "gs" | "az" => {
            let bucket = rest.split('/').next().unwrap_or_default();
            if bucket.is_empty() {
                return Err(format!("{scheme}:// needs a bucket (or container) name"));
            }
            Ok(())
        }
        "file" => {
            if !rest.starts_with('/') || rest.len() < 2 {
                return Err("file:// needs an absolute path, such as file:///backups".into());
            }
            Ok(())
        }
        other => Err(format!("scheme {other:?} is not one of s3, gs, az, file")),
    }
}

/// Creates `dir` and any missing parent, then fsyncs `dir` and each ancestor on the same
/// file system (up to its mount point), so the store's own directory survives a power cut
/// before anything is written into it. Syncing what already existed too keeps it
/// idempotent: a run killed between creating and syncing is completed by the next. A
/// read-only file system is left as it is (nothing can be written there to lose).
fn create_dir_durably(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(dir)?;
    let device = std::fs::metadata(dir)?.dev();
    let mut at = Some(dir);
    while let Some(d) = at {
        if std::fs::metadata(d)?.dev() != device {
            break;
        }
        match std::fs::File::open(d)?.sync_all() {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem => return Ok(()),
            Err(e) => return Err(e),
        }
        at = d.parent();
    }
    Ok(())
}

fn retry() -> RetryConfig {
    // Fail within seconds when the store is down: the caller counts the failure and tries
    // again at its next tick, instead of one call blocking for minutes.
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 3,
        retry_timeout: Duration::from_secs(20),
    }
}

/// Time-outs set as configuration keys, so the options read from the environment
/// (`AWS_ALLOW_HTTP`, …) are kept.
const CLIENT_TIMEOUTS: [(ClientConfigKey, &str); 2] = [
    (ClientConfigKey::ConnectTimeout, "5s"),
    (ClientConfigKey::Timeout, "120s"),
];

impl Store {
    /// Builds the store for `url`. S3 reads `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP` (and the other `AWS_*` variables
    /// `object_store` knows); gs:// and az:// read `GOOGLE_*` and `AZURE_*` likewise.
    /// `file://` creates its directory if missing.
    pub fn open(url: &str) -> Result<Store, StoreError> {
        let bad = |detail: String| StoreError::BadUrl {
            url: url.to_string(),
            detail,
        };
        check_url(url).map_err(bad)?;
        // It takes the process's crypto provider (reqwest/kube bring none of their own).
        crate::tls::install_default_provider();
        let (scheme, rest) = url.split_once("://").unwrap_or_default();
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let inner: Arc<dyn ObjectStore> = match scheme {
            "s3" => Arc::new(
                CLIENT_TIMEOUTS
                    .iter()
                    .fold(AmazonS3Builder::from_env(), |b, (k, v)| {
                        b.with_config(AmazonS3ConfigKey::Client(*k), *v)
                    })
                    .with_bucket_name(bucket)
                    .with_retry(retry())
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            "gs" => Arc::new(
                CLIENT_TIMEOUTS
                    .iter()
                    .fold(GoogleCloudStorageBuilder::from_env(), |b, (k, v)| {
                        b.with_config(GoogleConfigKey::Client(*k), *v)
                    })
                    .with_bucket_name(bucket)
                    .with_retry(retry())
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            "az" => Arc::new(
                CLIENT_TIMEOUTS
                    .iter()
                    .fold(MicrosoftAzureBuilder::from_env(), |b, (k, v)| {
                        b.with_config(AzureConfigKey::Client(*k), *v)
                    })
                    .with_container_name(bucket)
                    .with_retry(retry())
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            _ => {
                let dir = format!("/{prefix}");
                create_dir_durably(std::path::Path::new(&dir))
                    .map_err(|e| bad(format!("cannot create {dir} durably: {e}")))?;
                // A write counts as stored only once it would survive a power cut of the node
                // that holds the directory: each file is fsynced before its rename into place,
                // then its directory (and each directory `object_store` creates on the way).
                let local = LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| bad(e.to_string()))?
                    .with_fsync(true)
                    .with_automatic_cleanup(true);
                return Ok(Store {
                    inner: Arc::new(local),
                    prefix: ObjPath::default(),
                    url: url.to_string(),
                    keys: Keys::default(),
                    compression: Compression::default(),
                });
            }
        };
        Ok(Store {
            inner,
            prefix: ObjPath::from(prefix.trim_matches('/')),
            url: url.to_string(),
            keys: Keys::default(),
            compression: Compression::default(),
        })
    }

    /// The same store, its snapshots encrypted with (and decrypted with) `keys`.
    pub fn with_keys(mut self, keys: Keys) -> Store {
        self.keys = keys;
        self
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The same store, its new snapshots compressed this way (zstd unless told).
    pub fn with_compression(mut self, compression: Compression) -> Store {
        self.compression = compression;
        self
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn path(&self, name: &str) -> ObjPath {
        let mut p = self.prefix.clone();
        for part in name.split('/').filter(|s| !s.is_empty()) {
            p = p.clone().join(part);
        }
        p
    }

    fn io(&self, op: &'static str, name: &str, e: object_store::Error) -> StoreError {
        match e {
            object_store::Error::NotFound { .. } => StoreError::NotFound {
                store: self.url.clone(),
                name: name.to_string(),
            },
            other => StoreError::Io {
                store: self.url.clone(),
                op,
                name: name.to_string(),
                detail: chain(&other),
            },
        }
    }

    /// Writes a small object in one request; durable when it returns.
    pub async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.inner
            .put(&self.path(name), PutPayload::from(bytes))
            .await
            .map_err(|e| self.io("put", name, e))?;
        Ok(())
    }

    /// Writes an object given in parts, one after another (no copy into one buffer);
    /// durable when it returns.
    pub async fn put_parts(&self, name: &str, parts: Vec<Vec<u8>>) -> Result<(), StoreError> {
        let payload: PutPayload = parts.into_iter().map(Bytes::from).collect();
        self.inner
            .put(&self.path(name), payload)
            .await
            .map_err(|e| self.io("put", name, e))?;
        Ok(())
    }

    /// Reads a whole (small) object.
    pub async fn get(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        let got = self
            .inner
            .get(&self.path(name))
            .await
            .map_err(|e| self.io("get", name, e))?;
        let bytes = got.bytes().await.map_err(|e| self.io("get", name, e))?;
        Ok(bytes.to_vec())
    }

    /// Reads an object as a stream of chunks (memory bounded by the chunk size).
    pub async fn get_stream(
        &self,
        name: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, StoreError>>, StoreError> {
        let got = self
            .inner
            .get(&self.path(name))
            .await
            .map_err(|e| self.io("get", name, e))?;
        let me = self.clone();
        let owned = name.to_string();
        Ok(got
            .into_stream()
            .map_err(move |e| me.io("get", &owned, e))
            .boxed())
    }

    /// Opens an object for a large sequential read: a local file as it is (`file://`: the
    /// caller reads it in large blocks on a blocking thread, where `object_store`'s stream
    /// would read 8 KiB per blocking task), any other store as its stream of chunks.
    pub async fn open_read(&self, name: &str) -> Result<Reading, StoreError> {
        let got = self
            .inner
            .get(&self.path(name))
            .await
            .map_err(|e| self.io("get", name, e))?;
        let me = self.clone();
        let owned = name.to_string();
        Ok(match got.payload {
            GetResultPayload::File(file, path) => Reading::Local {
                file,
                path,
                start: got.range.start,
                len: got.range.end.saturating_sub(got.range.start),
            },
            GetResultPayload::Stream(s) => {
                Reading::Stream(s.map_err(move |e| me.io("get", &owned, e)).boxed())
            }
        })
    }

    /// Starts a multipart upload of `name`.
    pub async fn upload(&self, name: &str) -> Result<Upload, StoreError> {
        let up = self
            .inner
            .put_multipart(&self.path(name))
            .await
            .map_err(|e| self.io("upload", name, e))?;
        Ok(Upload {
            writer: WriteMultipart::new_with_chunk_size(up, PART_SIZE),
            store: self.clone(),
            name: name.to_string(),
        })
    }

    /// Every object under `dir` (relative to the prefix), with names relative to the prefix.
    pub async fn list(&self, dir: &str) -> Result<Vec<Entry>, StoreError> {
        let base = self.path(dir);
        let metas: Vec<_> = self
            .inner
            .list(Some(&base))
            .try_collect()
            .await
            .map_err(|e| self.io("list", dir, e))?;
        let strip = self.prefix.as_ref();
        Ok(metas
            .into_iter()
            .map(|m| {
                let full = m.location.as_ref();
                let name = full
                    .strip_prefix(strip)
                    .unwrap_or(full)
                    .trim_start_matches('/')
                    .to_string();
                Entry {
                    name,
                    size: m.size,
                    e_tag: m.e_tag,
                }
            })
            .collect())
    }

    /// Deletes one object (only ever a backup this agent wrote).
    pub async fn delete(&self, name: &str) -> Result<(), StoreError> {
        match self.inner.delete(&self.path(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.io("delete", name, e)),
        }
    }
}

/// An object opened for reading by [`Store::open_read`].
pub enum Reading {
    /// A `file://` object: `len` bytes of `file` (at `path`) from `start`.
    Local {
        file: std::fs::File,
        path: std::path::PathBuf,
        start: u64,
        len: u64,
    },
    /// Any other store's object, chunk by chunk.
    Stream(BoxStream<'static, Result<Bytes, StoreError>>),
}

/// A multipart upload in progress: parts are sent as they fill, at most a few at once.
pub struct Upload {
    writer: WriteMultipart,
    store: Store,
    name: String,
}

impl Upload {
    /// Appends bytes, waiting while too many parts are in flight (the memory bound).
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        self.writer
            .wait_for_capacity(PARTS_IN_FLIGHT)
            .await
            .map_err(|e| self.store.io("upload", &self.name, e))?;
        self.writer.write(bytes);
        Ok(())
    }

    /// Completes the upload: the object appears whole, or not at all, and is durable when
    /// this returns.
    pub async fn finish(self) -> Result<(), StoreError> {
        let Upload {
            writer,
            store,
            name,
        } = self;
        writer
            .finish()
            .await
            .map_err(|e| store.io("upload", &name, e))?;
        Ok(())
    }

    /// Abandons the upload (best effort: a store may keep parts until its own clean-up).
    pub async fn abort(self) {
        let name = self.name.clone();
        if let Err(e) = self.writer.abort().await {
            tracing::warn!(name = %name, error = %e, "cannot abort the snapshot upload");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_by_form() {
        assert!(check_url("s3://bucket/prefix").is_ok());
        assert!(check_url("gs://bucket").is_ok());
        assert!(check_url("az://container/a/b").is_ok());
        assert!(check_url("file:///backups").is_ok());
        assert!(check_url("s3:///prefix").is_err());
        assert!(check_url("file://relative").is_err());
        assert!(check_url("http://x/y").is_err());
        assert!(check_url("/backups").is_err());
    }

    #[tokio::test]
    async fn file_store_round_trips_names_under_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/b", dir.path().display());
        let store = Store::open(&url).unwrap();
        store.put("snapshots/a.json", b"{}".to_vec()).await.unwrap();
        let mut up = store.upload("snapshots/a.db").await.unwrap();
        up.write(&[7u8; 1000]).await.unwrap();
        up.finish().await.unwrap();
        let mut names: Vec<(String, u64)> = store
            .list("snapshots")
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.size))
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                ("snapshots/a.db".to_string(), 1000),
                ("snapshots/a.json".to_string(), 2)
            ]
        );
        assert_eq!(store.get("snapshots/a.json").await.unwrap(), b"{}");
        store.delete("snapshots/a.db").await.unwrap();
        assert!(matches!(
            store.get("snapshots/a.db").await,
            Err(StoreError::NotFound { .. })
        ));
    }
}
