//! The options every role shares (`CommonArgs`) and `init`'s own (`InitArgs`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::parse::{dns_label_ok, duration_at_least, find_executable, port, tls_side};
use super::{CommonArgs, Config, ConfigError, InitArgs, InitConfig};
use crate::etcd::Auth;
use crate::identity::{parse_pod_name, Identity};

impl CommonArgs {
    /// `--tls-issuer-dir`'s issuance for this pod, its certificates made now when they are
    /// missing or due (init and the sidecar start together; the first takes the lock):
    /// the TLS files then load as given ones would.
    fn issuing(
        &self,
        set_name: &str,
        ordinal: u32,
        service: &str,
        domain: &str,
        problems: &mut Vec<String>,
    ) -> Option<crate::tls::issue::Issuing> {
        let issuer_dir = self.tls_issuer_dir.clone()?;
        let validity = duration_at_least(
            "tls-issued-validity",
            &self.tls_issued_validity,
            crate::tls::issue::MIN_VALIDITY,
            "720h",
            problems,
        )?;
        if self.tls_issued_dir.is_relative() {
            problems.push(format!(
                "--tls-issued-dir must be an absolute path, got {:?}",
                self.tls_issued_dir
            ));
            return None;
        }
        if set_name.is_empty() {
            return None;
        }
        let service_domain = format!("{service}.{}.svc.{domain}", self.namespace);
        let ip = self
            .listen_ip
            .parse::<IpAddr>()
            .ok()
            .filter(|ip| !ip.is_unspecified());
        let issuing = crate::tls::issue::Issuing {
            issuer_dir,
            out_dir: self.tls_issued_dir.clone(),
            subject: crate::tls::issue::Subject {
                host: format!("{set_name}-{ordinal}.{service_domain}"),
                service_domain,
                peer_cn: self
                    .peer_cert_allowed_cn
                    .clone()
                    .filter(|cn| !cn.is_empty())
                    .unwrap_or_else(|| format!("{set_name}-peer")),
                client_cn: self
                    .auth_username
                    .clone()
                    .unwrap_or_else(|| "etcd-steward".into()),
                ip,
                extra: self
                    .tls_san
                    .iter()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect(),
                validity: validity.as_secs(),
            },
        };
        match issuing.ensure(crate::clock::unix_now()) {
            Ok(Some(why)) => {
                tracing::info!(dir = %issuing.out_dir.display(), why = %why, "issued this pod's certificates")
            }
            Ok(None) => {}
            Err(e) => problems.push(format!("--tls-issuer-dir: {e}")),
        }
        Some(issuing)
    }

