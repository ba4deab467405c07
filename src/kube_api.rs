//! The Kubernetes API, narrowly: the StatefulSet's `spec.replicas` (the desired size) and the
//! names of the pods that exist in the namespace. Two GETs with the pod's service-account
//! token, over the in-cluster HTTPS endpoint (or `--kube-api-url`, plain HTTP in tests).
//! A hand-written client on the hyper and rustls the agent already carries: two read-only
//! calls do not earn the `kube` and `k8s-openapi` crates. [`Workload`] is the seam; a fake
//! stands in for tests.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde::Deserialize;
use thiserror::Error;

use crate::identity::parse_pod_name;

/// The service account's files, as Kubernetes mounts them in every pod.
pub const SA_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const SA_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// How long one call to the API may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// A pod list of a busy namespace is large; this bounds it.
const MAX_BODY: usize = 32 * 1024 * 1024;

/// Why the API gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KubeError {
    #[error("Kubernetes API at {url} unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("Kubernetes API answered {code} to GET {path}: {message}")]
    Status {
        path: String,
        code: u16,
        message: String,
    },
    #[error("Kubernetes API's answer to GET {path} is not what was expected: {detail}")]
    Malformed { path: String, detail: String },
    #[error("Kubernetes API set-up: {0}")]
    Setup(String),
}

/// How to reach the API, validated in `config.rs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeAccess {
    /// `https://10.96.0.1:443` in a cluster.
    pub url: String,
    /// Read before every call (projected tokens rotate); none when the file is absent.
    pub token_file: PathBuf,
    /// The CA of the API server's certificate (https only).
    pub ca_file: PathBuf,
    pub namespace: String,
    pub statefulset: String,
}

/// The two questions scale-in asks.
pub trait Workload: Send + Sync {
    /// The StatefulSet's `spec.replicas`.
    fn desired_replicas(&self) -> impl Future<Output = Result<u32, KubeError>> + Send;
    /// The names of the pods present in the namespace (terminating ones included).
    fn pods(&self) -> impl Future<Output = Result<Vec<String>, KubeError>> + Send;
}

/// What the API said, for the scale-in planner: the desired size, and which ordinals of
/// this set have a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadState {
    pub replicas: u32,
    pub pods: BTreeSet<u32>,
}

/// Asks both questions; the pods are kept only when they belong to `set` (`<set>-<n>`).
pub async fn workload_state<W: Workload>(w: &W, set: &str) -> Result<WorkloadState, KubeError> {
    let replicas = w.desired_replicas().await?;
    let pods = w
        .pods()
        .await?
        .iter()
        .filter_map(|n| parse_pod_name(n).ok())
        .filter(|(s, _)| s == set)
        .map(|(_, o)| o)
        .collect();
    Ok(WorkloadState { replicas, pods })
}

#[derive(Deserialize)]
struct StatefulSet {
    metadata: Metadata,
    spec: StatefulSetSpec,
}

#[derive(Deserialize)]
struct StatefulSetSpec {
    /// The API server answers with defaults applied, so `replicas` is always there; an
    /// answer without it says nothing about the desired size (never taken as 1).
    replicas: Option<u32>,
}

#[derive(Deserialize)]
struct PodList {
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Metadata,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
}

/// A `Status` object, as the API answers an error.
#[derive(Deserialize)]
struct Status {
    message: Option<String>,
}

/// The real API.
#[derive(Clone)]
pub struct ApiWorkload {
    access: KubeAccess,
    scheme_https: bool,
    host: String,
    port: u16,
    tls: Option<Arc<ClientConfig>>,
}

