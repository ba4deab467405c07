//! Gathers the [`Facts`] of one look at the world: the data directory, this pod's and its
//! peers' DNS names, a current view of the cluster from a voter that sees a leader, and
//! the peers' reports of their own volumes. Shared by `init`'s rounds, the sidecar's recovery
//! and restore checks, `status` and the incident commands.

use std::net::IpAddr;
use std::time::Duration;

use tokio::task::JoinSet;

mod backups;
mod reports;
mod versions;

pub use backups::{list_backups, newest_snapshot_age};
pub use reports::{fetch_report, HttpReports, PeerReports, ReportError};
pub use versions::{auth_on_3_4, binary_version, parse_peer_version};

use crate::backup::store::Store;
use crate::backup::RestoreChoice;
use crate::dns::Dns;
use crate::etcd::{Connector, Etcd};
use crate::facts::{
    BackupFacts, ClusterFacts, ClusterView, Endpoint, Facts, Lookup, PeerFacts, PeerReport,
    RecoveryRequest, RestoreRequest, RestoreWanted, VersionFacts,
};
use crate::identity::Identity;
use crate::volume::{self, VolumeError};

/// How long one round may spend asking the cluster when the volume holds data (a restart
/// must not wait on peers that are down) and when it does not.
const CLUSTER_DEADLINE_WITH_DATA: Duration = Duration::from_millis(500);
const CLUSTER_DEADLINE_EMPTY: Duration = Duration::from_secs(4);
/// With data the cluster already vouched for: the cluster's answer can only bring news
/// (a removal, a changed peer URL, a request) that etcd or the sidecar also learn once
/// etcd runs, so a silent peer costs at most this.
const CLUSTER_DEADLINE_VOUCHED: Duration = Duration::from_millis(30);
/// A start on vouched data that the cluster did not answer for, this recent, may be a
/// crash loop (etcd exits when it learns it was removed): the next round waits the full
/// deadline, so a slow cluster's answer is heard.
const UNANSWERED_START_RECENT_SECS: u64 = 120;
const REPORT_TIMEOUT: Duration = Duration::from_millis(1500);
/// This pod's own sidecar answers from the same node: a hung one costs no more than this.
const OWN_REPORT_TIMEOUT: Duration = Duration::from_millis(200);
/// Ordinals beyond the initial size that are looked up, to notice pods of a scaled-up set.
const EXTRA_ORDINALS: u32 = 2;

/// What the observer knows of this pod: who it is, the set's initial size, its volume,
/// and which snapshot a new cluster restores (`--restore`, when backups are configured).
#[derive(Debug, Clone)]
pub struct Pod {
    pub identity: Identity,
    pub replicas: u32,
    pub data_dir: std::path::PathBuf,
    pub restore: Option<RestoreChoice>,
}

pub struct Observer<D, C, R> {
    /// This pod, as the observer needs to know it.
    pub pod: Pod,
    pub dns: D,
    pub connector: C,
    pub reports: R,
    /// The backup store, when a new cluster may restore from it (`--backup-url`, and
    /// `--restore` not `never`).
    pub store: Option<Store>,
    /// Whether this look is init's, about to start etcd on this volume. Only then may a
    /// volume the cluster vouched for cut the wait for silent peers short: `status`,
    /// `recover` and the sidecar's recovery look give every peer the full deadline.
    pub starting: bool,
}

