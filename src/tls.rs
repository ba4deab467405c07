//! TLS material: PEM files loaded once (a bad file is a configuration error), and the
//! rustls and tonic configurations built from them — the etcd client side, and mutual TLS
//! with the peer certificates for the peer reports that decide a bootstrap.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// One side's certificate, key and CA, parsed. Its `Debug` names the files, never the key.
#[derive(Clone)]
pub struct TlsMaterial {
    pub files: TlsFiles,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub ca_pem: Vec<u8>,
    /// Built once at load (which also proves the key matches the certificate).
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

/// What the rustls configurations are built from, checked once in [`TlsMaterial::load`].
struct Parts<'a> {
    files: &'a TlsFiles,
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

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsMaterial {
    /// Reads and checks the three files; every problem names its file.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let cert_pem = read(&files.cert)?;
        let key_pem = read(&files.key)?;
        let ca_pem = read(&files.ca)?;
        let parts = Parts {
            files,
            key_pem: &key_pem,
            certs: parse_certs(&files.cert, &cert_pem, "certificate")?,
            cas: parse_certs(&files.ca, &ca_pem, "CA certificate")?,
        };
        let client = parts.client_config()?;
        let server = parts.server_config()?;
        Ok(TlsMaterial {
            files: files.clone(),
            cert_pem,
            key_pem,
            ca_pem,
            client,
            server,
        })
    }

    /// A client that trusts only this CA and presents this certificate.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }

    /// A server that presents this certificate and admits only clients with a certificate
    /// signed by this CA.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// The etcd client's TLS options for the member named `host`.
    pub fn etcd_client_tls(&self, host: &str) -> etcd_client::TlsOptions {
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&self.ca_pem))
            .identity(etcd_client::Identity::from_pem(
                &self.cert_pem,
                &self.key_pem,
            ))
            .domain_name(host)
    }
}
