//! Certificates a pod issues itself (`--tls-issuer-dir`): the chart gives every pod two CAs,
//! one for peers and one for clients, and each pod signs its own short-lived certificates
//! with them, into a directory of its own (an emptyDir, `--tls-issued-dir`):
//!
//! - `peer.crt`: this pod's name (its peer URL's host) and address only, with the common
//!   name every peer of the StatefulSet carries (`--peer-cert-allowed-cn`): a peer
//!   certificate names one pod, and only the peer CA issues one;
//! - `client.crt`: what etcd serves its clients with and what the agent calls etcd with:
//!   this pod's name, the headless service's wildcard, the client Service's names
//!   (`--tls-san`), `localhost` and the loopback addresses;
//! - `peer-ca.crt`, `client-ca.crt`: the CAs' certificates (never their keys).
//!
//! [`Issuing::due`] says why the files must be made again — missing, issued for another
//! name or address, of a CA that changed, or with less than a third of their validity
//! left — and [`Issuing::ensure`] makes them, under a lock on the directory (init and the
//! sidecar start together, and commands run beside them), each file written aside, synced
//! and renamed into place, the record of what was issued last. etcd reads its certificate
//! and key at every handshake, and the agent's [`super::TlsMaterial`] when they change, so
//! a renewal restarts nothing. A CA changed in its Secret is used at the next renewal; etcd
//! trusts a new CA only once restarted (see `docs/operations/tls.md`).

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::TlsFiles;

/// The CA files of `--tls-issuer-dir` (the chart's `<name>-ca` Secret's keys).
pub const PEER_CA_CERT: &str = "peer-ca.crt";
pub const PEER_CA_KEY: &str = "peer-ca.key";
pub const CLIENT_CA_CERT: &str = "client-ca.crt";
pub const CLIENT_CA_KEY: &str = "client-ca.key";

/// What was issued last, beside the certificates.
const RECORD: &str = "issued.json";
const LOCK: &str = ".lock";

/// The shortest `--tls-issued-validity`: a renewal is due with a third of it left, and the
/// sidecar looks every tick.
pub const MIN_VALIDITY: Duration = Duration::from_secs(60);

/// Whom the certificates name. Plain data: what the record holds, and what a change of
/// makes the certificates due again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    /// This pod's stable name, its peer URL's host.
    pub host: String,
    /// The headless service's domain (`<service>.<namespace>.svc.<cluster domain>`): the
    /// client certificate carries its wildcard.
    pub service_domain: String,
    /// The common name of every peer certificate of the StatefulSet.
    pub peer_cn: String,
    /// The client certificate's common name (the agent's name to etcd).
    pub client_cn: String,
    /// This pod's address, when it listens on one (both certificates carry it).
    pub ip: Option<IpAddr>,
    /// More names and addresses both certificates carry (`--tls-san`).
    pub extra: Vec<String>,
    /// How long each certificate is valid, seconds.
    pub validity: u64,
}

/// One pod's issuance: from which CAs, into which directory, for whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issuing {
    pub issuer_dir: PathBuf,
    pub out_dir: PathBuf,
    pub subject: Subject,
}

#[derive(Debug, Error)]
pub enum IssueError {
    #[error("cannot read {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path:?}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path:?} is not a CA certificate and key this agent can sign with: {detail}")]
    Ca { path: PathBuf, detail: String },
    #[error("issuing the {what} certificate failed: {detail}")]
    Sign { what: &'static str, detail: String },
}

/// One of the two certificates.
#[derive(Debug, Clone, Copy)]
enum Side {
    Peer,
    Client,
}

impl Side {
    const BOTH: [Side; 2] = [Side::Peer, Side::Client];

    fn name(self) -> &'static str {
        match self {
            Side::Peer => "peer",
            Side::Client => "client",
        }
    }

