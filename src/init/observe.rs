//! Gathers the [`Facts`] for one round of `init`: the data directory, this pod's and its
//! peers' DNS names, a current view of the cluster from a voter that sees a leader, and
//! the peers' reports of their own volumes.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::task::JoinSet;

use crate::backup::store::Store;
use crate::backup::{catalog, RestoreChoice};
use crate::config::Config;
use crate::dns::Dns;
use crate::etcd::{Connector, Etcd};
use crate::facts::{
    BackupFacts, ClusterFacts, ClusterView, Endpoint, Facts, Lookup, PeerFacts, PeerReport,
    RecoveryRequest, RestoreRequest, RestoreWanted, SnapshotFacts,
};
use crate::http_get;
use crate::report::{parse_report, MAX_REPORT_BYTES};
use crate::volume::{self, VolumeError};

/// How long one round may spend asking the cluster when the volume holds data (a restart
/// must not wait on peers that are down) and when it does not.
const CLUSTER_DEADLINE_WITH_DATA: Duration = Duration::from_millis(500);
const CLUSTER_DEADLINE_EMPTY: Duration = Duration::from_secs(4);
const REPORT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Ordinals beyond the initial size that are looked up, to notice pods of a scaled-up set.
const EXTRA_ORDINALS: u32 = 2;

