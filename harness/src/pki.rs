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

use crate::{Error, Result};

/// The certificates of one set, as files in `dir`.
pub struct Pki {
    /// Where the PEM files are.
    pub dir: PathBuf,
    /// The pods issue their own certificates from the CAs in `<dir>/issuer`
    /// ([`Pki::generate_issuer`]); the files here are the harness's own.
    pub issuer: bool,
}

fn rcgen_failed(e: rcgen::Error) -> Error {
    Error::Failed(format!("generating a test certificate: {e}"))
}

fn write(path: PathBuf, pem: String) -> Result<()> {
    std::fs::write(&path, pem).map_err(Error::io(format!("writing {}", path.display())))
}

/// When the certificates of a set expire: rcgen's default (4096-01-01), or a date.
type Until = Option<(i32, u8, u8)>;

fn valid_until(params: &mut CertificateParams, until: Until) {
    if let Some((year, month, day)) = until {
        params.not_after = rcgen::date_time_ymd(year, month, day);
    }
}

fn ca(name: &str, until: Until) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_failed)?;
    valid_until(&mut params, until);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(rcgen_failed)?)
        .map_err(rcgen_failed)
}

fn leaf(
    dir: &Path,
    name: &str,
    sans: &[String],
    issuer: &CertifiedIssuer<'static, KeyPair>,
    until: Until,
) -> Result<()> {
    leaf_named(dir, name, name, sans, issuer, until)
}

/// A leaf certificate `name.pem` (and `name-key.pem`) whose common name is `cn`.
fn leaf_named(
    dir: &Path,
    name: &str,
    cn: &str,
    sans: &[String],
    issuer: &CertifiedIssuer<'static, KeyPair>,
    until: Until,
) -> Result<()> {
    let mut params = CertificateParams::new(sans.to_vec()).map_err(rcgen_failed)?;
    valid_until(&mut params, until);
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().map_err(rcgen_failed)?;
    let cert = params.signed_by(&key, issuer).map_err(rcgen_failed)?;
    write(dir.join(format!("{name}.pem")), cert.pem())?;
    write(dir.join(format!("{name}-key.pem")), key.serialize_pem())
}

impl Pki {
    /// Writes `{client,peer}-ca.pem`, `{client,peer,outsider}.pem` and their keys.
    pub fn generate(dir: &Path, service: &str, namespace: &str, domain: &str) -> Result<Pki> {
        Pki::generate_until(dir, service, namespace, domain, None)
    }

    /// As [`Pki::generate`], from CAs of its own, every certificate valid until `until`
    /// (year, month, day; rcgen's 4096-01-01 when `None`): a renewal from a new CA.
    pub fn generate_until(
        dir: &Path,
        service: &str,
        namespace: &str,
        domain: &str,
        until: Until,
    ) -> Result<Pki> {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let sans = vec![
            format!("*.{service}.{namespace}.svc.{domain}"),
            format!("{service}.{namespace}.svc.{domain}"),
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ];
        let client_ca = ca("etcd client CA", until)?;
        let peer_ca = ca("etcd peer CA", until)?;
        let other_ca = ca("someone else's CA", until)?;
        write(dir.join("client-ca.pem"), client_ca.pem())?;
        write(dir.join("peer-ca.pem"), peer_ca.pem())?;
        leaf(dir, "client", &sans, &client_ca, until)?;
        leaf(dir, "peer", &sans, &peer_ca, until)?;
        leaf(dir, "outsider", &sans, &other_ca, until)?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            issuer: false,
        })
    }

    /// The CAs the pods issue their own certificates from (`--tls-issuer-dir`, as the
    /// chart's `<name>-ca` Secret: `<dir>/issuer/{peer,client}-ca.{crt,key}`), and the
    /// harness's own certificates from them: `client.pem` (its etcd client), `peer.pem`
    /// with the set's peer name `<service>-peer` (what the sidecars admit), and
    /// `stranger.pem`, signed by the peer CA under another name.
    pub fn generate_issuer(
        dir: &Path,
        service: &str,
        namespace: &str,
        domain: &str,
    ) -> Result<Pki> {
        let issuer_dir = dir.join("issuer");
        std::fs::create_dir_all(&issuer_dir)
            .map_err(Error::io(format!("creating {}", issuer_dir.display())))?;
        let sans = vec![
            format!("*.{service}.{namespace}.svc.{domain}"),
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ];
        let client_ca = ca("etcd client CA", None)?;
        let peer_ca = ca("etcd peer CA", None)?;
        let other_ca = ca("someone else's CA", None)?;
        for (name, ca) in [("client-ca", &client_ca), ("peer-ca", &peer_ca)] {
            write(dir.join(format!("{name}.pem")), ca.pem())?;
            write(issuer_dir.join(format!("{name}.crt")), ca.pem())?;
            write(
                issuer_dir.join(format!("{name}.key")),
                ca.key().serialize_pem(),
            )?;
        }
        leaf(dir, "client", &sans, &client_ca, None)?;
        leaf_named(
            dir,
            "peer",
            &format!("{service}-peer"),
            &sans,
            &peer_ca,
            None,
        )?;
        leaf_named(dir, "stranger", "not-a-peer", &sans, &peer_ca, None)?;
        leaf(dir, "outsider", &sans, &other_ca, None)?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            issuer: true,
        })
    }

    /// The path of one of the files, e.g. `peer-ca.pem`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Replaces this set's `file` (e.g. `peer-key.pem`) with `from`'s, as the kubelet
    /// updates a Secret's files: a new file renamed over the old.
    pub fn replace_from(&self, from: &Pki, file: &str) -> Result<()> {
        let staged = self.path(&format!("..{file}.new"));
        std::fs::copy(from.path(file), &staged)
            .map_err(Error::io(format!("copying {}", from.path(file).display())))?;
        std::fs::rename(&staged, self.path(file)).map_err(Error::io(format!(
            "replacing {}",
            self.path(file).display()
        )))
    }

    /// The etcd-steward options that turn TLS on for clients and peers.
    pub fn args(&self) -> Vec<String> {
        let p = |f: &str| self.path(f).display().to_string();
        if self.issuer {
            // Each pod's own directory; on loopback every connection comes from 127.0.0.1,
            // which etcd checks a peer's certificate against.
            return vec![
                format!("--tls-issuer-dir={}", p("issuer")),
                format!("--tls-issued-dir={}", p("issued-{ordinal}")),
                "--tls-san=127.0.0.1".into(),
            ];
        }
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
    pub fn client_tls(&self, host: &str) -> Result<etcd_client::TlsOptions> {
        let read = |f: &str| {
            let path = self.path(f);
            std::fs::read(&path).map_err(Error::io(format!("reading {}", path.display())))
        };
        Ok(etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read("client-ca.pem")?))
            .identity(etcd_client::Identity::from_pem(
                read("client.pem")?,
                read("client-key.pem")?,
            ))
            .domain_name(host))
    }
}