    fn ca_files(self) -> (&'static str, &'static str) {
        match self {
            Side::Peer => (PEER_CA_CERT, PEER_CA_KEY),
            Side::Client => (CLIENT_CA_CERT, CLIENT_CA_KEY),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, IssueError> {
    std::fs::read(path).map_err(|source| IssueError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl Subject {
    /// The names and addresses of `side`'s certificate.
    fn sans(&self, side: Side) -> Vec<String> {
        let mut sans = vec![self.host.clone()];
        if let Side::Client = side {
            sans.push(format!("*.{}", self.service_domain));
            sans.extend(["localhost", "127.0.0.1", "::1"].map(String::from));
        }
        sans.extend(self.ip.map(|ip| ip.to_string()));
        sans.extend(self.extra.iter().cloned());
        let mut seen = std::collections::BTreeSet::new();
        sans.retain(|s| seen.insert(s.clone()));
        sans
    }

    fn common_name(&self, side: Side) -> &str {
        match side {
            Side::Peer => &self.peer_cn,
            Side::Client => &self.client_cn,
        }
    }
}

/// A PKCS#1 RSA key (`RSA PRIVATE KEY`, as Helm's `genCA` writes) as PKCS#8, the form ring
/// signs with: the same key, wrapped in a PrivateKeyInfo naming rsaEncryption.
fn pkcs1_to_pkcs8(pkcs1: &[u8]) -> Vec<u8> {
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = content.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes: Vec<u8> = len
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend(bytes);
        }
        out.extend_from_slice(content);
        out
    }
    // version 0; AlgorithmIdentifier { rsaEncryption (1.2.840.113549.1.1.1), NULL }.
    let version = [0x02, 0x01, 0x00];
    let algorithm = [
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
    ];
    let mut body = Vec::new();
    body.extend_from_slice(&version);
    body.extend_from_slice(&algorithm);
    body.extend(tlv(0x04, pkcs1));
    tlv(0x30, &body)
}

/// The CA of `side` from `dir`: its certificate (PEM, as copied beside the leaves) and an
/// issuer that signs with its key.
fn load_ca(dir: &Path, side: Side) -> Result<(Vec<u8>, Issuer<'static, KeyPair>), IssueError> {
    let (cert_file, key_file) = side.ca_files();
    let (cert_path, key_path) = (dir.join(cert_file), dir.join(key_file));
    let cert_pem = read(&cert_path)?;
    let key_pem = read(&key_path)?;
    let ca_error = |path: &Path, detail: String| IssueError::Ca {
        path: path.to_path_buf(),
        detail,
    };
    let pkcs8 = match PrivateKeyDer::from_pem_slice(&key_pem) {
        Ok(PrivateKeyDer::Pkcs8(k)) => k.secret_pkcs8_der().to_vec(),
        Ok(PrivateKeyDer::Pkcs1(k)) => pkcs1_to_pkcs8(k.secret_pkcs1_der()),
        Ok(_) => {
            return Err(ca_error(
                &key_path,
                "an EC key in SEC1 form (EC PRIVATE KEY): give it as PKCS#8 (openssl pkcs8 -topk8 -nocrypt)".into(),
            ))
        }
        Err(_) => return Err(ca_error(&key_path, "no PEM private key".into())),
    };
    let key = KeyPair::try_from(pkcs8.as_slice())
        .map_err(|e| ca_error(&key_path, format!("its key: {e}")))?;
    let text = String::from_utf8_lossy(&cert_pem);
    let issuer = Issuer::from_ca_cert_pem(&text, key)
        .map_err(|e| ca_error(&cert_path, format!("its certificate: {e}")))?;
    Ok((cert_pem, issuer))
}

/// `side`'s certificate and key for `subject`, valid from a little before `now` (clocks
/// differ between nodes) for the subject's validity.
fn sign(
    subject: &Subject,
    side: Side,
    issuer: &Issuer<'static, KeyPair>,
    now: u64,
) -> Result<(String, String), IssueError> {
    let failed = |e: rcgen::Error| IssueError::Sign {
        what: side.name(),
        detail: e.to_string(),
    };
    let at = |unix: u64| {
        time::OffsetDateTime::from_unix_timestamp(i64::try_from(unix).unwrap_or(i64::MAX)).map_err(
            |e| IssueError::Sign {
                what: side.name(),
                detail: e.to_string(),
            },
        )
    };
    let mut params = CertificateParams::new(subject.sans(side)).map_err(failed)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, subject.common_name(side));
    params.distinguished_name = dn;
    params.not_before = at(now.saturating_sub(300))?;
    params.not_after = at(now.saturating_add(subject.validity))?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    // Both ways: etcd serves with each certificate and dials its peers (and the agent
    // calls etcd) with it.
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(failed)?;
    let cert = params.signed_by(&key, issuer).map_err(failed)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes `bytes` to `dir/name` whole or not at all: written aside, synced, renamed over.
fn write_file(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<(), IssueError> {
    let path = dir.join(name);
    let staged = dir.join(format!(".{name}.new"));
    let failed = |source| IssueError::Write {
        path: path.clone(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(mode)
        .open(&staged)
        .map_err(failed)?;
    f.write_all(bytes).map_err(failed)?;
    f.sync_all().map_err(failed)?;
    std::fs::rename(&staged, &path).map_err(failed)
}

impl Issuing {
    /// The client side's files (etcd's serving certificate and the agent's own).
    pub fn client_files(&self) -> TlsFiles {
        self.files(Side::Client)
    }

    /// The peer side's files.
    pub fn peer_files(&self) -> TlsFiles {
        self.files(Side::Peer)
    }

    fn files(&self, side: Side) -> TlsFiles {
        let name = side.name();
        TlsFiles {
            cert: self.out_dir.join(format!("{name}.crt")),
            key: self.out_dir.join(format!("{name}.key")),
            ca: self.out_dir.join(format!("{name}-ca.crt")),
        }
    }

    /// Why the certificates must be issued (again) at `now` (Unix seconds), or `None` while
    /// the ones there do.
    pub fn due(&self, now: u64) -> Option<String> {
        let record = std::fs::read(self.out_dir.join(RECORD)).ok();
        match record.and_then(|r| serde_json::from_slice::<Subject>(&r).ok()) {
            None => return Some("no certificates issued yet".into()),
            Some(s) if s != self.subject => {
                return Some("the certificates there name another pod, address or validity".into())
            }
            Some(_) => {}
        }
        for side in Side::BOTH {
            let files = self.files(side);
            let theirs = std::fs::read(self.issuer_dir.join(side.ca_files().0)).ok();
            if theirs.is_none() || std::fs::read(&files.ca).ok() != theirs {
                return Some(format!(
                    "the {} CA in {} changed",
                    side.name(),
                    self.issuer_dir.display()
                ));
            }
            let not_after = std::fs::read(&files.cert).ok().and_then(|pem| {
                let der = rustls_pki_types::CertificateDer::from_pem_slice(&pem).ok()?;
                super::expiry::not_after(der.as_ref())
            });
            let Some(not_after) = not_after else {
                return Some(format!("{} cannot be read", files.cert.display()));
            };
            let left = not_after.saturating_sub(i64::try_from(now).unwrap_or(i64::MAX));
            let renew_at = i64::try_from(self.subject.validity / 3).unwrap_or(i64::MAX);
            if left < renew_at {
                return Some(format!(
                    "{} expires in {left} s, less than a third of its validity",
                    files.cert.display()
                ));
            }
        }
        None
    }

    /// Issues the certificates if they are due (see [`Issuing::due`]), under the
    /// directory's lock; what was due, when they were issued.
    pub fn ensure(&self, now: u64) -> Result<Option<String>, IssueError> {
        if self.due(now).is_none() {
            return Ok(None);
        }
        // The CAs first: a directory is made only for certificates that can be signed.
        let cas = [
            (Side::Peer, load_ca(&self.issuer_dir, Side::Peer)?),
            (Side::Client, load_ca(&self.issuer_dir, Side::Client)?),
        ];
        let dir = &self.out_dir;
        let write_failed = |path: &Path| {
            let path = path.to_path_buf();
            move |source| IssueError::Write { path, source }
        };
        std::fs::create_dir_all(dir).map_err(write_failed(dir))?;
        let lock_path = dir.join(LOCK);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(write_failed(&lock_path))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| write_failed(&lock_path)(e.into()))?;
        // Another process may have issued them while this one waited for the lock.
        let Some(why) = self.due(now) else {
            return Ok(None);
        };
        for (side, (ca_pem, issuer)) in cas {
            let (cert, key) = sign(&self.subject, side, &issuer, now)?;
            let name = side.name();
            write_file(dir, &format!("{name}-ca.crt"), &ca_pem, 0o644)?;
            write_file(dir, &format!("{name}.key"), key.as_bytes(), 0o600)?;
            write_file(dir, &format!("{name}.crt"), cert.as_bytes(), 0o644)?;
        }
        let record = serde_json::to_vec(&self.subject).unwrap_or_default();
        write_file(dir, RECORD, &record, 0o644)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(write_failed(dir))?;
        Ok(Some(why))
    }
}

/// The DNS names and IP addresses a certificate (DER) carries, as text; empty when it does
/// not parse or carries none.
pub fn subject_alt_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            x509_parser::extensions::GeneralName::IPAddress(ip) => match ip.len() {
                4 => <[u8; 4]>::try_from(*ip)
                    .ok()
                    .map(|a| IpAddr::from(a).to_string()),
                16 => <[u8; 16]>::try_from(*ip)
                    .ok()
                    .map(|a| IpAddr::from(a).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// The common names of a certificate's subject (DER), for pinning a peer's identity.
pub fn common_names(der: &[u8]) -> Vec<String> {
    match x509_parser::parse_x509_certificate(der) {
        Ok((_, cert)) => cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok().map(str::to_string))
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use rcgen::{BasicConstraints, CertifiedIssuer, IsCa};

    const NOW: u64 = 1_800_000_000;
    const DAY: u64 = 86_400;

    fn write_ca(dir: &Path, side: Side, name: &str) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let key_pem = key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(params, key).unwrap();
        let (cert, keyf) = side.ca_files();
        std::fs::write(dir.join(cert), ca.pem()).unwrap();
        std::fs::write(dir.join(keyf), key_pem).unwrap();
    }

    fn issuing(root: &Path) -> Issuing {
        let issuer_dir = root.join("ca");
        std::fs::create_dir_all(&issuer_dir).unwrap();
        write_ca(&issuer_dir, Side::Peer, "peer CA");
        write_ca(&issuer_dir, Side::Client, "client CA");
        Issuing {
            issuer_dir,
            out_dir: root.join("issued"),
            subject: Subject {
                host: "etcd-1.etcd.ns.svc.cluster.local".into(),
                service_domain: "etcd.ns.svc.cluster.local".into(),
                peer_cn: "etcd-peer".into(),
                client_cn: "etcd-steward".into(),
                ip: Some("10.1.2.3".parse().unwrap()),
                extra: vec!["etcd-client.ns.svc".into()],
                validity: 30 * DAY,
            },
        }
    }

    fn leaf(path: &Path) -> Vec<u8> {
        let pem = std::fs::read(path).unwrap();
        rustls_pki_types::CertificateDer::from_pem_slice(&pem)
            .unwrap()
            .as_ref()
            .to_vec()
    }

    #[test]
    fn a_pods_peer_certificate_names_that_pod_alone_and_the_sets_peer_name() {
        let root = tempfile::tempdir().unwrap();
        let iss = issuing(root.path());
        assert_eq!(
            iss.ensure(NOW).unwrap().as_deref(),
            Some("no certificates issued yet")
        );
        let peer = leaf(&iss.peer_files().cert);
        assert_eq!(
            subject_alt_names(&peer),
            vec![
                "etcd-1.etcd.ns.svc.cluster.local",
                "10.1.2.3",
                "etcd-client.ns.svc"
            ]
        );
        assert_eq!(common_names(&peer), vec!["etcd-peer"]);
        let client = leaf(&iss.client_files().cert);
        let client_sans = subject_alt_names(&client);
        for name in [
            "etcd-1.etcd.ns.svc.cluster.local",
            "*.etcd.ns.svc.cluster.local",
            "localhost",
            "127.0.0.1",
            "10.1.2.3",
            "etcd-client.ns.svc",
        ] {
            assert!(client_sans.contains(&name.to_string()), "{client_sans:?}");
        }
        assert_eq!(common_names(&client), vec!["etcd-steward"]);
        // Valid for the validity, from five minutes before now.
        let not_after = super::super::expiry::not_after(&peer).unwrap();
        assert_eq!(not_after, (NOW + 30 * DAY) as i64);
    }

    #[test]
    fn issued_files_load_as_tls_material_of_their_ca() {
        let root = tempfile::tempdir().unwrap();
        let iss = issuing(root.path());
        iss.ensure(NOW).unwrap();
        for files in [iss.peer_files(), iss.client_files()] {
            let m = super::super::TlsMaterial::load(&files).unwrap();
            let loaded = m.current().0;
            // Issued by the CA copied beside it (the check a reload makes).
            assert_eq!(loaded.unusable(NOW), None);
        }
    }

    #[test]
    fn renewal_is_due_with_a_third_of_the_validity_left_and_not_before() {
        let root = tempfile::tempdir().unwrap();
        let iss = issuing(root.path());
        iss.ensure(NOW).unwrap();
        let first = std::fs::read(&iss.peer_files().cert).unwrap();
        // Two thirds of 30 days, less a second: not due; nothing is written.
        let before = NOW + 20 * DAY - 1;
        assert_eq!(iss.due(before), None);
        assert_eq!(iss.ensure(before).unwrap(), None);
        assert_eq!(std::fs::read(&iss.peer_files().cert).unwrap(), first);
        // A second later, due; issued anew, and not due after.
        let at = NOW + 20 * DAY + 1;
        let why = iss.ensure(at).unwrap().unwrap();
        assert!(why.contains("less than a third"), "{why}");
        assert_ne!(std::fs::read(&iss.peer_files().cert).unwrap(), first);
        assert_eq!(iss.due(at), None);
    }

    #[test]
    fn a_changed_ca_or_subject_makes_the_certificates_due() {
        let root = tempfile::tempdir().unwrap();
        let mut iss = issuing(root.path());
        iss.ensure(NOW).unwrap();
        write_ca(&iss.issuer_dir, Side::Client, "a new client CA");
        assert!(iss.due(NOW).unwrap().contains("client CA"));
        iss.ensure(NOW).unwrap();
        assert_eq!(
            std::fs::read(&iss.client_files().ca).unwrap(),
            std::fs::read(iss.issuer_dir.join(CLIENT_CA_CERT)).unwrap()
        );
        iss.subject.ip = Some("10.9.9.9".parse().unwrap());
        assert!(iss.due(NOW).unwrap().contains("another pod"));
    }

    #[test]
    fn a_ca_with_a_pkcs1_rsa_key_as_helm_makes_it_issues_certificates_of_that_ca() {
        // Made by `openssl genrsa -traditional` and `openssl req -x509`: an `RSA PRIVATE KEY`
        // as Helm's genCA writes it.
        let root = tempfile::tempdir().unwrap();
        let iss = issuing(root.path());
        for side in Side::BOTH {
            let (cert, key) = side.ca_files();
            std::fs::write(
                iss.issuer_dir.join(cert),
                include_str!("testdata/rsa-ca.crt"),
            )
            .unwrap();
            std::fs::write(
                iss.issuer_dir.join(key),
                include_str!("testdata/rsa-ca.key"),
            )
            .unwrap();
        }
        assert!(include_str!("testdata/rsa-ca.key").starts_with("-----BEGIN RSA PRIVATE KEY"));
        iss.ensure(NOW).unwrap();
        for files in [iss.peer_files(), iss.client_files()] {
            let m = super::super::TlsMaterial::load(&files).unwrap();
            assert_eq!(m.current().0.unusable(NOW), None);
            let (cert_der, ca_der) = (leaf(&files.cert), leaf(&files.ca));
            let (_, cert) = x509_parser::parse_x509_certificate(&cert_der).unwrap();
            let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
            // Signed by the RSA CA's key: the signature verifies with its public key.
            cert.verify_signature(Some(ca.public_key())).unwrap();
        }
    }

    #[test]
    fn a_missing_ca_key_is_an_error_naming_the_file() {
        let root = tempfile::tempdir().unwrap();
        let iss = issuing(root.path());
        std::fs::remove_file(iss.issuer_dir.join(PEER_CA_KEY)).unwrap();
        let e = iss.ensure(NOW).unwrap_err().to_string();
        assert!(e.contains("peer-ca.key"), "{e}");
    }
}
