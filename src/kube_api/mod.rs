//! The Kubernetes API, narrowly: the StatefulSet's `spec.replicas` (the desired size) and
//! `spec.selector.matchLabels`, and the names of the pods those labels select in the
//! namespace. Two read-only GETs through the `kube` crate's typed client
//! (`Api<StatefulSet>::get`, `Api<Pod>::list` with a `labelSelector`), with the pod's
//! service-account token (re-read as it rotates) over the in-cluster HTTPS endpoint, or
//! `--kube-api-url` (https to the project's test API server in tests/kube_calls.rs, plain
//! HTTP to `harness::fake_kube` elsewhere). [`Workload`] is the seam; a fake stands in for
//! unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::Api;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use thiserror::Error;

use crate::identity::parse_pod_name;

pub mod acts;
pub mod events;

/// The service account's files, as Kubernetes mounts them in every pod.
pub const SA_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const SA_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// How long one call to the API may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The bearer token, re-read as it rotates (projected tokens do); none when the file is
    /// absent.
    pub token_file: PathBuf,
    /// The CA of the API server's certificate (https only).
    pub ca_file: PathBuf,
    pub namespace: String,
    pub statefulset: String,
}

/// What scale-in reads of the StatefulSet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetSpec {
    /// `spec.replicas`: the desired size.
    pub replicas: u32,
    /// `spec.selector.matchLabels`: the labels of the set's pods.
    pub match_labels: BTreeMap<String, String>,
}

impl SetSpec {
    /// The equality-based `labelSelector` of the set's pods (`k=v,k2=v2`); empty (every pod
    /// of the namespace) when the set has no `matchLabels`.
    pub fn label_selector(&self) -> String {
        self.match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The two questions scale-in asks.
pub trait Workload: Send + Sync {
    /// The StatefulSet's `spec.replicas` and `spec.selector.matchLabels`.
    fn statefulset(&self) -> impl Future<Output = Result<SetSpec, KubeError>> + Send;
    /// The names of the pods that `label_selector` selects in the namespace (terminating
    /// ones included); every pod of the namespace when it is empty.
    fn pods(
        &self,
        label_selector: &str,
    ) -> impl Future<Output = Result<Vec<String>, KubeError>> + Send;
    /// The StatefulSet's `spec.replicas` alone (the preStop hook's question).
    fn desired_replicas(&self) -> impl Future<Output = Result<u32, KubeError>> + Send {
        async { self.statefulset().await.map(|s| s.replicas) }
    }
}

/// What the API said, for the scale-in planner: the desired size, and which ordinals of
/// this set have a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadState {
    pub replicas: u32,
    pub pods: BTreeSet<u32>,
}

/// Asks both questions: the pods are listed by the set's `matchLabels`, and of those only
/// the ones named `<set>-<n>` are kept.
pub async fn workload_state<W: Workload>(w: &W, set: &str) -> Result<WorkloadState, KubeError> {
    let spec = w.statefulset().await?;
    let pods = w
        .pods(&spec.label_selector())
        .await?
        .iter()
        .filter_map(|n| parse_pod_name(n).ok())
        .filter(|(s, _)| s == set)
        .map(|(_, o)| o)
        .collect();
    Ok(WorkloadState {
        replicas: spec.replicas,
        pods,
    })
}

/// The real API, through `kube::Client`.
pub struct ApiWorkload {
    access: KubeAccess,
    config: kube::Config,
    /// Built at the first call (it needs the runtime), and again when the token changes:
    /// with the token it was built with.
    client: tokio::sync::Mutex<Option<(Option<String>, kube::Client)>>,
}

impl std::fmt::Debug for ApiWorkload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiWorkload")
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl ApiWorkload {
    /// Parses the URL and, for https, loads the CA. Makes no call.
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
        if uri.host().is_none_or(str::is_empty) {
            return Err(KubeError::Setup(format!(
                "--kube-api-url {:?} has no host",
                access.url
            )));
        }
        let mut config = kube::Config::new(uri);
        config.default_namespace = access.namespace.clone();
        config.connect_timeout = Some(CALL_TIMEOUT);
        config.read_timeout = Some(CALL_TIMEOUT);
        config.write_timeout = Some(CALL_TIMEOUT);
        config.reset_reader_on_write = true;
        // One answer per look: the caller asks again at its own pace.
        config.default_retry = false;
        if https {
            config.root_cert = Some(ca_certificates(&access.ca_file)?);
            // kube re-reads it about once a minute: the CA rotates like the token.
            config.root_cert_file = Some(access.ca_file.clone());
        } else {
            // Plain http carries no TLS, but kube sets its TLS up anyway, from the system's
            // trust store when given no CA: an image built FROM scratch has none, and the
            // set-up failed ("No CA certificates were loaded from the system"). An empty
            // store is never used.
            config.root_cert = Some(Vec::new());
        }
        Ok(ApiWorkload {
            access: access.clone(),
            config,
            client: tokio::sync::Mutex::new(None),
        })
    }

