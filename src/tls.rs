//! TLS material: one side's PEM files, read at start (a bad file is a configuration error)
//! and read again as they rotate (cert-manager renews a certificate, the kubelet swaps the
//! Secret's files), and the rustls and tonic configurations built from them — the etcd
//! client side, and mutual TLS with the peer certificates for the peer reports and control
//! requests.
//!
//! Every use asks for the current material: the three files are stat-checked (device, inode,
//! size, modification and change times; a Secret's files are symlinks, followed) and read
//! again when one changed. Files that do not load together — a pair written half-way (a
//! new certificate beside the old key), a file that does not parse, a file missing for a
//! moment — are not used: the last good material stays in use, and the problem, naming the
//! file, is logged once per change of the files, not at every use.

mod expiry;
pub mod issue;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// The three files of one side (client or peer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cannot read {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path:?} holds no PEM {what}")]
    NoPem { path: PathBuf, what: &'static str },
    #[error("TLS set-up with {cert:?} and {key:?} failed: {detail}")]
    Config {
        cert: PathBuf,
        key: PathBuf,
        detail: String,
    },
}

/// One side's certificate, key and CA files and the material last loaded from them, re-read
/// as they change (see the module's documentation). Clones share the material. Its `Debug`
/// names the files, never the key.
#[derive(Clone)]
pub struct TlsMaterial {
    pub files: TlsFiles,
    state: Arc<Mutex<State>>,
    /// Changed sets that loaded but were not used: expired, or of another CA.
    refused: Arc<std::sync::atomic::AtomicU64>,
    /// As a server, admit only client certificates with this common name (the peers of
    /// one StatefulSet: `--peer-cert-allowed-cn`).
    admit: Option<Arc<str>>,
}

/// When the first certificate of a configured file (the leaf of a certificate file, the
/// first CA of a CA file) expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertExpiry {
    pub file: PathBuf,
    /// Its notAfter, Unix seconds.
    pub not_after: i64,
}

struct State {
    /// The files as last looked at, whether they loaded then or not.
    seen: [Option<Stamp>; 3],
    loaded: Arc<Loaded>,
    /// How many times `loaded` changed since start.
    version: u64,
}

/// One set of files that loaded together: parsed, checked, configurations built.
struct Loaded {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    ca_pem: Vec<u8>,
    /// Built at load (which also proves the key matches the certificate).
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    expiry: Vec<CertExpiry>,
    /// The certificate file's chain and the CA file's certificates, as loaded.
    certs: Vec<CertificateDer<'static>>,
    cas: Vec<CertificateDer<'static>>,
}

/// What says that a file changed: another file under the name (a new inode, as the kubelet's
/// swap of a Secret's files gives), or the same file rewritten (size or times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

fn stamps(files: &TlsFiles) -> [Option<Stamp>; 3] {
    [stamp(&files.cert), stamp(&files.key), stamp(&files.ca)]
}

