//! Pure naming: pod name → (set name, ordinal); the stable DNS names, URLs and the
//! `--initial-cluster` string every pod of the set derives the same way.

use thiserror::Error;

/// Why a pod name cannot identify a StatefulSet member.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum NameError {
    #[error("pod name {0:?} must end in -<ordinal> (a StatefulSet pod name such as etcd-2)")]
    NoOrdinal(String),
    #[error("pod name {0:?} must be a DNS label: 1-63 lowercase letters, digits or '-'")]
    NotDnsLabel(String),
}

/// Who this pod is and how every pod of the set is addressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The StatefulSet name: the pod name without `-<ordinal>`.
    pub set_name: String,
    pub ordinal: u32,
    pub service: String,
    pub namespace: String,
    pub cluster_domain: String,
    pub client_port: u16,
    pub peer_port: u16,
    /// `https` when the matching TLS files are configured, `http` otherwise.
    pub client_scheme: &'static str,
    pub peer_scheme: &'static str,
}

/// Splits `etcd-2` into (`etcd`, 2).
pub fn parse_pod_name(name: &str) -> Result<(String, u32), NameError> {
    let valid_label = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if !valid_label {
        return Err(NameError::NotDnsLabel(name.to_string()));
    }
    let (set, ordinal) = name
        .rsplit_once('-')
        .ok_or_else(|| NameError::NoOrdinal(name.to_string()))?;
    let digits_ok = !ordinal.is_empty()
        && ordinal.bytes().all(|b| b.is_ascii_digit())
        && (ordinal == "0" || !ordinal.starts_with('0'));
    match ordinal.parse::<u32>() {
        Ok(n) if digits_ok && !set.is_empty() => Ok((set.to_string(), n)),
        _ => Err(NameError::NoOrdinal(name.to_string())),
    }
}

impl Identity {
    /// This pod's member name (the pod name).
    pub fn name(&self) -> String {
        self.pod_name(self.ordinal)
    }

    /// The pod name of `ordinal`.
    pub fn pod_name(&self, ordinal: u32) -> String {
        format!("{}-{}", self.set_name, ordinal)
    }

    /// The stable DNS name of `ordinal`: `<pod>.<service>.<namespace>.svc.<domain>`.
    /// The ordinal of pod `name` of this set (`etcd-2` → 2).
    pub fn ordinal_of_name(&self, name: &str) -> Option<u32> {
        name.strip_prefix(self.set_name.as_str())?
            .strip_prefix('-')?
            .parse()
            .ok()
    }

    pub fn host(&self, ordinal: u32) -> String {
        format!(
            "{}.{}.{}.svc.{}",
            self.pod_name(ordinal),
            self.service,
            self.namespace,
            self.cluster_domain
        )
    }

    pub fn peer_url(&self, ordinal: u32) -> String {
        format!(
            "{}://{}:{}",
            self.peer_scheme,
            self.host(ordinal),
            self.peer_port
        )
    }

    pub fn client_url(&self, ordinal: u32) -> String {
        format!(
            "{}://{}:{}",
            self.client_scheme,
            self.host(ordinal),
            self.client_port
        )
    }

    /// `--initial-cluster` for a set of `replicas` pods formed together.
    pub fn initial_cluster(&self, replicas: u32) -> String {
        (0..replicas)
            .map(|o| format!("{}={}", self.pod_name(o), self.peer_url(o)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The ordinal the first of `urls` (a member's peer URLs) that names a pod of this set
    /// names.
    pub fn ordinal_of_peer_urls(&self, urls: &[String]) -> Option<u32> {
        urls.iter().find_map(|u| self.ordinal_of_peer_url(u))
    }

    /// The ordinal a peer URL of this set names, if it names one.
    pub fn ordinal_of_peer_url(&self, url: &str) -> Option<u32> {
        let rest = url.strip_prefix(&format!("{}://", self.peer_scheme))?;
        let host = rest.strip_suffix(&format!(":{}", self.peer_port))?;
        let pod = host.strip_suffix(&format!(
            ".{}.{}.svc.{}",
            self.service, self.namespace, self.cluster_domain
        ))?;
        let (set, ordinal) = parse_pod_name(pod).ok()?;
        (set == self.set_name).then_some(ordinal)
    }
}

/// Splits `scheme://host:port` into (host, port).
pub fn split_url(url: &str) -> Option<(String, u16)> {
    let rest = url.split_once("://")?.1.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_string(), port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident() -> Identity {
        Identity {
            set_name: "etcd".into(),
            ordinal: 1,
            service: "etcd".into(),
            namespace: "db".into(),
            cluster_domain: "cluster.local".into(),
            client_port: 2379,
            peer_port: 2380,
            client_scheme: "http",
            peer_scheme: "http",
        }
    }

    #[test]
    fn statefulset_pod_names_split_into_set_and_ordinal() {
        assert_eq!(parse_pod_name("etcd-2"), Ok(("etcd".into(), 2)));
        assert_eq!(parse_pod_name("my-etcd-10"), Ok(("my-etcd".into(), 10)));
        assert_eq!(parse_pod_name("etcd-0"), Ok(("etcd".into(), 0)));
    }

    #[test]
    fn names_without_an_ordinal_are_refused() {
        for bad in ["etcd", "etcd-", "etcd-x", "etcd-01", "etcd-99999999999"] {
            assert!(
                matches!(parse_pod_name(bad), Err(NameError::NoOrdinal(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_pod_name("Etcd-1"),
            Err(NameError::NotDnsLabel(_))
        ));
        assert!(matches!(parse_pod_name(""), Err(NameError::NotDnsLabel(_))));
        assert!(matches!(
            parse_pod_name("-3"),
            Err(NameError::NotDnsLabel(_))
        ));
    }

    #[test]
    fn urls_use_the_stable_dns_names() {
        let id = ident();
        assert_eq!(id.host(2), "etcd-2.etcd.db.svc.cluster.local");
        assert_eq!(
            id.peer_url(0),
            "http://etcd-0.etcd.db.svc.cluster.local:2380"
        );
        assert_eq!(
            id.client_url(0),
            "http://etcd-0.etcd.db.svc.cluster.local:2379"
        );
        assert_eq!(
            id.initial_cluster(2),
            "etcd-0=http://etcd-0.etcd.db.svc.cluster.local:2380,etcd-1=http://etcd-1.etcd.db.svc.cluster.local:2380"
        );
    }

    #[test]
    fn urls_split_into_host_and_port() {
        assert_eq!(
            split_url("http://etcd-0.etcd:2379"),
            Some(("etcd-0.etcd".into(), 2379))
        );
        assert_eq!(split_url("https://[::1]:2379/"), Some(("::1".into(), 2379)));
        assert_eq!(split_url("etcd-0:2379"), None);
    }

    #[test]
    fn peer_urls_map_back_to_ordinals_only_for_this_set() {
        let id = ident();
        assert_eq!(id.ordinal_of_peer_url(&id.peer_url(4)), Some(4));
        assert_eq!(
            id.ordinal_of_peer_url("http://other-1.etcd.db.svc.cluster.local:2380"),
            None
        );
        assert_eq!(id.ordinal_of_peer_url("http://10.0.0.1:2380"), None);
    }
}
