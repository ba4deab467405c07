//! Segments in the store: write one (compressed, encrypted with the write key when there
//! is one, its manifest last), list the manifests, read one back verified (SHA-256 of the
//! stored object, then decryption, decompression and decoding).

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::segment::{Builder, DecodeError, Segment};
use super::{parse_object, rfc3339_ms, segment_name, SegmentManifest, DIR};
use crate::backup::crypt::{self, CryptError};
use crate::backup::manifest::Encryption;
use crate::backup::snapshot::hex;
use crate::backup::store::{Store, StoreError};

/// A segment never decompresses to more than its manifest's `plain_size`, nor this: a
/// bound against a corrupted size in a manifest.
const PLAIN_LIMIT: usize = 1 << 30;

#[derive(Debug, Error)]
pub enum SegmentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("archive segment {name} fails its checksum: the stored object ({size} bytes, SHA-256 {sha256}) differs from its manifest")]
    Checksum {
        name: String,
        size: u64,
        sha256: String,
    },
    #[error("archive segment {name}: {source}")]
    Decrypt {
        name: String,
        #[source]
        source: CryptError,
    },
    #[error("archive segment {name} cannot be read: {source}")]
    Decode {
        name: String,
        #[source]
        source: DecodeError,
    },
    #[error("archive segment {name} holds no revision: nothing to store")]
    Empty { name: String },
    #[error("cannot encrypt archive segment {name}: {detail}")]
    Encrypt { name: String, detail: String },
}

impl SegmentError {
    /// Whether the segment itself is bad (its bytes, or no key opens it), as opposed to a
    /// store that could not be reached: a replay ends before a bad segment.
    pub fn is_bad_segment(&self) -> bool {
        !matches!(self, SegmentError::Store(_))
    }
}

/// Stores `segment` of cluster `cluster_id` (see [`put_built`]).
pub async fn put(
    store: &Store,
    cluster_id: u64,
    segment: Segment,
) -> Result<SegmentManifest, SegmentError> {
    let built = Builder::of(&segment).map_err(|e| SegmentError::Encrypt {
        name: "(new)".into(),
        detail: format!("zstd: {e}"),
    })?;
    drop(segment);
    put_built(store, cluster_id, built).await
}

/// Stores the segment `built` of cluster `cluster_id`: the object first, its manifest last
/// (a segment without a manifest is an incomplete upload, never read). The object goes
/// to the store in the builder's two parts, not copied into one buffer (unless it is
/// encrypted).
pub async fn put_built(
    store: &Store,
    cluster_id: u64,
    built: Builder,
) -> Result<SegmentManifest, SegmentError> {
    let built = built
        .finish()
        .map_err(|e| SegmentError::Encrypt {
            name: "(new)".into(),
            detail: format!("zstd: {e}"),
        })?
        .ok_or_else(|| SegmentError::Empty {
            name: "(empty)".into(),
        })?;
    let (first, last) = (built.first, built.last);
    let name = segment_name(first.0, last.0);
    let (parts, encryption) = match &store.keys().write {
        Some(key) => {
            let compressed = built.parts.concat();
            let sealed =
                crypt::encrypt_bytes(key, &compressed).map_err(|e| SegmentError::Encrypt {
                    name: name.clone(),
                    detail: e.to_string(),
                })?;
            let encryption = Encryption {
                scheme: "age-x25519".into(),
                key: key.fingerprint().to_string(),
            };
            (vec![sealed], Some(encryption))
        }
        None => (Vec::from(built.parts), None),
    };
    let mut sha = Sha256::new();
    for p in &parts {
        sha.update(p);
    }
    let m = SegmentManifest {
        cluster_id: format!("{cluster_id:x}"),
        first_revision: first.0,
        last_revision: last.0,
        revisions: built.revisions as u64,
        events: built.events as u64,
        leases: built.leases as u64,
        size: parts.iter().map(|p| p.len() as u64).sum(),
        sha256: hex(&sha.finalize()),
        plain_size: built.plain_size as u64,
        first_time: rfc3339_ms(first.1),
        first_time_unix_ms: first.1,
        last_time: rfc3339_ms(last.1),
        last_time_unix_ms: last.1,
        compression: "zstd".into(),
        encryption,
        name,
    };
    store.put_parts(&m.seg_object(), parts).await?;
    let json = serde_json::to_vec_pretty(&m).unwrap_or_default();
    store.put(&m.json_object(), json).await?;
    Ok(m)
}

/// Every readable segment manifest, in revision order. An unreadable one is logged and
/// left out (its revisions are then a hole the chain reports).
pub async fn list(store: &Store) -> Result<Vec<SegmentManifest>, StoreError> {
    list_where(store, |_| true).await
}

/// The readable segment manifests of segments reaching past `revision` (by their names:
/// one GET per segment that matters, not per segment stored), in revision order.
pub async fn list_after(store: &Store, revision: i64) -> Result<Vec<SegmentManifest>, StoreError> {
    list_where(store, |name| last_of(name).is_none_or(|l| l > revision)).await
}

