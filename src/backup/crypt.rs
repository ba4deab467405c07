//! Backups encrypted before they leave the pod, with the `age` format (X25519 recipients,
//! authenticated, streamed in 64 KiB chunks): no home-made cryptography. A key file holds
//! one age identity (`AGE-SECRET-KEY-1…`, as `age-keygen` or `etcd-steward backup
//! --generate-key` writes it). One key writes (and reads); older keys only read, for
//! rotation. A manifest names the key by a fingerprint of its public half, never the key.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use age::secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CryptError {
    #[error("backup encryption key file {path:?}: {detail}")]
    KeyFile { path: PathBuf, detail: String },
    #[error("snapshot {name} is encrypted to key {fingerprint}, and none of the configured keys ({}) is it: give that key with --backup-decryption-key-file", .have.join(", "))]
    NoKey {
        name: String,
        fingerprint: String,
        /// The fingerprints of the keys tried.
        have: Vec<String>,
    },
    #[error("snapshot {name} (key {fingerprint}) cannot be decrypted: {detail}")]
    Corrupt {
        name: String,
        fingerprint: String,
        detail: String,
    },
    #[error("snapshot {name} is encrypted (key {fingerprint}) but no --backup-encryption-key-file is configured")]
    Missing { name: String, fingerprint: String },
    /// The local files the decryption reads and writes (not the snapshot's fault).
    #[error("decrypting snapshot {name} on this volume: {detail}")]
    Local { name: String, detail: String },
}

/// One age identity: its secret, and the fingerprint of its public half.
#[derive(Clone)]
pub struct Key {
    identity: age::x25519::Identity,
    fingerprint: String,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
    }
}

impl Eq for Key {}