impl<D, C, R> Observer<D, C, R>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
    R: PeerReports + Clone + 'static,
{
    /// The ordinals of the other pods worth asking.
    fn peer_ordinals(&self) -> Vec<u32> {
        let me = self.pod.identity.ordinal;
        let top = self.pod.replicas.max(me + 1) + EXTRA_ORDINALS;
        (0..top).filter(|o| *o != me).collect()
    }

    pub async fn observe(&self, fresh_nonce: String) -> Result<Facts, VolumeError> {
        let cfg = &self.pod;
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

        // With data, this pod's own sidecar says when it last saw the cluster list this
        // member, and may hold a recovery request naming it. It is local: asked first.
        let own_report = match (data.has_data(), own_dns.first()) {
            (true, Some(ip)) => self
                .reports
                .report(&id.name(), &id.host(id.ordinal), ip, OWN_REPORT_TIMEOUT)
                .await
                .ok(),
            _ => None,
        };
        let deadline = match (self.starting, data.has_data()) {
            // An unreadable journal is named in `data.unreadable_markers` (init waits on
            // it); here it vouches for nothing, which only lengthens the deadline.
            (true, has_data) => cluster_deadline(
                has_data,
                &volume::journal::read(&cfg.data_dir).unwrap_or_default(),
                own_report.as_ref(),
                data.wal_identity(),
                &id.peer_url(id.ordinal),
                crate::clock::unix_now(),
            ),
            (false, true) => CLUSTER_DEADLINE_WITH_DATA,
            (false, false) => CLUSTER_DEADLINE_EMPTY,
        };
        if deadline == CLUSTER_DEADLINE_VOUCHED {
            tracing::info!(deadline = ?deadline, "the cluster vouched for this volume before: peers that do not answer within the deadline are not waited for");
        }
        let cluster = self.cluster_view(&peers, deadline);
        // With data the reports only tell whether this volume is the odd one out, and must
        // not hold up a restart longer than the cluster may.
        let report_timeout = if data.has_data() {
            deadline
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
                // Only init starts etcd: only its look asks the peers' releases.
                let ask_version = self.starting;
                set.spawn(async move {
                    let (report, version) = match lookup.first() {
                        Some(ip) => {
                            let version = async {
                                match ask_version {
                                    true => reports.version(&name, &host, ip, deadline).await.ok(),
                                    false => None,
                                }
                            };
                            let (r, v) = tokio::join!(
                                reports.report(&name, &host, ip, report_timeout),
                                version
                            );
                            (Some(r), v)
                        }
                        None => (None, None),
                    };
                    (
                        PeerFacts {
                            ordinal: o,
                            name,
                            dns: lookup,
                            report,
                        },
                        version,
                    )
                });
            }
            let mut all = set.join_all().await;
            all.sort_by_key(|(p, _)| p.ordinal);
            all
        };
        let (cluster, answers) = tokio::join!(cluster, reports);
        let mut versions = VersionFacts::default();
        let mut peer_facts = Vec::with_capacity(answers.len());
        for (p, v) in answers {
            peer_facts.push(p);
            versions.peers.extend(v);
        }
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
            rebuild_request: own_report.as_ref().and_then(|r| r.rebuild_request.clone()),
            versions,
        })
    }

    /// What the backup store offers: asked only when a new cluster may have to be formed
    /// (this volume empty, no cluster answering, or a restore request pending), as the list
    /// costs a request per snapshot.
    async fn backups(&self, may_form: bool, restore: Option<&RestoreRequest>) -> BackupFacts {
        let (Some(store), Some(restore_choice)) = (&self.store, &self.pod.restore) else {
            return BackupFacts::Off;
        };
        // An operator's restore request names the snapshot, whatever --restore says.
        let wanted = match (restore, restore_choice) {
            (Some(r), _) => RestoreWanted::Named(r.snapshot.clone()),
            (None, RestoreChoice::Never) => return BackupFacts::Off,
            (None, RestoreChoice::Latest) => RestoreWanted::Latest,
            (None, RestoreChoice::Named(name)) => RestoreWanted::Named(name.clone()),
            (None, RestoreChoice::Revision(n)) => RestoreWanted::Revision(*n),
            (None, RestoreChoice::Time(ms)) => RestoreWanted::Time(*ms),
        };
        if !may_form {
            return BackupFacts::NotAsked;
        }
        list_backups(store, wanted).await
    }

    /// Asks every resolved peer's etcd at once; the first voter that sees a leader and
    /// serves a linearizable read gives the view.
    async fn cluster_view(&self, peers: &[(u32, Lookup)], deadline: Duration) -> ClusterFacts {
        let id = &self.pod.identity;
        let mut tried = Vec::new();
        let mut set = JoinSet::new();
        for (o, lookup) in peers {
            let host = id.host(*o);
            let Some(ip) = lookup.first() else {
                if *o < self.pod.replicas {
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

/// How long this round waits for the cluster (and, with data, for the peers' reports).
///
/// Without data: long, as a join or a formation rests on the answers. With data: 500 ms,
/// enough for a slow but live cluster to say that this member was removed or that the
/// volume belongs to another cluster. Only 30 ms when the cluster vouched for this very
/// volume (member, cluster, peer URL), in `init`'s journal or through this pod's sidecar,
/// unless the last start came after that vouch, went unanswered, and was under two minutes
/// ago (a crash loop: etcd exits when its peers tell it it was removed, and a slow
/// cluster's answer must then be heard). A vouched volume is no stranger, and the news a
/// late answer could bring is learned again once etcd runs. While the sidecar holds an
/// operator's recovery or restore request, every round hears the cluster out.
pub fn cluster_deadline(
    has_data: bool,
    journal: &[volume::journal::Entry],
    own_report: Option<&PeerReport>,
    wal: Option<crate::facts::WalIdentity>,
    peer_url: &str,
    now: u64,
) -> Duration {
    if !has_data {
        return CLUSTER_DEADLINE_EMPTY;
    }
    let request_held = own_report.is_some_and(|r| {
        r.recovery_request.is_some() || r.restore_request.is_some() || r.rebuild_request.is_some()
    });
    let sidecar_vouch = own_report.and_then(|r| r.vouch.as_ref());
    let (Some(wal), false) = (wal, request_held) else {
        return CLUSTER_DEADLINE_WITH_DATA;
    };
    let newest = journal
        .iter()
        .filter_map(|e| e.vouch.as_ref())
        .chain(sidecar_vouch)
        .max_by_key(|v| v.ts);
    let Some(vouch) = newest.filter(|v| {
        v.member_id == wal.member_id && v.cluster_id == wal.cluster_id && v.peer_url == peer_url
    }) else {
        return CLUSTER_DEADLINE_WITH_DATA;
    };
    let crash_loop = journal.last().is_some_and(|last| {
        last.vouch.is_none()
            && last.ts > vouch.ts
            && now.saturating_sub(last.ts) < UNANSWERED_START_RECENT_SECS
    });
    if crash_loop {
        CLUSTER_DEADLINE_WITH_DATA
    } else {
        CLUSTER_DEADLINE_VOUCHED
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

#[cfg(test)]
mod tests;