    /// Validates every option; returns all broken constraints at once.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let name = self.name.clone().or_else(|| self.hostname.clone());
        let (set_name, ordinal) = match name.as_deref().map(parse_pod_name) {
            Some(Ok(parsed)) => parsed,
            Some(Err(e)) => {
                problems.push(e.to_string());
                (String::new(), 0)
            }
            None => {
                problems.push(
                    "--name (or POD_NAME, or HOSTNAME) is required: the pod name, such as etcd-0"
                        .into(),
                );
                (String::new(), 0)
            }
        };
        let service = self.service.clone().unwrap_or_else(|| set_name.clone());
        if !service.is_empty() && !dns_label_ok(&service) {
            problems.push(format!("--service {service:?} must be a DNS label"));
        }
        if !dns_label_ok(&self.namespace) {
            problems.push(format!(
                "--namespace {:?} must be a DNS label",
                self.namespace
            ));
        }
        let domain = self.cluster_domain.trim_end_matches('.').to_string();
        if domain.is_empty() || !domain.split('.').all(dns_label_ok) {
            problems.push(format!(
                "--cluster-domain {:?} must be a DNS name such as cluster.local",
                self.cluster_domain
            ));
        }
        let replicas = match self.replicas.as_deref().map(str::parse::<u32>) {
            Some(Ok(n)) if (1..=99).contains(&n) => n,
            Some(_) => {
                problems.push(format!(
                    "--replicas must be the initial cluster size, a whole number from 1 to 99, got {:?}",
                    self.replicas.as_deref().unwrap_or_default()
                ));
                0
            }
            None => {
                problems.push(
                    "--replicas (or ETCD_STEWARD_REPLICAS) is required: the initial cluster size"
                        .into(),
                );
                0
            }
        };
        let client_port = port("client-port", &self.client_port, &mut problems);
        let peer_port = port("peer-port", &self.peer_port, &mut problems);
        let http_port = port("http-port", &self.http_port, &mut problems);
        let peer_report_port = port("peer-report-port", &self.peer_report_port, &mut problems);
        let ports = [
            ("client-port", client_port),
            ("peer-port", peer_port),
            ("http-port", http_port),
            ("peer-report-port", peer_report_port),
        ];
        for (i, (a, pa)) in ports.iter().enumerate() {
            for (b, pb) in &ports[i + 1..] {
                if *pa != 0 && pa == pb {
                    problems.push(format!("--{a} and --{b} must differ, both are {pa}"));
                }
            }
        }
        let listen_ip = match self.listen_ip.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => {
                problems.push(format!(
                    "--listen-ip must be an IP address (etcd refuses host names in listen URLs), got {:?}",
                    self.listen_ip
                ));
                IpAddr::from([0, 0, 0, 0])
            }
        };
        let dns_server = match self.dns_server.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => match s.parse::<SocketAddr>() {
                Ok(addr) if addr.port() != 0 => Some(addr),
                _ => {
                    problems.push(format!(
                        "--dns-server must be IP:PORT such as 10.96.0.10:53, got {s:?}"
                    ));
                    None
                }
            },
        };
        let learner_stall_timeout = duration_at_least(
            "learner-stall-timeout",
            &self.learner_stall_timeout,
            Duration::from_secs(1),
            "30s or 5m",
            &mut problems,
        )
        .unwrap_or_default();
        // `0` (or `0s`) turns the corruption check off; otherwise at least a second.
        let corruption_check = match self.corruption_check_interval.trim() {
            "0" | "0s" => None,
            value => duration_at_least(
                "corruption-check-interval",
                value,
                Duration::from_secs(1),
                "10m (or 0 to turn the check off)",
                &mut problems,
            ),
        };
        let auto_recover_after = self.auto_recover_after.as_deref().and_then(|v| {
            duration_at_least(
                "auto-recover-after",
                v,
                Duration::from_secs(1),
                "10m",
                &mut problems,
            )
        });
        if self.data_dir.as_os_str().is_empty() || self.data_dir.is_relative() {
            problems.push(format!(
                "--data-dir must be an absolute path, got {:?}",
                self.data_dir
            ));
        }
        let issuing = self.issuing(&set_name, ordinal, &service, &domain, &mut problems);
        let client_given = [
            self.client_cert_file.clone(),
            self.client_key_file.clone(),
            self.trusted_ca_file.clone(),
        ];
        let peer_given = [
            self.peer_cert_file.clone(),
            self.peer_key_file.clone(),
            self.peer_trusted_ca_file.clone(),
        ];
        let issued = |f: crate::tls::TlsFiles| [Some(f.cert), Some(f.key), Some(f.ca)];
        let (client_files, peer_files) = match &issuing {
            Some(_) if client_given.iter().chain(&peer_given).any(Option::is_some) => {
                problems.push("--tls-issuer-dir and the --*-cert-file, --*-key-file and --*trusted-ca-file options exclude each other: the issued certificates are the TLS files".into());
                (Default::default(), Default::default())
            }
            Some(iss) => (issued(iss.client_files()), issued(iss.peer_files())),
            None => (client_given, peer_given),
        };
        let peer_cert_allowed_cn = self
            .peer_cert_allowed_cn
            .clone()
            .filter(|cn| !cn.is_empty())
            .or_else(|| issuing.as_ref().map(|i| i.subject.peer_cn.clone()));
        if peer_cert_allowed_cn.is_some() && peer_files.iter().all(Option::is_none) {
            problems.push("--peer-cert-allowed-cn needs peer TLS (--peer-cert-file, --peer-key-file, --peer-trusted-ca-file, or --tls-issuer-dir)".into());
        }
        let client_tls = tls_side(
            ["client-cert-file", "client-key-file", "trusted-ca-file"],
            &client_files,
            None,
            &mut problems,
        );
        let peer_tls = tls_side(
            ["peer-cert-file", "peer-key-file", "peer-trusted-ca-file"],
            &peer_files,
            peer_cert_allowed_cn.as_deref(),
            &mut problems,
        );
        let auth = match (&self.auth_username, &self.auth_password_file) {
            (None, None) => None,
            (Some(username), Some(file)) => match std::fs::read_to_string(file) {
                Ok(p) if !p.trim_end_matches(['\r', '\n']).is_empty() => Some(Auth {
                    username: username.clone(),
                    password: p.trim_end_matches(['\r', '\n']).to_string(),
                }),
                Ok(_) => {
                    problems.push(format!("--auth-password-file {file:?} is empty"));
                    None
                }
                Err(e) => {
                    problems.push(format!("--auth-password-file {file:?} cannot be read: {e}"));
                    None
                }
            },
            _ => {
                problems.push("--auth-username and --auth-password-file go together".into());
                None
            }
        };
        let control_token = match &self.control_token_file {
            None => None,
            Some(file) => match crate::control::ControlToken::load(file) {
                Ok(t) => Some(t),
                Err(e) => {
                    problems.push(e);
                    None
                }
            },
        };
        let backup = self.backup.validate(&self.etcd_bin, &mut problems);
        let defrag = self.defrag.validate(&mut problems);
        let (kube, scale_in) = self
            .kube
            .validate(&set_name, &self.namespace, &mut problems);
        if !problems.is_empty() {
            return Err(ConfigError { problems });
        }
        let identity = Identity {
            set_name,
            ordinal,
            service,
            namespace: self.namespace.clone(),
            cluster_domain: domain,
            client_port,
            peer_port,
            client_scheme: if client_tls.is_some() {
                "https"
            } else {
                "http"
            },
            peer_scheme: if peer_tls.is_some() { "https" } else { "http" },
        };
        // Events regard this pod: its name, and its UID when the downward API gives it.
        let events =
            (self.kube.events && kube.is_some()).then(|| crate::kube_api::events::Regarding {
                namespace: self.namespace.clone(),
                pod: identity.name(),
                uid: self.kube.pod_uid.clone().filter(|u| !u.is_empty()),
            });
        Ok(Config {
            identity,
            replicas,
            data_dir: self.data_dir.clone(),
            http_port,
            listen_ip,
            dns_server,
            etcd_bin: self.etcd_bin.clone(),
            learner_stall_timeout,
            corruption_check,
            auto_recover_after,
            etcd: crate::etcd::Access {
                tls: client_tls,
                auth,
            },
            peer_tls,
            peer_cert_allowed_cn,
            issuing,
            peer_report_port,
            control_token,
            backup,
            defrag,
            events,
            kube,
            scale_in,
        })
    }
}

impl InitArgs {
    /// Validates the shared options and, unless this is a dry run, that etcd can be exec'd.
    pub fn validate(&self) -> Result<InitConfig, ConfigError> {
        let mut config = self.common.validate();
        if !self.dry_run {
            match (find_executable(&self.common.etcd_bin), &mut config) {
                (Ok(path), Ok(c)) => c.etcd_bin = path,
                (Err(p), Ok(_)) => config = Err(ConfigError { problems: vec![p] }),
                (Err(p), Err(e)) => e.problems.push(p),
                (Ok(_), Err(_)) => {}
            }
        }
        Ok(InitConfig {
            config: config?,
            dry_run: self.dry_run,
            etcd_args: self.etcd_args.clone(),
        })
    }
}