/// Asks a peer's sidecar for its report of its volume: the evidence a formation rests on.
pub trait PeerReports: Send + Sync {
    /// The report of pod `name` (DNS name `host`) at `ip`, or why there is none.
    fn report(
        &self,
        name: &str,
        host: &str,
        ip: IpAddr,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<PeerReport, String>> + Send;
}

/// Reports over HTTP from the peers' sidecars; with peer TLS, only over mutual TLS with the
/// peer certificates, on the peer-report port.
#[derive(Clone)]
pub struct HttpReports {
    port: u16,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl HttpReports {
    pub fn new(cfg: &Config) -> Self {
        match &cfg.peer_tls {
            Some(t) => HttpReports {
                port: cfg.peer_report_port,
                tls: Some(t.client_config()),
            },
            None => HttpReports {
                port: cfg.http_port,
                tls: None,
            },
        }
    }
}

impl PeerReports for HttpReports {
    async fn report(
        &self,
        name: &str,
        host: &str,
        ip: IpAddr,
        timeout: Duration,
    ) -> Result<PeerReport, String> {
        let addr = SocketAddr::new(ip, self.port);
        fetch_report(addr, host, name, self.tls.as_ref(), timeout).await
    }
}

pub struct Observer<D, C, R> {
    pub cfg: Config,
    pub dns: D,
    pub connector: C,
    pub reports: R,
    /// The backup store, when a new cluster may restore from it (`--backup-url`, and
    /// `--restore` not `never`).
    pub store: Option<Store>,
}

impl<D, C, R> Observer<D, C, R>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
    R: PeerReports + Clone + 'static,
{
    /// The ordinals of the other pods worth asking.
    fn peer_ordinals(&self) -> Vec<u32> {
        let me = self.cfg.identity.ordinal;
        let top = self.cfg.replicas.max(me + 1) + EXTRA_ORDINALS;
        (0..top).filter(|o| *o != me).collect()
    }

    pub async fn observe(&self, fresh_nonce: String) -> Result<Facts, VolumeError> {
        let cfg = &self.cfg;
        let id = &cfg.identity;
        let data = volume::inspect(&cfg.data_dir)?;

        let mut lookups = JoinSet::new();
        for o in std::iter::once(id.ordinal).chain(self.peer_ordinals()) {
            let dns = self.dns.clone();
            let host = id.host(o);
            lookups.spawn(async move { (o, dns.lookup(&host).await) });
        }
        let mut resolved: Vec<(u32, Lookup)> = lookups.join_all().await;
        resolved.sort_by_key(|(o, _)| *o);
        let own_dns = resolved
            .iter()
            .find(|(o, _)| *o == id.ordinal)
            .map(|(_, l)| l.clone())
            .unwrap_or(Lookup::NotFound);
        let peers: Vec<(u32, Lookup)> = resolved
            .into_iter()
            .filter(|(o, _)| *o != id.ordinal)
            .collect();

        let deadline = if data.has_data() {
            CLUSTER_DEADLINE_WITH_DATA
        } else {
            CLUSTER_DEADLINE_EMPTY
        };
        let cluster = self.cluster_view(&peers, deadline);
        // With data the reports only tell whether this volume is the odd one out, and must
        // not hold up a restart longer than the cluster may.
        let report_timeout = if data.has_data() {
            CLUSTER_DEADLINE_WITH_DATA
        } else {
            REPORT_TIMEOUT
        };
        let reports = async {
            let mut set = JoinSet::new();
            for (o, lookup) in &peers {
                let (o, lookup) = (*o, lookup.clone());
                let name = id.pod_name(o);
                let host = id.host(o);
                let reports = self.reports.clone();
                set.spawn(async move {
                    let report = match lookup.first() {
                        Some(ip) => Some(reports.report(&name, &host, ip, report_timeout).await),
                        None => None,
                    };
                    PeerFacts {
                        ordinal: o,
                        name,
                        dns: lookup,
                        report,
                    }
                });
            }
            let mut all = set.join_all().await;
            all.sort_by_key(|p| p.ordinal);
            all
        };
        // With data, this pod's own sidecar may hold a recovery request naming it.
        let own_report = async {
            match (data.has_data(), own_dns.first()) {
                (true, Some(ip)) => self
                    .reports
                    .report(&id.name(), &id.host(id.ordinal), ip, report_timeout)
                    .await
                    .ok(),
                _ => None,
            }
        };
        let (cluster, peer_facts, own_report) = tokio::join!(cluster, reports, own_report);
        let recovery_request = recovery_request(&id.name(), &peer_facts, own_report.as_ref());
        let restore_request = peer_facts
            .iter()
            .filter_map(|p| p.report.as_ref()?.as_ref().ok())
            .chain(own_report.as_ref())
            .find_map(|r| r.restore_request.clone());
        let mut data = data;
        let names_me = recovery_request
            .as_ref()
            .is_some_and(|r| r.survivor == id.name());
        if data.has_data() && (data.recovery.is_some() || names_me) {
            match volume::log_tail(&cfg.data_dir) {
                Ok(tail) => data.tail = tail,
                Err(e) => data.notes.push(format!("WAL tail unreadable: {e}")),
            }
        }
        // A restore request this volume has not acted on: its data goes aside only once
        // the store shows the snapshot usable, so the store is asked.
        let restore_pending = restore_request
            .as_ref()
            .is_some_and(|r| data.restored_for.as_deref() != Some(r.id.as_str()));
        let may_form = restore_pending
            || (!data.has_data() && matches!(cluster, ClusterFacts::NotReached { .. }));
        let backups = self.backups(may_form, restore_request.as_ref()).await;
        Ok(Facts {
            ordinal: id.ordinal,
            name: id.name(),
            set_name: id.set_name.clone(),
            host: id.host(id.ordinal),
            peer_url: id.peer_url(id.ordinal),
            replicas: cfg.replicas,
            initial_cluster: id.initial_cluster(cfg.replicas),
            data,
            own_dns,
            cluster,
            backups,
            peers: peer_facts,
            fresh_nonce,
            recovery_request,
            restore_request,
        })
    }

    /// What the backup store offers: asked only when a new cluster may have to be formed
    /// (this volume empty, no cluster answering, or a restore request pending), as the list
    /// costs a request per snapshot.
    async fn backups(&self, may_form: bool, restore: Option<&RestoreRequest>) -> BackupFacts {
        let (Some(store), Some(b)) = (&self.store, &self.cfg.backup) else {
            return BackupFacts::Off;
        };
        // An operator's restore request names the snapshot, whatever --restore says.
        let wanted = match (restore, &b.restore) {
            (Some(r), _) => RestoreWanted::Named(r.snapshot.clone()),
            (None, RestoreChoice::Never) => return BackupFacts::Off,
            (None, RestoreChoice::Latest) => RestoreWanted::Latest,
            (None, RestoreChoice::Named(name)) => RestoreWanted::Named(name.clone()),
        };
        if !may_form {
            return BackupFacts::NotAsked;
        }
        match catalog::list(store).await {
            Ok(manifests) => BackupFacts::Listed {
                wanted,
                snapshots: manifests
                    .iter()
                    .map(|m| SnapshotFacts {
                        name: m.name.clone(),
                        revision: m.revision,
                        time_unix: m.time_unix,
                        verified: m.verified,
                        drill_failed: m.drill.as_ref().is_some_and(|d| !d.passed),
                    })
                    .collect(),
            },
            Err(e) => BackupFacts::Unreachable {
                error: e.to_string(),
            },
        }
    }

    /// Asks every resolved peer's etcd at once; the first voter that sees a leader and
    /// serves a linearizable read gives the view.
    async fn cluster_view(&self, peers: &[(u32, Lookup)], deadline: Duration) -> ClusterFacts {
        let id = &self.cfg.identity;
        let mut tried = Vec::new();
        let mut set = JoinSet::new();
        for (o, lookup) in peers {
            let host = id.host(*o);
            let Some(ip) = lookup.first() else {
                if *o < self.cfg.replicas {
                    tried.push(format!("{}: {}", id.pod_name(*o), describe(lookup)));
                }
                continue;
            };
            let connector = self.connector.clone();
            let port = id.client_port;
            let name = id.pod_name(*o);
            set.spawn(async move {
                let r =
                    tokio::time::timeout(deadline, view_from(&connector, &host, ip, port)).await;
                (
                    name,
                    r.unwrap_or_else(|_| Err(format!("no answer within {deadline:?}"))),
                )
            });
        }
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok((_, Ok(view))) => {
                    set.abort_all();
                    return ClusterFacts::Healthy(view);
                }
                Ok((name, Err(e))) => tried.push(format!("{name}: {e}")),
                Err(e) => tried.push(format!("a cluster query failed: {e}")),
            }
        }
        tried.sort();
        ClusterFacts::NotReached { tried }
    }
}