    /// The client, with the token file's token (read before every call: projected tokens
    /// rotate; trimmed, as a file written by hand ends in a newline), without a token when
    /// the file is absent or empty.
    async fn client(&self) -> Result<kube::Client, KubeError> {
        let token = std::fs::read_to_string(&self.access.token_file)
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let mut held = self.client.lock().await;
        if let Some((t, c)) = held.as_ref() {
            if *t == token {
                return Ok(c.clone());
            }
        }
        let mut config = self.config.clone();
        config.auth_info.token = token.clone().map(Into::into);
        // It takes the process's crypto provider (reqwest/kube bring none of their own).
        crate::tls::install_default_provider();
        let client = kube::Client::try_from(config)
            .map_err(|e| KubeError::Setup(format!("client for {}: {e}", self.access.url)))?;
        *held = Some((token, client.clone()));
        Ok(client)
    }

    /// One call, within [`CALL_TIMEOUT`], its error said as a [`KubeError`].
    async fn call<T, F>(
        &self,
        path: &str,
        f: impl FnOnce(kube::Client) -> F,
    ) -> Result<T, KubeError>
    where
        F: Future<Output = Result<T, kube::Error>>,
    {
        let client = self.client().await?;
        match tokio::time::timeout(CALL_TIMEOUT, f(client)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(kube_error(&self.access.url, path, e)),
            Err(_) => Err(KubeError::Unreachable {
                url: self.access.url.clone(),
                detail: format!("GET {path}: no answer within {CALL_TIMEOUT:?}"),
            }),
        }
    }
}

/// The PEM certificates of `ca_file`, as DER.
fn ca_certificates(ca_file: &std::path::Path) -> Result<Vec<Vec<u8>>, KubeError> {
    let pem = std::fs::read(ca_file)
        .map_err(|e| KubeError::Setup(format!("--kube-ca-file {ca_file:?}: {e}")))?;
    let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .map(|c| c.as_ref().to_vec())
        .collect();
    if certs.is_empty() {
        return Err(KubeError::Setup(format!(
            "--kube-ca-file {ca_file:?} holds no PEM certificate"
        )));
    }
    Ok(certs)
}

/// kube's error as ours: the API's `Status` answer keeps its code and message; an answer
/// that does not decode is malformed; anything else is an API not reached.
fn kube_error(url: &str, path: &str, e: kube::Error) -> KubeError {
    match e {
        kube::Error::Api(status) => KubeError::Status {
            path: path.to_string(),
            code: status.code,
            message: status.message.clone(),
        },
        kube::Error::SerdeError(e) => KubeError::Malformed {
            path: path.to_string(),
            detail: e.to_string(),
        },
        kube::Error::FromUtf8(e) => KubeError::Malformed {
            path: path.to_string(),
            detail: e.to_string(),
        },
        kube::Error::BuildRequest(e) => KubeError::Setup(format!("GET {path}: {e}")),
        kube::Error::Auth(e) => KubeError::Setup(format!("GET {path}: credentials: {e}")),
        other => KubeError::Unreachable {
            url: url.to_string(),
            detail: format!("GET {path}: {}", chain(&other)),
        },
    }
}

/// An error with its sources, `a: b: c` (hyper's top-level message alone says little).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text = format!("{text}: {s_text}");
        }
        source = s.source();
    }
    text
}