impl std::fmt::Debug for ApiWorkload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiWorkload")
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl ApiWorkload {
    /// Parses the URL and, for https, loads the CA.
    pub fn new(access: &KubeAccess) -> Result<Self, KubeError> {
        let uri: hyper::Uri = access
            .url
            .parse()
            .map_err(|e| KubeError::Setup(format!("--kube-api-url {:?}: {e}", access.url)))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(KubeError::Setup(format!(
                    "--kube-api-url {:?} must start with https:// or http://",
                    access.url
                )))
            }
        };
        let host = uri
            .host()
            .ok_or_else(|| {
                KubeError::Setup(format!("--kube-api-url {:?} has no host", access.url))
            })?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            Some(client_config(&access.ca_file)?)
        } else {
            None
        };
        Ok(ApiWorkload {
            access: access.clone(),
            scheme_https: https,
            host,
            port,
            tls,
        })
    }

    async fn get(&self, path: &str) -> Result<Vec<u8>, KubeError> {
        let url = &self.access.url;
        let token = std::fs::read_to_string(&self.access.token_file)
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let unreachable = |detail: String| KubeError::Unreachable {
            url: url.clone(),
            detail,
        };
        let call = async {
            let addr: SocketAddr = tokio::net::lookup_host((self.host.as_str(), self.port))
                .await
                .map_err(|e| unreachable(format!("resolving {}: {e}", self.host)))?
                .next()
                .ok_or_else(|| unreachable(format!("{} has no address", self.host)))?;
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| unreachable(format!("connect {addr}: {e}")))?;
            match (&self.tls, self.scheme_https) {
                (Some(tls), true) => {
                    let name = ServerName::try_from(self.host.clone())
                        .map_err(|e| KubeError::Setup(format!("{:?}: {e}", self.host)))?;
                    let stream = tokio_rustls::TlsConnector::from(tls.clone())
                        .connect(name, stream)
                        .await
                        .map_err(|e| unreachable(format!("TLS: {e}")))?;
                    self.exchange(TokioIo::new(stream), path, token.as_deref())
                        .await
                }
                _ => {
                    self.exchange(TokioIo::new(stream), path, token.as_deref())
                        .await
                }
            }
        };
        tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| unreachable(format!("GET {path}: no answer within {CALL_TIMEOUT:?}")))?
    }

    async fn exchange<S>(
        &self,
        io: TokioIo<S>,
        path: &str,
        token: Option<&str>,
    ) -> Result<Vec<u8>, KubeError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let unreachable = |detail: String| KubeError::Unreachable {
            url: self.access.url.clone(),
            detail,
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| unreachable(format!("handshake: {e}")))?;
        let conn = tokio::spawn(conn);
        let mut req = hyper::Request::get(path)
            .header(hyper::header::HOST, &self.host)
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(t) = token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| KubeError::Setup(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| unreachable(format!("GET {path}: {e}")))?;
        let code = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| unreachable(format!("reading GET {path}: {e}")))?
            .to_bytes();
        conn.abort();
        if code != 200 {
            let message = serde_json::from_slice::<Status>(&body)
                .ok()
                .and_then(|s| s.message)
                .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(200).collect());
            return Err(KubeError::Status {
                path: path.to_string(),
                code,
                message,
            });
        }
        Ok(body.to_vec())
    }
}

fn client_config(ca_file: &std::path::Path) -> Result<Arc<ClientConfig>, KubeError> {
    let pem = std::fs::read(ca_file)
        .map_err(|e| KubeError::Setup(format!("--kube-ca-file {ca_file:?}: {e}")))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok) {
        roots
            .add(cert)
            .map_err(|e| KubeError::Setup(format!("--kube-ca-file {ca_file:?}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(KubeError::Setup(format!(
            "--kube-ca-file {ca_file:?} holds no PEM certificate"
        )));
    }
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| KubeError::Setup(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(Arc::new(config))
}

/// `spec.replicas` of the StatefulSet named `name`; anything else is no answer.
fn stated_replicas(path: &str, name: &str, set: StatefulSet) -> Result<u32, KubeError> {
    let malformed = |detail: String| KubeError::Malformed {
        path: path.to_string(),
        detail,
    };
    if set.metadata.name != name {
        return Err(malformed(format!(
            "it describes StatefulSet {:?}, not {name:?}",
            set.metadata.name
        )));
    }
    set.spec
        .replicas
        .ok_or_else(|| malformed("spec.replicas is missing".into()))
}

fn parse<T: for<'a> Deserialize<'a>>(path: &str, body: &[u8]) -> Result<T, KubeError> {
    serde_json::from_slice(body).map_err(|e| KubeError::Malformed {
        path: path.to_string(),
        detail: e.to_string(),
    })
}

impl Workload for ApiWorkload {
    async fn desired_replicas(&self) -> Result<u32, KubeError> {
        let path = format!(
            "/apis/apps/v1/namespaces/{}/statefulsets/{}",
            self.access.namespace, self.access.statefulset
        );
        let set: StatefulSet = parse(&path, &self.get(&path).await?)?;
        stated_replicas(&path, &self.access.statefulset, set)
    }

