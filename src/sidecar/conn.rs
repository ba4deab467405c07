//! The sidecar's connections, kept across ticks: one to the local member, and one per other
//! member by DNS name, reopened when the name points at a new address (a rescheduled pod),
//! and all reopened when the client TLS files rotated (an open channel would reconnect
//! with the certificates it was opened with).

use std::collections::HashMap;
use std::net::IpAddr;

use crate::dns::Dns;
use crate::etcd::{Connector, Etcd, EtcdError, MemberInfo};
use crate::identity::{split_url, Identity};

/// A new connection to the member whose client URL is `url` (an IP literal as it is, a
/// name asked of DNS afresh), or why there is none, in words.
pub async fn connect_url<D: Dns, C: Connector>(
    dns: &D,
    connector: &C,
    url: Option<&str>,
) -> Result<C::Member, String> {
    let (host, port) = url
        .and_then(split_url)
        .ok_or("no client URL in the member list")?;
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => Some(ip),
        Err(_) => dns.lookup(&host).await.first(),
    }
    .ok_or_else(|| format!("{host} does not resolve"))?;
    connector
        .connect(&host, ip, port)
        .await
        .map_err(|e| e.to_string())
}

/// `HashKV` at `revision` of the member at client URL `url` (a new connection, see
/// [`connect_url`]): the hash and the compacted revision, or why there is none, in words.
pub async fn hash_kv_at<D: Dns, C: Connector>(
    dns: &D,
    connector: &C,
    url: Option<&str>,
    revision: i64,
) -> Result<(u32, i64), String> {
    let member = connect_url(dns, connector, url).await?;
    member.hash_kv(revision).await.map_err(|e| e.to_string())
}

/// The connection cache, and the DNS and connector it opens connections with.
pub struct Connections<D, C: Connector> {
    identity: Identity,
    local_ip: IpAddr,
    /// Ordinals are looked for up to this bound (the set may have grown past `--replicas`).
    top_ordinal: u32,
    dns: D,
    connector: C,
    local: Option<C::Member>,
    /// Other members, by DNS name, with the address they were opened to.
    remotes: HashMap<String, (IpAddr, C::Member)>,
    /// The connector's TLS material version the connections above were opened with.
    tls_version: u64,
}

impl<D: Dns, C: Connector> Connections<D, C> {
    pub fn new(identity: Identity, local_ip: IpAddr, replicas: u32, dns: D, connector: C) -> Self {
        let top_ordinal = replicas.max(identity.ordinal + 1) + 2;
        let tls_version = connector.tls_version();
        Connections {
            identity,
            local_ip,
            top_ordinal,
            dns,
            connector,
            local: None,
            remotes: HashMap::new(),
            tls_version,
        }
    }

    /// Drops every connection once the TLS material changed since they were opened.
    fn drop_if_tls_rotated(&mut self) {
        let now = self.connector.tls_version();
        if now != self.tls_version {
            if self.local.is_some() || !self.remotes.is_empty() {
                tracing::info!("the client TLS files changed: reconnecting to etcd with them");
            }
            self.tls_version = now;
            self.local = None;
            self.remotes.clear();
        }
    }

    /// The connection to this pod's member, opened on first use.
    pub async fn local(&mut self) -> Result<&C::Member, EtcdError> {
        self.drop_if_tls_rotated();
        if self.local.is_none() {
            let id = &self.identity;
            let member = self
                .connector
                .connect(&id.host(id.ordinal), self.local_ip, id.client_port)
                .await?;
            self.local = Some(member);
        }
        self.local.as_ref().ok_or(EtcdError::NoLeader)
    }

    /// Drops the local connection, so the next use opens a new one (e.g. one opened without
    /// a token while the member was a learner, which refuses authentication).
    pub fn forget_local(&mut self) {
        self.local = None;
    }

    /// A connection to the member whose URL is `url`, resolving its name afresh.
    pub async fn remote(&mut self, url: &str) -> Option<&C::Member> {
        self.drop_if_tls_rotated();
        let (host, port) = split_url(url)?;
        let ip = match host.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => {
                let answer = self.dns.lookup(&host).await;
                tracing::debug!(%host, ?answer, "resolved");
                answer.first()?
            }
        };
        let stale = self.remotes.get(&host).is_some_and(|(old, _)| *old != ip);
        if stale || !self.remotes.contains_key(&host) {
            let member = self.connector.connect(&host, ip, port).await.ok()?;
            self.remotes.insert(host.clone(), (ip, member));
        }
        self.remotes.get(&host).map(|(_, m)| m)
    }

    /// The address `host` names now (an IP literal as it is), asked of DNS afresh.
    pub async fn resolve(&self, host: &str) -> Option<IpAddr> {
        match host.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => self.dns.lookup(host).await.first(),
        }
    }

    /// The member list as the first other pod that answers has it, with that pod's URL.
    pub async fn members_from_peers(&mut self) -> Option<(String, Vec<MemberInfo>)> {
        let me = self.identity.ordinal;
        for o in (0..self.top_ordinal).filter(|o| *o != me) {
            let url = self.identity.client_url(o);
            if let Some(peer) = self.remote(&url).await {
                match peer.members().await {
                    Ok((_, members)) => return Some((url, members)),
                    Err(e) => tracing::debug!(peer = o, error = %e, "member list from peer failed"),
                }
            }
        }
        None
    }
}