/// `spec.replicas` and `matchLabels` of the StatefulSet named `name`; anything else is no
/// answer.
fn stated_spec(path: &str, name: &str, set: StatefulSet) -> Result<SetSpec, KubeError> {
    let malformed = |detail: String| KubeError::Malformed {
        path: path.to_string(),
        detail,
    };
    let answered = set.metadata.name.unwrap_or_default();
    if answered != name {
        return Err(malformed(format!(
            "it describes StatefulSet {answered:?}, not {name:?}"
        )));
    }
    let spec = set.spec;
    // The API server answers with defaults applied, so `replicas` is always there; an
    // answer without it says nothing about the desired size (never taken as 1).
    let replicas = spec
        .replicas
        .ok_or_else(|| malformed("spec.replicas is missing".into()))?;
    let replicas =
        u32::try_from(replicas).map_err(|_| malformed(format!("spec.replicas is {replicas}")))?;
    Ok(SetSpec {
        replicas,
        match_labels: spec.selector.match_labels.unwrap_or_default(),
    })
}

impl Workload for ApiWorkload {
    async fn statefulset(&self) -> Result<SetSpec, KubeError> {
        let (ns, name) = (&self.access.namespace, &self.access.statefulset);
        let path = format!("/apis/apps/v1/namespaces/{ns}/statefulsets/{name}");
        let set = self
            .call(&path, |c| async move {
                Api::<StatefulSet>::namespaced(c, ns).get(name).await
            })
            .await?;
        stated_spec(&path, name, set)
    }

    async fn pods(&self, label_selector: &str) -> Result<Vec<String>, KubeError> {
        let ns = &self.access.namespace;
        let mut path = format!("/api/v1/namespaces/{ns}/pods");
        let mut params = ListParams::default();
        if !label_selector.is_empty() {
            path = format!("{path}?labelSelector={label_selector}");
            params = params.labels(label_selector);
        }
        let list = self
            .call(&path, |c| async move {
                Api::<Pod>::namespaced(c, ns).list(&params).await
            })
            .await?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeWorkload;

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
        assert_eq!(w.calls(), 3, "both questions, then the first fails");
    }

    /// A StatefulSet as the API server answers a GET (defaults applied).
    fn statefulset_json(name: &str, replicas: Option<u32>) -> String {
        let replicas = replicas
            .map(|r| format!(r#""replicas":{r},"#))
            .unwrap_or_default();
        format!(
            r#"{{"apiVersion":"apps/v1","kind":"StatefulSet","metadata":{{"name":"{name}","namespace":"default","uid":"6a3c","resourceVersion":"4242","labels":{{"app":"etcd"}}}},"spec":{{{replicas}"serviceName":"etcd","podManagementPolicy":"Parallel","selector":{{"matchLabels":{{"app":"etcd","tier":"db"}}}},"template":{{"metadata":{{"labels":{{"app":"etcd","tier":"db"}}}},"spec":{{"containers":[{{"name":"etcd","image":"etcd"}}]}}}},"updateStrategy":{{"type":"RollingUpdate"}}}},"status":{{"replicas":5,"readyReplicas":3}}}}"#
        )
    }

    fn parse<T: serde::de::DeserializeOwned>(json: &str) -> T {
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
    }

    #[test]
    fn real_statefulset_and_pod_list_json_parse() {
        let s: StatefulSet = parse(&statefulset_json("etcd", Some(3)));
        let spec = stated_spec("/x", "etcd", s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spec.replicas, 3);
        assert_eq!(spec.label_selector(), "app=etcd,tier=db");
        let list = r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"etcd-0","namespace":"default","labels":{"app":"etcd"}},"spec":{"containers":[{"name":"etcd","image":"etcd"}]},"status":{"phase":"Running"}}]}"#;
        let l: kube::core::ObjectList<Pod> = parse(list);
        assert_eq!(l.items[0].metadata.name.as_deref(), Some("etcd-0"));
    }

    #[test]
    fn a_statefulset_answer_without_replicas_or_for_another_set_states_no_size() {
        let answer = |json: String| stated_spec("/x", "etcd", parse(&json));
        assert!(matches!(
            answer(statefulset_json("etcd", Some(3))),
            Ok(SetSpec { replicas: 3, .. })
        ));
        assert!(matches!(
            answer(statefulset_json("etcd", None)),
            Err(KubeError::Malformed { detail, .. }) if detail.contains("replicas")
        ));
        assert!(matches!(
            answer(statefulset_json("web", Some(1))),
            Err(KubeError::Malformed { detail, .. }) if detail.contains("web")
        ));
    }

    #[test]
    fn a_set_without_match_labels_lists_every_pod_of_the_namespace() {
        assert_eq!(SetSpec::default().label_selector(), "");
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
