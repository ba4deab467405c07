//! The Kubernetes API (scale-in, `leave --if-scaled-in`): `KubeArgs` into a
//! [`KubeAccess`](crate::kube_api::KubeAccess) and the scale-in interval.

use std::time::Duration;

use super::parse::{dns_label_ok, duration_at_least};
use super::KubeArgs;

impl KubeArgs {
    /// The API access (when its URL is known) and the scale-in interval (with --scale-in).
    pub fn validate(
        &self,
        set_name: &str,
        namespace: &str,
        problems: &mut Vec<String>,
    ) -> (Option<crate::kube_api::KubeAccess>, Option<Duration>) {
        let statefulset = self
            .statefulset_name
            .clone()
            .unwrap_or_else(|| set_name.to_string());
        if !statefulset.is_empty() && !dns_label_ok(&statefulset) {
            problems.push(format!(
                "--statefulset-name {statefulset:?} must be a DNS label"
            ));
        }
        let url = match (&self.kube_api_url, &self.service_host) {
            (Some(u), _) if !u.is_empty() => Some(u.clone()),
            (_, Some(host)) if !host.is_empty() => {
                let port = self.service_port.as_deref().unwrap_or("443");
                Some(match host.parse::<std::net::Ipv6Addr>() {
                    Ok(_) => format!("https://[{host}]:{port}"),
                    Err(_) => format!("https://{host}:{port}"),
                })
            }
            _ => None,
        };
        let access = url.map(|url| crate::kube_api::KubeAccess {
            url,
            token_file: self.kube_token_file.clone(),
            ca_file: self.kube_ca_file.clone(),
            namespace: namespace.to_string(),
            statefulset,
        });
        if !self.scale_in {
            return (access, None);
        }
        let interval = duration_at_least(
            "scale-in-interval",
            &self.scale_in_interval,
            Duration::from_secs(1),
            "10s",
            problems,
        )
        .unwrap_or_default();
        match &access {
            None => problems.push(
                "--scale-in needs the Kubernetes API: run in a cluster (KUBERNETES_SERVICE_HOST) or give --kube-api-url"
                    .into(),
            ),
            Some(a) => {
                if let Err(e) = crate::kube_api::ApiWorkload::new(a) {
                    problems.push(format!("--scale-in: {e}"));
                }
            }
        }
        (access, Some(interval))
    }
}