/// The recovery request the sidecars hold: one naming this pod first, else any.
fn recovery_request(
    me: &str,
    peers: &[PeerFacts],
    own: Option<&PeerReport>,
) -> Option<RecoveryRequest> {
    let held: Vec<&RecoveryRequest> = peers
        .iter()
        .filter_map(|p| p.report.as_ref()?.as_ref().ok())
        .chain(own)
        .filter_map(|r| r.recovery_request.as_ref())
        .collect();
    held.iter()
        .find(|r| r.survivor == me)
        .or(held.first())
        .map(|r| (*r).clone())
}

fn describe(lookup: &Lookup) -> String {
    match lookup {
        Lookup::Found(ips) => format!("resolves to {ips:?}"),
        Lookup::NotFound => "DNS name not published".into(),
        Lookup::Failed(e) => format!("DNS lookup failed: {e}"),
    }
}

pub async fn view_from<C: Connector>(
    connector: &C,
    host: &str,
    ip: IpAddr,
    port: u16,
) -> Result<ClusterView, String> {
    let member = connector
        .connect(host, ip, port)
        .await
        .map_err(|e| e.to_string())?;
    let status = member.status().await.map_err(|e| e.to_string())?;
    if status.is_learner {
        return Err("is a learner (cannot vouch for the member list)".into());
    }
    if status.leader == 0 {
        return Err("answers but sees no leader".into());
    }
    member
        .linearizable_read()
        .await
        .map_err(|e| format!("no quorum read: {e}"))?;
    let (cluster_id, members) = member.members().await.map_err(|e| e.to_string())?;
    Ok(ClusterView {
        source: Endpoint {
            host: host.to_string(),
            ip,
        },
        cluster_id,
        leader: status.leader,
        members,
    })
}

/// GETs and checks a peer's report of its volume.
pub async fn fetch_report(
    addr: SocketAddr,
    host: &str,
    name: &str,
    tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
    timeout: Duration,
) -> Result<PeerReport, String> {
    let (status, body) =
        http_get::get_with(addr, host, "/peer/report", timeout, MAX_REPORT_BYTES, tls)
            .await
            .map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("answered HTTP {status}"));
    }
    parse_report(&body, name).map_err(|e| e.to_string())
}