/// What the rustls configurations are built from, checked in [`Loaded::read`].
struct Parts<'a> {
    files: &'a TlsFiles,
    admit: Option<&'a Arc<str>>,
    key_pem: &'a [u8],
    certs: Vec<CertificateDer<'static>>,
    cas: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl Parts<'_> {
    fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(self.key_pem).map_err(|_| TlsError::NoPem {
            path: self.files.key.clone(),
            what: "private key",
        })
    }

    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        for ca in &self.cas {
            roots.add(ca.clone()).map_err(|e| self.config_error(e))?;
        }
        Ok(roots)
    }

    fn config_error(&self, e: impl std::fmt::Display) -> TlsError {
        TlsError::Config {
            cert: self.files.cert.clone(),
            key: self.files.key.clone(),
            detail: e.to_string(),
        }
    }

    fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| self.config_error(e))?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.certs.clone(), self.key()?)
            .map_err(|e| self.config_error(e))?;
        Ok(Arc::new(config))
    }

    fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(self.roots()?), provider())
                .build()
                .map_err(|e| self.config_error(e))?;
        let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> = match self.admit {
            Some(cn) => Arc::new(AdmitOnly {
                inner: verifier,
                cn: cn.clone(),
            }),
            None => verifier,
        };
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| self.config_error(e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.certs.clone(), self.key()?)
            .map_err(|e| self.config_error(e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_certs(
    path: &Path,
    pem: &[u8],
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoPem {
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(certs)
}

/// The agent's one crypto provider, ring: every TLS config built here names it.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes the same provider the process default, for the clients that take the default
/// rather than a config built here (kube's, and object_store's reqwest). Idempotent: a
/// provider already installed stays.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn expiry(file: &Path, certs: &[CertificateDer<'_>]) -> Option<CertExpiry> {
    let not_after = expiry::not_after(certs.first()?.as_ref())?;
    Some(CertExpiry {
        file: file.to_path_buf(),
        not_after,
    })
}

/// Now, Unix seconds (the wall clock: certificates expire by it).
fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A client certificate verifier that, past the CA's check, admits only certificates whose
/// subject's common name is `cn`: the peer CA may sign more than this StatefulSet's peers
/// (cert-manager's one issuer for both sides), and a client certificate is no peer.
#[derive(Debug)]
struct AdmitOnly {
    inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    cn: Arc<str>,
}

impl rustls::server::danger::ClientCertVerifier for AdmitOnly {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if issue::common_names(end_entity.as_ref())
            .iter()
            .any(|cn| **cn == *self.cn)
        {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

impl Loaded {
    /// Reads and checks the three files; every problem names its file.
    fn read(files: &TlsFiles, admit: Option<&Arc<str>>) -> Result<Self, TlsError> {
        let cert_pem = read(&files.cert)?;
        let key_pem = read(&files.key)?;
        let ca_pem = read(&files.ca)?;
        let parts = Parts {
            files,
            admit,
            key_pem: &key_pem,
            certs: parse_certs(&files.cert, &cert_pem, "certificate")?,
            cas: parse_certs(&files.ca, &ca_pem, "CA certificate")?,
        };
        let client = parts.client_config()?;
        let server = parts.server_config()?;
        let expiry = [(&files.cert, &parts.certs), (&files.ca, &parts.cas)]
            .into_iter()
            .filter_map(|(file, certs)| expiry(file, certs))
            .collect();
        let (certs, cas) = (parts.certs, parts.cas);
        Ok(Loaded {
            cert_pem,
            key_pem,
            ca_pem,
            client,
            server,
            expiry,
            certs,
            cas,
        })
    }

    /// Why a set that loads must still not replace the one in use, if so: its certificate
    /// has expired (at `now`, Unix seconds), or was not issued by any CA of its CA file
    /// (a certificate of another CA: the peers would refuse it).
    fn unusable(&self, now: u64) -> Option<String> {
        let cert = self.certs.first()?;
        if let Some(t) = expiry::not_after(cert.as_ref()) {
            if t < i64::try_from(now).unwrap_or(i64::MAX) {
                return Some(format!("its certificate expired at {t} (Unix seconds)"));
            }
        }
        // Issued by a CA of the CA file, or by an intermediate the certificate file carries
        // after it (whose own chain the handshake checks).
        let issuer = expiry::issuer(cert.as_ref())?;
        let known = self
            .cas
            .iter()
            .chain(self.certs.iter().skip(1))
            .any(|ca| expiry::subject(ca.as_ref()) == Some(issuer));
        (!known).then(|| {
            "its certificate was not issued by a CA in its CA file (nor by an intermediate in its certificate file)".to_string()
        })
    }

    fn same_files_as(&self, other: &Loaded) -> bool {
        (&self.cert_pem, &self.key_pem, &self.ca_pem)
            == (&other.cert_pem, &other.key_pem, &other.ca_pem)
    }
}

impl TlsMaterial {
    /// Reads and checks the three files; every problem names its file. At start a bad file
    /// is an error (the caller's configuration error); later changes that do not load are
    /// logged and leave this material in use.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        // Looked at before reading: a change in between is seen (and read) at the next use.
        TlsMaterial::load_admitting(files, None)
    }

    /// As [`TlsMaterial::load`], serving only clients whose certificate's common name is
    /// `admit` (`None`: any the CA signed).
    pub fn load_admitting(files: &TlsFiles, admit: Option<&str>) -> Result<Self, TlsError> {
        let admit: Option<Arc<str>> = admit.map(Arc::from);
        let seen = stamps(files);
        let loaded = Loaded::read(files, admit.as_ref())?;
        Ok(TlsMaterial {
            files: files.clone(),
            state: Arc::new(Mutex::new(State {
                seen,
                loaded: Arc::new(loaded),
                version: 0,
            })),
            refused: Arc::default(),
            admit,
        })
    }

    /// The material to use now, and its version: the files are read again if they changed
    /// since they were last looked at; what does not load is not used.
    fn current(&self) -> (Arc<Loaded>, u64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = stamps(&self.files);
        if now != state.seen {
            state.seen = now;
            let files = &self.files;
            match Loaded::read(files, self.admit.as_ref()) {
                Ok(new) if new.same_files_as(&state.loaded) => {}
                Ok(new) => match new.unusable(now_unix()) {
                    Some(why) => {
                        self.refused
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(cert = %files.cert.display(), ca = %files.ca.display(), why = %why, "TLS files changed to a set that cannot be used: not used; the last good certificate, key and CA stay in use (etcd_steward_certificate_reloads_refused_total)");
                    }
                    None => {
                        state.loaded = Arc::new(new);
                        state.version += 1;
                        tracing::info!(cert = %files.cert.display(), key = %files.key.display(), ca = %files.ca.display(), "TLS files changed: new connections and handshakes use them");
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "TLS files changed but do not load together: not used; the last good certificate, key and CA stay in use until they do")
                }
            }
        }
        (state.loaded.clone(), state.version)
    }

    /// How many changed sets of files loaded but were not used (expired, or of another CA).
    pub fn refused_reloads(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times the material in use changed since start (the files are looked at
    /// first): a holder of connections opened with older material reopens them.
    pub fn version(&self) -> u64 {
        self.current().1
    }

    /// A client that trusts only this CA and presents this certificate.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.current().0.client.clone()
    }

    /// A server that presents this certificate and admits only clients with a certificate
    /// signed by this CA.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.current().0.server.clone()
    }

    /// The etcd client's TLS options for the member named `host`.
    pub fn etcd_client_tls(&self, host: &str) -> etcd_client::TlsOptions {
        let m = self.current().0;
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&m.ca_pem))
            .identity(etcd_client::Identity::from_pem(&m.cert_pem, &m.key_pem))
            .domain_name(host)
    }

    /// When the certificate file and the CA file of the material in use expire (a file
    /// whose notAfter cannot be read is left out).
    pub fn expiry(&self) -> Vec<CertExpiry> {
        self.current().0.expiry.clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

    /// A CA and a leaf it signed, both valid until the first of January of `year`, as PEM.
    struct Issued {
        ca: String,
        cert: String,
        key: String,
    }

    fn issue(year: i32) -> Issued {
        issue_named(year, "etcd-steward test CA")
    }

    /// Midnight UTC of the first of January of `year`, Unix seconds.
    fn new_year(year: i64) -> i64 {
        expiry::days_from_civil(year, 1, 1) * 86_400
    }

    struct Dir {
        dir: tempfile::TempDir,
        files: TlsFiles,
    }

    impl Dir {
        fn new() -> Dir {
            let dir = tempfile::tempdir().unwrap();
            let files = TlsFiles {
                cert: dir.path().join("tls.crt"),
                key: dir.path().join("tls.key"),
                ca: dir.path().join("ca.crt"),
            };
            Dir { dir, files }
        }

        /// Replaces one file as the kubelet does: a new file renamed over the old.
        fn replace(&self, path: &Path, pem: &str) {
            let tmp = self.dir.path().join("..tmp");
            std::fs::write(&tmp, pem).unwrap();
            std::fs::rename(&tmp, path).unwrap();
        }

        fn install(&self, i: &Issued) {
            self.replace(&self.files.cert, &i.cert);
            self.replace(&self.files.key, &i.key);
            self.replace(&self.files.ca, &i.ca);
        }
    }

    fn expiry_of(m: &TlsMaterial) -> Vec<(String, i64)> {
        m.expiry()
            .into_iter()
            .map(|e| {
                (
                    e.file.file_name().unwrap().to_string_lossy().into(),
                    e.not_after,
                )
            })
            .collect()
    }

    fn both_until(year: i64) -> Vec<(String, i64)> {
        vec![
            ("tls.crt".into(), new_year(year)),
            ("ca.crt".into(), new_year(year)),
        ]
    }

    #[test]
    fn certificates_from_a_new_ca_are_used_from_the_next_use_on() {
        let d = Dir::new();
        d.install(&issue(2031));
        let m = TlsMaterial::load(&d.files).unwrap();
        let (client, server) = (m.client_config(), m.server_config());
        assert_eq!((m.version(), expiry_of(&m)), (0, both_until(2031)));

        d.install(&issue(2032));
        assert_eq!((m.version(), expiry_of(&m)), (1, both_until(2032)));
        assert!(
            !Arc::ptr_eq(&client, &m.client_config()),
            "a new client config"
        );
        assert!(
            !Arc::ptr_eq(&server, &m.server_config()),
            "a new server config"
        );
        let shared = m.clone();
        assert_eq!(shared.version(), 1, "clones share the material");
    }

    #[test]
    fn files_unchanged_or_rewritten_alike_keep_the_material_and_its_version() {
        let d = Dir::new();
        let issued = issue(2031);
        d.install(&issued);
        let m = TlsMaterial::load(&d.files).unwrap();
        let client = m.client_config();
        assert_eq!(m.version(), 0);
        // The kubelet rewrites a Secret's files with the same content (new inodes).
        d.install(&issued);
        assert_eq!(m.version(), 0);
        assert!(Arc::ptr_eq(&client, &m.client_config()));
    }

    #[test]
    fn a_new_certificate_beside_the_old_key_is_not_used_until_its_key_arrives() {
        let d = Dir::new();
        d.install(&issue(2031));
        let m = TlsMaterial::load(&d.files).unwrap();
        let next = issue(2032);
        d.replace(&d.files.ca, &next.ca);
        d.replace(&d.files.cert, &next.cert);
        for _ in 0..3 {
            assert_eq!((m.version(), expiry_of(&m)), (0, both_until(2031)));
        }
        d.replace(&d.files.key, &next.key);
        assert_eq!((m.version(), expiry_of(&m)), (1, both_until(2032)));
    }

    #[test]
    fn a_file_that_does_not_parse_or_is_gone_keeps_the_last_good_material() {
        let d = Dir::new();
        d.install(&issue(2031));
        let m = TlsMaterial::load(&d.files).unwrap();
        let next = issue(2032);
        d.replace(&d.files.ca, "-----BEGIN CERTIFICATE-----\ntruncat");
        assert_eq!((m.version(), expiry_of(&m)), (0, both_until(2031)));
        std::fs::remove_file(&d.files.key).unwrap();
        assert_eq!((m.version(), expiry_of(&m)), (0, both_until(2031)));
        d.install(&next);
        assert_eq!((m.version(), expiry_of(&m)), (1, both_until(2032)));
    }

    /// A CA named `ca_name` and a leaf it signed, valid until `year`.
    fn issue_named(year: i32, ca_name: &str) -> Issued {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.not_after = rcgen::date_time_ymd(year, 1, 1);
        ca.distinguished_name = rcgen::DistinguishedName::new();
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, ca_name);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let mut leaf = CertificateParams::new(vec!["etcd-0".to_string()]).unwrap();
        leaf.not_after = rcgen::date_time_ymd(year, 1, 1);
        let key = KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &ca).unwrap();
        Issued {
            ca: ca.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    #[test]
    fn an_expired_set_or_a_certificate_of_another_ca_is_not_used_and_is_counted() {
        let d = Dir::new();
        d.install(&issue_named(2031, "ca-a"));
        let m = TlsMaterial::load(&d.files).unwrap();
        // Expired (its notAfter in 2020): loads, but is not used.
        d.install(&issue_named(2020, "ca-a"));
        assert_eq!((m.version(), expiry_of(&m)), (0, both_until(2031)));
        assert_eq!(m.refused_reloads(), 1);
        // A certificate and key of CA B beside CA A's file.
        let a = issue_named(2032, "ca-a");
        let b = issue_named(2032, "ca-b");
        d.replace(&d.files.ca, &a.ca);
        d.replace(&d.files.cert, &b.cert);
        d.replace(&d.files.key, &b.key);
        assert_eq!((m.version(), expiry_of(&m)), (0, both_until(2031)));
        assert_eq!(m.refused_reloads(), 2);
        // The whole of B: a CA rotation, used.
        d.replace(&d.files.ca, &b.ca);
        assert_eq!((m.version(), expiry_of(&m)), (1, both_until(2032)));
        assert_eq!(m.refused_reloads(), 2);
    }

    #[test]
    fn at_start_a_pair_that_does_not_match_is_an_error_naming_both_files() {
        let d = Dir::new();
        let (one, other) = (issue(2031), issue(2031));
        d.install(&one);
        d.replace(&d.files.key, &other.key);
        let e = TlsMaterial::load(&d.files).expect_err("a mismatched pair");
        let text = e.to_string();
        assert!(
            text.contains("tls.crt") && text.contains("tls.key"),
            "{text}"
        );
        d.replace(&d.files.ca, "not PEM");
        d.replace(&d.files.key, &one.key);
        let text = TlsMaterial::load(&d.files).expect_err("no CA").to_string();
        assert!(text.contains("ca.crt") && text.contains("no PEM"), "{text}");
    }
}