/// `sha256:` and the first 16 hex digits of the SHA-256 of the public key (`age1…`).
pub fn fingerprint(recipient: &age::x25519::Recipient) -> String {
    let digest = Sha256::digest(recipient.to_string().as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl Key {
    /// Reads the first identity in an age key file (lines starting with `#` are comments).
    pub fn load(path: &Path) -> Result<Key, CryptError> {
        let bad = |detail: String| CryptError::KeyFile {
            path: path.to_path_buf(),
            detail,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("AGE-SECRET-KEY-1"))
            .ok_or_else(|| bad("holds no age identity (a line AGE-SECRET-KEY-1…)".into()))?;
        let identity: age::x25519::Identity = line
            .parse()
            .map_err(|e: &str| bad(format!("not a valid age identity: {e}")))?;
        Ok(Key::from_identity(identity))
    }

    pub(crate) fn from_identity(identity: age::x25519::Identity) -> Key {
        let fingerprint = fingerprint(&identity.to_public());
        Key {
            identity,
            fingerprint,
        }
    }

    /// A new random key, as the text of a key file.
    pub fn generate_file() -> String {
        let identity = age::x25519::Identity::generate();
        let public = identity.to_public();
        format!(
            "# etcd-steward backup encryption key (age X25519)\n# public key: {public}\n# fingerprint: {}\n{}\n",
            fingerprint(&public),
            identity.to_string().expose_secret()
        )
    }

    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

/// The keys a store is read and written with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Keys {
    /// New snapshots are encrypted to this key (it also reads).
    pub write: Option<Key>,
    /// Older keys, read only (rotation).
    pub read: Vec<Key>,
}

impl Keys {
    fn all(&self) -> impl Iterator<Item = &Key> {
        self.write.iter().chain(self.read.iter())
    }

    pub fn is_empty(&self) -> bool {
        self.write.is_none() && self.read.is_empty()
    }

    /// The fingerprints of every key that reads, sorted: what a decision compares.
    pub fn fingerprints(&self) -> Vec<String> {
        let mut all: Vec<String> = self.all().map(|k| k.fingerprint.clone()).collect();
        all.sort();
        all.dedup();
        all
    }
}

/// A `Write` whose bytes the caller takes out as they come (the encrypted stream's output,
/// uploaded part by part), so memory stays bounded whatever the snapshot's size.
#[derive(Clone, Default)]
struct Drain(Arc<Mutex<Vec<u8>>>);

impl Drain {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Write for Drain {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Encrypts a stream chunk by chunk: plaintext in, ciphertext out.
pub struct Encrypting {
    writer: age::stream::StreamWriter<Drain>,
    out: Drain,
}

impl Encrypting {
    pub fn new(key: &Key) -> std::io::Result<Encrypting> {
        let recipient = key.identity.to_public();
        let encryptor =
            age::Encryptor::with_recipients(std::iter::once(&recipient as &dyn age::Recipient))
                .map_err(std::io::Error::other)?;
        let out = Drain::default();
        let writer = encryptor.wrap_output(out.clone())?;
        Ok(Encrypting { writer, out })
    }

    /// Encrypts `plain`; returns the ciphertext ready so far (often empty: age seals 64 KiB
    /// chunks).
    pub fn update(&mut self, plain: &[u8]) -> std::io::Result<Vec<u8>> {
        self.writer.write_all(plain)?;
        Ok(self.out.take())
    }

    /// The rest of the ciphertext, sealed with the final chunk's tag.
    pub fn finish(self) -> std::io::Result<Vec<u8>> {
        let out = self.out.clone();
        self.writer.finish()?;
        Ok(out.take())
    }
}

/// Decrypts the age file `cipher` into `plain` with whichever of `keys` it was encrypted
/// to. Blocking: call it from a blocking thread.
pub fn decrypt_file(
    name: &str,
    fingerprint: &str,
    keys: &Keys,
    cipher: &Path,
    plain: &Path,
) -> Result<(), CryptError> {
    let local = |e: std::io::Error| CryptError::Local {
        name: name.into(),
        detail: e.to_string(),
    };
    if keys.is_empty() {
        return Err(missing(name, fingerprint));
    }
    let input = std::io::BufReader::new(std::fs::File::open(cipher).map_err(local)?);
    let mut out = std::fs::File::create(plain).map_err(local)?;
    decrypt(name, fingerprint, keys, input, &mut out)?;
    out.sync_all().map_err(local)
}

/// Encrypts a small object (an archive segment) in memory to `key`.
pub fn encrypt_bytes(key: &Key, plain: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut e = Encrypting::new(key)?;
    let mut out = e.update(plain)?;
    out.extend(e.finish()?);
    Ok(out)
}

/// Decrypts a small object (an archive segment) in memory, as [`decrypt_file`] does a file.
pub fn decrypt_bytes(
    name: &str,
    fingerprint: &str,
    keys: &Keys,
    cipher: &[u8],
) -> Result<Vec<u8>, CryptError> {
    let mut out = Vec::with_capacity(cipher.len());
    decrypt(name, fingerprint, keys, cipher, &mut out)?;
    Ok(out)
}

fn missing(name: &str, fingerprint: &str) -> CryptError {
    CryptError::Missing {
        name: name.into(),
        fingerprint: fingerprint.into(),
    }
}

/// The decryption itself: `input` (age) → `out` (plaintext), authenticated chunk by chunk.
fn decrypt(
    name: &str,
    fingerprint: &str,
    keys: &Keys,
    input: impl std::io::BufRead + Send,
    out: &mut impl Write,
) -> Result<(), CryptError> {
    let mut reader = decrypting(name, fingerprint, keys, input)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| read_error(name, fingerprint, e))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(|e| CryptError::Local {
            name: name.into(),
            detail: e.to_string(),
        })?;
    }
    Ok(())
}

/// A reader of the plaintext behind the age stream `input`, opened with whichever of
/// `keys` it was encrypted to. Its read errors mean what [`read_error`] says.
pub fn decrypting<'a>(
    name: &str,
    fingerprint: &str,
    keys: &Keys,
    input: impl std::io::BufRead + Send + 'a,
) -> Result<Box<dyn Read + Send + 'a>, CryptError> {
    if keys.is_empty() {
        return Err(missing(name, fingerprint));
    }
    let corrupt = |detail: String| CryptError::Corrupt {
        name: name.into(),
        fingerprint: fingerprint.into(),
        detail,
    };
    let decryptor = age::Decryptor::new_buffered(input).map_err(|e| match e {
        age::DecryptError::Io(e) if e.kind() != std::io::ErrorKind::InvalidData => {
            CryptError::Local {
                name: name.into(),
                detail: e.to_string(),
            }
        }
        e => corrupt(e.to_string()),
    })?;
    let identities: Vec<&dyn age::Identity> = keys
        .all()
        .map(|k| &k.identity as &dyn age::Identity)
        .collect();
    match decryptor.decrypt(identities.into_iter()) {
        Ok(r) => Ok(Box::new(r)),
        Err(age::DecryptError::NoMatchingKeys) => Err(CryptError::NoKey {
            name: name.into(),
            fingerprint: fingerprint.into(),
            have: keys.fingerprints(),
        }),
        Err(e) => Err(corrupt(e.to_string())),
    }
}