    async fn pods(&self) -> Result<Vec<String>, KubeError> {
        let path = format!("/api/v1/namespaces/{}/pods", self.access.namespace);
        let list: PodList = parse(&path, &self.get(&path).await?)?;
        Ok(list.items.into_iter().map(|p| p.metadata.name).collect())
    }
}

/// An in-memory API for tests: set what it answers.
#[derive(Debug, Default, Clone)]
pub struct FakeWorkload {
    inner: Arc<Mutex<FakeState>>,
}

#[derive(Debug, Default)]
struct FakeState {
    replicas: Option<u32>,
    pods: Vec<String>,
}

impl FakeWorkload {
    /// `replicas: None` answers as an unreachable API.
    pub fn set(&self, replicas: Option<u32>, pods: &[&str]) {
        if let Ok(mut s) = self.inner.lock() {
            s.replicas = replicas;
            s.pods = pods.iter().map(|p| p.to_string()).collect();
        }
    }

    fn state(&self) -> Result<(u32, Vec<String>), KubeError> {
        let s = self
            .inner
            .lock()
            .map_err(|e| KubeError::Setup(e.to_string()))?;
        match s.replicas {
            Some(r) => Ok((r, s.pods.clone())),
            None => Err(KubeError::Unreachable {
                url: "fake".into(),
                detail: "down".into(),
            }),
        }
    }
}

impl Workload for FakeWorkload {
    async fn desired_replicas(&self) -> Result<u32, KubeError> {
        self.state().map(|(r, _)| r)
    }

    async fn pods(&self) -> Result<Vec<String>, KubeError> {
        self.state().map(|(_, p)| p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_this_sets_pods_count() {
        let w = FakeWorkload::default();
        w.set(
            Some(3),
            &["etcd-0", "etcd-4", "etcd-backup-1", "web-2", "weird"],
        );
        let s = workload_state(&w, "etcd")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.replicas, 3);
        assert_eq!(s.pods, BTreeSet::from([0, 4]));
        w.set(None, &[]);
        assert!(workload_state(&w, "etcd").await.is_err());
    }

    #[test]
    fn real_statefulset_and_pod_list_json_parse() {
        let set = r#"{"apiVersion":"apps/v1","kind":"StatefulSet","metadata":{"name":"etcd","namespace":"default"},"spec":{"replicas":3,"serviceName":"etcd","selector":{"matchLabels":{"app":"etcd"}}},"status":{"replicas":5}}"#;
        let s: StatefulSet = parse("/x", set.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.spec.replicas, Some(3));
        let list = r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"etcd-0","namespace":"default"},"spec":{},"status":{"phase":"Running"}}]}"#;
        let l: PodList = parse("/y", list.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.items[0].metadata.name, "etcd-0");
    }

    #[test]
    fn a_statefulset_answer_without_replicas_or_for_another_set_states_no_size() {
        let answer = |json: &str| {
            let s: StatefulSet = parse("/x", json.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            stated_replicas("/x", "etcd", s)
        };
        assert!(matches!(
            answer(r#"{"metadata":{"name":"etcd"},"spec":{"replicas":3}}"#),
            Ok(3)
        ));
        assert!(matches!(
            answer(r#"{"metadata":{"name":"etcd"},"spec":{}}"#),
            Err(KubeError::Malformed { detail, .. }) if detail.contains("replicas")
        ));
        assert!(matches!(
            answer(r#"{"metadata":{"name":"web"},"spec":{"replicas":1}}"#),
            Err(KubeError::Malformed { detail, .. }) if detail.contains("web")
        ));
    }

    #[test]
    fn https_needs_a_readable_ca_and_urls_are_checked() {
        let access = KubeAccess {
            url: "https://10.96.0.1:443".into(),
            token_file: "/nonexistent/token".into(),
            ca_file: "/nonexistent/ca.crt".into(),
            namespace: "default".into(),
            statefulset: "etcd".into(),
        };
        assert!(
            matches!(ApiWorkload::new(&access), Err(KubeError::Setup(m)) if m.contains("--kube-ca-file"))
        );
        let plain = KubeAccess {
            url: "http://127.0.0.1:8001".into(),
            ..access.clone()
        };
        assert!(ApiWorkload::new(&plain).is_ok());
        let bad = KubeAccess {
            url: "ftp://x".into(),
            ..access
        };
        assert!(ApiWorkload::new(&bad).is_err());
    }
}
