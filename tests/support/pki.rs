//! Test certificates of the kind users have: a client CA and a peer CA, one wildcard
//! certificate per side for `*.<service>.<namespace>.svc.<domain>` (etcd checks a peer's
//! client certificate against the PTR name of its address, which the wildcard matches),
//! and an outsider signed by another CA. On loopback every connection comes from
//! 127.0.0.1, so the certificates also carry that address.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

pub struct Pki {
    pub dir: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(dir: &Path, name: &str, sans: &[String], issuer: &CertifiedIssuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(sans.to_vec()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}-key.pem")), key.serialize_pem()).unwrap();
}

impl Pki {
    /// Writes `{client,peer}-ca.pem`, `{client,peer,outsider}.pem` and their keys.
    pub fn generate(dir: &Path, service: &str, namespace: &str, domain: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let sans = vec![
            format!("*.{service}.{namespace}.svc.{domain}"),
            format!("{service}.{namespace}.svc.{domain}"),
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ];
        let client_ca = ca("etcd client CA");
        let peer_ca = ca("etcd peer CA");
        let other_ca = ca("someone else's CA");
        std::fs::write(dir.join("client-ca.pem"), client_ca.pem()).unwrap();
        std::fs::write(dir.join("peer-ca.pem"), peer_ca.pem()).unwrap();
        leaf(dir, "client", &sans, &client_ca);
        leaf(dir, "peer", &sans, &peer_ca);
        leaf(dir, "outsider", &sans, &other_ca);
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The etcd-steward options that turn TLS on for clients and peers.
    pub fn args(&self) -> Vec<String> {
        let p = |f: &str| self.path(f).display().to_string();
        vec![
            format!("--client-cert-file={}", p("client.pem")),
            format!("--client-key-file={}", p("client-key.pem")),
            format!("--trusted-ca-file={}", p("client-ca.pem")),
            format!("--peer-cert-file={}", p("peer.pem")),
            format!("--peer-key-file={}", p("peer-key.pem")),
            format!("--peer-trusted-ca-file={}", p("peer-ca.pem")),
        ]
    }

    /// etcd-client TLS options for the member named `host`.
    pub fn client_tls(&self, host: &str) -> etcd_client::TlsOptions {
        let read = |f: &str| std::fs::read(self.path(f)).unwrap();
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read("client-ca.pem")))
            .identity(etcd_client::Identity::from_pem(
                read("client.pem"),
                read("client-key.pem"),
            ))
            .domain_name(host)
    }

    /// A loaded certificate/key/CA triple, e.g. ("peer", "peer-ca") or ("outsider", "peer-ca").
    pub fn material(&self, cert: &str, ca: &str) -> etcd_steward::tls::TlsMaterial {
        etcd_steward::tls::TlsMaterial::load(&etcd_steward::tls::TlsFiles {
            cert: self.path(&format!("{cert}.pem")),
            key: self.path(&format!("{cert}-key.pem")),
            ca: self.path(&format!("{ca}.pem")),
        })
        .unwrap()
    }
}
