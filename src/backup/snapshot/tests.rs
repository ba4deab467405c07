//! Unit tests of taking and checking a snapshot.
#![cfg(test)]
use super::*;
use crate::backup::catalog;

fn check_all(bytes: &[u8], chunk: usize) -> Checked {
    let mut c = StreamCheck::default();
    for part in bytes.chunks(chunk) {
        c.update(part);
    }
    c.finish()
}

#[test]
fn trailer_matches_whatever_the_chunking() {
    let src = FakeSource::new(&[5u8; 1000], 1);
    for chunk in [1, 7, 31, 32, 33, 1000, 5000] {
        let c = check_all(&src.stream, chunk);
        assert_eq!(c.trailer, Ok(()), "chunk {chunk}");
        assert_eq!(c.size, 1032);
        assert_eq!(c.sha256, hex(&Sha256::digest(&src.stream)));
    }
}

#[test]
fn a_flipped_byte_fails_the_trailer() {
    let mut src = FakeSource::new(&[5u8; 1000], 1);
    src.stream[10] ^= 1;
    assert!(check_all(&src.stream, 64).trailer.is_err());
}

#[test]
fn each_partial_check_keeps_only_its_own_hash() {
    let mut src = FakeSource::new(&[9u8; 500], 1);
    let feed = |mut c: StreamCheck, bytes: &[u8]| {
        for part in bytes.chunks(13) {
            c.update(part);
        }
        c.finish()
    };
    let whole = feed(StreamCheck::whole_only(), &src.stream);
    assert_eq!(whole.sha256, hex(&Sha256::digest(&src.stream)));
    assert_eq!(whole.trailer, Ok(()));
    let trailer = feed(StreamCheck::trailer_only(), &src.stream);
    assert_eq!((trailer.sha256.as_str(), trailer.trailer), ("", Ok(())));
    src.stream[3] ^= 1;
    assert!(feed(StreamCheck::trailer_only(), &src.stream)
        .trailer
        .is_err());
}

#[test]
fn a_stream_shorter_than_the_trailer_is_not_verified() {
    assert!(check_all(&[1, 2, 3], 2).trailer.is_err());
}

fn file_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}/s", dir.path().display())).unwrap();
    (dir, store)
}

#[tokio::test]
async fn take_uploads_the_snapshot_then_its_manifest() {
    let (_dir, store) = file_store();
    let store = store.with_compression(Compression::None);
    let src = FakeSource::new(b"database bytes", 42);
    let m = take(&src, &store, SystemTime::UNIX_EPOCH).await.unwrap();
    assert_eq!(m.compression, None);
    assert!(m.verified);
    assert_eq!(m.revision, 42);
    assert_eq!(m.cluster_id, "c1");
    assert_eq!(m.name, "19700101T000000.000Z-r42");
    assert_eq!(store.get(&m.db_object()).await.unwrap(), src.stream);
    assert_eq!(catalog::list(&store).await.unwrap(), vec![m]);
}

#[tokio::test]
async fn take_compresses_by_default_and_the_manifest_describes_the_stored_object() {
    use std::io::Read;
    let (_dir, store) = file_store();
    let db: Vec<u8> = (0..200_000u32)
        .flat_map(|i| (i % 97).to_le_bytes())
        .collect();
    let mut src = FakeSource::new(&db, 7);
    src.chunk = 32 * 1024;
    let m = take(&src, &store, SystemTime::UNIX_EPOCH).await.unwrap();
    assert_eq!(m.compression.as_deref(), Some("zstd"));
    assert!(m.verified);
    let stored = store.get(&m.db_object()).await.unwrap();
    assert!(stored.len() < src.stream.len() / 10, "{}", stored.len());
    assert_eq!(m.size, stored.len() as u64);
    assert_eq!(m.sha256, hex(&Sha256::digest(&stored)));
    let mut back = Vec::new();
    crate::backup::compress::decompressing(std::io::Cursor::new(stored))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert!(
        back == src.stream,
        "the stored object decompresses to etcd's stream"
    );
}

#[tokio::test]
async fn a_snapshot_with_a_wrong_trailer_is_stored_but_marked_unverified() {
    let (_dir, store) = file_store();
    let mut src = FakeSource::new(b"database bytes", 3);
    let last = src.stream.len() - 1;
    src.stream[last] ^= 0xff;
    let m = take(&src, &store, SystemTime::UNIX_EPOCH).await.unwrap();
    assert!(!m.verified);
    assert!(m.unverified_reason.unwrap().contains("trailer"));
}

#[tokio::test]
async fn a_broken_stream_leaves_no_manifest() {
    let (_dir, store) = file_store();
    let mut src = FakeSource::new(&[9u8; 100], 3);
    src.fail_after = Some(50);
    assert!(matches!(
        take(&src, &store, SystemTime::UNIX_EPOCH).await,
        Err(TakeError::Source(_))
    ));
    assert!(catalog::list(&store).await.unwrap().is_empty());
}