/// The last revision a segment's name says it holds.
fn last_of(name: &str) -> Option<i64> {
    name.split_once('-')
        .and_then(|(_, l)| l.parse::<i64>().ok())
}

/// Segment manifests read at once when listing.
const MANIFESTS_IN_FLIGHT: usize = 16;

async fn list_where(
    store: &Store,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<SegmentManifest>, StoreError> {
    let entries = store.list(DIR).await?;
    let mut names: Vec<String> = entries
        .iter()
        .filter_map(|e| parse_object(&e.name))
        .filter(|(name, is_manifest)| *is_manifest && wanted(name))
        .map(|(name, _)| name.to_string())
        .collect();
    names.sort_unstable();
    // A manifest is a few hundred bytes: the time is the round trips, so several are in
    // flight at once (a day of 5 s segments is 17,280 of them).
    let answers: Vec<(String, Result<Vec<u8>, StoreError>)> = futures_util::stream::iter(names)
        .map(|name| async move {
            let answer = store.get(&super::json_object(&name)).await;
            (name, answer)
        })
        .buffered(MANIFESTS_IN_FLIGHT)
        .collect()
        .await;
    let mut out = Vec::with_capacity(answers.len());
    for (name, answer) in answers {
        let bytes = match answer {
            Ok(b) => b,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        match serde_json::from_slice::<SegmentManifest>(&bytes) {
            Ok(m) => out.push(m),
            Err(e) => {
                tracing::warn!(%name, error = %e, "unreadable archive segment manifest, ignored")
            }
        }
    }
    Ok(out)
}

/// Reads segment `m` back and proves it: the stored object's SHA-256 and size against the
/// manifest, then decryption (with the store's keys), decompression and decoding, and its
/// revisions against the manifest's.
pub async fn get(store: &Store, m: &SegmentManifest) -> Result<Segment, SegmentError> {
    let compressed = fetch(store, m).await?;
    open(m, &compressed)
}

/// Segment `m`'s object from the store, its size and SHA-256 checked against the manifest
/// and decrypted: the compressed encoding, for [`open`].
pub async fn fetch(store: &Store, m: &SegmentManifest) -> Result<Vec<u8>, SegmentError> {
    let stored = store.get(&m.seg_object()).await?;
    let sha256 = hex(&Sha256::digest(&stored));
    if sha256 != m.sha256 || stored.len() as u64 != m.size {
        return Err(SegmentError::Checksum {
            name: m.name.clone(),
            size: stored.len() as u64,
            sha256,
        });
    }
    match &m.encryption {
        Some(enc) => {
            crypt::decrypt_bytes(&m.name, &enc.key, store.keys(), &stored).map_err(|source| {
                SegmentError::Decrypt {
                    name: m.name.clone(),
                    source,
                }
            })
        }
        None => Ok(stored),
    }
}

/// Segment `m` decoded from what [`fetch`] returned, its revisions checked against the
/// manifest.
pub fn open(m: &SegmentManifest, compressed: &[u8]) -> Result<Segment, SegmentError> {
    let limit = usize::try_from(m.plain_size)
        .unwrap_or(PLAIN_LIMIT)
        .min(PLAIN_LIMIT);
    let decode = |source| SegmentError::Decode {
        name: m.name.clone(),
        source,
    };
    let segment = Segment::decompress(compressed, limit).map_err(decode)?;
    if segment.first_revision() != Some(m.first_revision)
        || segment.last_revision() != Some(m.last_revision)
    {
        return Err(decode(DecodeError::Zstd(format!(
            "holds revisions {:?}..{:?}, its manifest says {}..{}",
            segment.first_revision(),
            segment.last_revision(),
            m.first_revision,
            m.last_revision
        ))));
    }
    Ok(segment)
}

/// Deletes segments wholly before `revision` (the oldest kept snapshot's): retention
/// follows the snapshots. Decided by the objects' names (which say their revisions), so a
/// pass costs one LIST, not a GET per segment; a manifest before its object, so a pass
/// cut short leaves an object without a manifest, which the next pass deletes. Returns
/// the objects deleted.
pub async fn prune_before(store: &Store, revision: i64) -> Result<Vec<String>, StoreError> {
    let mut objects: Vec<(String, bool)> = store
        .list(DIR)
        .await?
        .iter()
        .filter_map(|e| parse_object(&e.name))
        .filter(|(name, _)| last_of(name).is_some_and(|l| l < revision))
        .map(|(name, is_manifest)| (name.to_string(), is_manifest))
        .collect();
    // By name, manifest first.
    objects.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut deleted = Vec::with_capacity(objects.len());
    for (name, is_manifest) in objects {
        let object = if is_manifest {
            super::json_object(&name)
        } else {
            super::seg_object(&name)
        };
        store.delete(&object).await?;
        deleted.push(object);
    }
    for object in &deleted {
        tracing::info!(object = %object, store = %store.url(), "archive segment deleted by retention (older than the oldest kept snapshot)");
    }
    Ok(deleted)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::segment::{Op, Revision};
    use super::*;
    use crate::backup::crypt::{Key, Keys};

    fn segment(first: i64, last: i64) -> Segment {
        Segment {
            revisions: (first..=last)
                .map(|r| Revision {
                    revision: r,
                    time_unix_ms: 1_795_000_000_000 + u64::try_from(r).unwrap(),
                    ops: vec![Op::Put {
                        key: format!("k{r}").into_bytes(),
                        value: vec![7; 100],
                        lease: 0,
                    }],
                })
                .collect(),
            leases: Default::default(),
        }
    }

    fn store(dir: &std::path::Path) -> Store {
        Store::open(&format!("file://{}", dir.display())).unwrap()
    }

    #[tokio::test]
    async fn a_stored_segment_lists_and_reads_back_verified() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let m = put(&s, 0xabc, segment(5, 9)).await.unwrap();
        assert_eq!((m.first_revision, m.last_revision, m.revisions), (5, 9, 5));
        assert_eq!(m.cluster_id, "abc");
        assert_eq!(list(&s).await.unwrap(), vec![m.clone()]);
        assert_eq!(get(&s, &m).await.unwrap(), segment(5, 9));
    }

    #[tokio::test]
    async fn a_changed_byte_fails_the_checksum_and_is_a_bad_segment() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let m = put(&s, 1, segment(1, 3)).await.unwrap();
        let path = dir.path().join(m.seg_object());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[10] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let e = get(&s, &m).await.unwrap_err();
        assert!(matches!(e, SegmentError::Checksum { .. }), "{e}");
        assert!(e.is_bad_segment());
    }

    #[tokio::test]
    async fn an_encrypted_segment_needs_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = Key::from_identity(age::x25519::Identity::generate());
        let keys = Keys {
            write: Some(key.clone()),
            read: vec![],
        };
        let s = store(dir.path()).with_keys(keys);
        let m = put(&s, 1, segment(1, 3)).await.unwrap();
        assert_eq!(
            m.encryption.as_ref().map(|e| e.key.as_str()),
            Some(key.fingerprint())
        );
        let raw = std::fs::read(dir.path().join(m.seg_object())).unwrap();
        // An age file, whose body is not the compressed segment.
        assert!(
            raw.starts_with(b"age-encryption.org/v1"),
            "stored in the clear"
        );
        let clear = segment(1, 3).compress();
        assert!(
            !raw.windows(16).any(|w| w == &clear[clear.len() - 16..]),
            "stored in the clear"
        );
        assert_eq!(get(&s, &m).await.unwrap(), segment(1, 3));
        let other = store(dir.path()).with_keys(Keys {
            write: Some(Key::from_identity(age::x25519::Identity::generate())),
            read: vec![],
        });
        assert!(matches!(
            get(&other, &m).await,
            Err(SegmentError::Decrypt { .. })
        ));
    }

    #[tokio::test]
    async fn retention_removes_only_segments_wholly_before_the_oldest_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        put(&s, 1, segment(1, 10)).await.unwrap();
        put(&s, 1, segment(11, 20)).await.unwrap();
        put(&s, 1, segment(21, 30)).await.unwrap();
        let deleted = prune_before(&s, 15).await.unwrap();
        assert_eq!(deleted.len(), 2, "{deleted:?}");
        let left: Vec<i64> = list(&s)
            .await
            .unwrap()
            .iter()
            .map(|m| m.first_revision)
            .collect();
        assert_eq!(left, vec![11, 21]);
    }

    #[tokio::test]
    async fn retention_by_name_also_removes_an_object_whose_manifest_never_came() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let orphan = put(&s, 1, segment(1, 10)).await.unwrap();
        s.delete(&orphan.json_object()).await.unwrap();
        put(&s, 1, segment(11, 20)).await.unwrap();
        let deleted = prune_before(&s, 11).await.unwrap();
        assert_eq!(deleted, vec![orphan.seg_object()]);
        let names: Vec<String> = s
            .list(DIR)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[tokio::test]
    async fn list_after_reads_only_the_segments_reaching_past_a_revision() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        for (a, b) in [(1, 10), (11, 20), (21, 30)] {
            put(&s, 1, segment(a, b)).await.unwrap();
        }
        let firsts =
            |ms: Vec<SegmentManifest>| ms.iter().map(|m| m.first_revision).collect::<Vec<_>>();
        assert_eq!(firsts(list_after(&s, 15).await.unwrap()), vec![11, 21]);
        assert_eq!(firsts(list_after(&s, 20).await.unwrap()), vec![21]);
        assert_eq!(firsts(list_after(&s, 0).await.unwrap()), vec![1, 11, 21]);
    }
}