/// What an error reading a [`decrypting`] reader means: a tampered chunk fails its
/// authentication tag (InvalidData) or the stream ends early; any other error is reading
/// the input.
pub fn read_error(name: &str, fingerprint: &str, e: std::io::Error) -> CryptError {
    match e.kind() {
        std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => {
            CryptError::Corrupt {
                name: name.into(),
                fingerprint: fingerprint.into(),
                detail: e.to_string(),
            }
        }
        _ => CryptError::Local {
            name: name.into(),
            detail: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::from_identity(age::x25519::Identity::generate())
    }

    fn encrypt(key: &Key, plain: &[u8]) -> Vec<u8> {
        let mut e = Encrypting::new(key).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        for chunk in plain.chunks(10_000) {
            out.extend(e.update(chunk).unwrap_or_else(|e| panic!("{e}")));
        }
        out.extend(e.finish().unwrap_or_else(|e| panic!("{e}")));
        out
    }

    fn decrypt(keys: &Keys, cipher: &[u8]) -> Result<Vec<u8>, CryptError> {
        let dir = tempfile::tempdir().map_err(|e| CryptError::KeyFile {
            path: "/tmp".into(),
            detail: e.to_string(),
        })?;
        let (c, p) = (dir.path().join("c"), dir.path().join("p"));
        std::fs::write(&c, cipher).ok();
        decrypt_file("s1", "sha256:x", keys, &c, &p)?;
        Ok(std::fs::read(&p).unwrap_or_default())
    }

    fn plain() -> Vec<u8> {
        (0..300_000u32).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn a_small_object_encrypted_in_memory_decrypts_only_with_its_key() {
        let k = key();
        let cipher = encrypt_bytes(&k, b"segment bytes").unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(cipher.as_slice(), b"segment bytes");
        let right = Keys {
            write: Some(k),
            read: vec![],
        };
        let back =
            decrypt_bytes("seg", "sha256:x", &right, &cipher).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, b"segment bytes");
        let wrong = Keys {
            write: Some(key()),
            read: vec![],
        };
        assert!(matches!(
            decrypt_bytes("seg", "sha256:x", &wrong, &cipher),
            Err(CryptError::NoKey { .. })
        ));
    }

    #[test]
    fn an_old_key_reads_after_a_rotation() {
        let (old, new) = (key(), key());
        let cipher = encrypt(&old, &plain());
        let keys = Keys {
            write: Some(new),
            read: vec![old],
        };
        assert_eq!(decrypt(&keys, &cipher).ok(), Some(plain()));
    }

    #[test]
    fn a_wrong_key_a_missing_key_and_a_flipped_byte_are_refused() {
        let k = key();
        let cipher = encrypt(&k, &plain());
        let wrong = Keys {
            write: Some(key()),
            read: vec![],
        };
        assert!(matches!(
            decrypt(&wrong, &cipher),
            Err(CryptError::NoKey { .. })
        ));
        assert!(matches!(
            decrypt(&Keys::default(), &cipher),
            Err(CryptError::Missing { .. })
        ));
        let mut tampered = cipher.clone();
        let mid = tampered.len() / 2;
        tampered[mid] ^= 1;
        let right = Keys {
            write: Some(k),
            read: vec![],
        };
        assert!(matches!(
            decrypt(&right, &tampered),
            Err(CryptError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_generated_key_file_loads_and_its_fingerprint_is_stable() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("key.txt");
        std::fs::write(&path, Key::generate_file()).ok();
        let a = Key::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let b = Key::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert!(a.fingerprint().starts_with("sha256:"));
        std::fs::write(&path, "not a key\n").ok();
        assert!(matches!(Key::load(&path), Err(CryptError::KeyFile { .. })));
    }
}
