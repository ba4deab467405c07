//! This pod's check of a control request before it is held, and so before its etcd is
//! stopped for it (see [`super::http::control`]):
//! - a restore: the snapshot must be listed in the store, verified, not failed by its
//!   drill, and not rejected by this pod (the same choice `init` makes,
//!   [`crate::decision::snapshot_choice`]); the store's listing is reused for a few
//!   seconds, so a flood of requests costs one listing;
//! - a recovery: the survivor and every pod declared lost must be pods of this set; in the
//!   survivor's own pod (the only one that stops anything) the plan this pod makes from its
//!   own observations, as `recover` does, must name the same survivor and ID;
//! - a rebuild (this member's data diverged): this pod's etcd must be the member the
//!   request names and see a leader, no learner may be joining (one member at a time), the
//!   proof must stand against the member list now ([`crate::facts::rebuild::proves`]), and
//!   this member's own `HashKV` at the proof's revision must still differ from the
//!   majority's ([`crate::facts::rebuild::confirmed`]), and every member the proof counts as
//!   the majority must answer the majority's hash again, asked from here
//!   ([`crate::facts::rebuild::reasked`]): a request is never taken on its word.

use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use crate::backup::store::Store;
use crate::config::Config;
use crate::decision::Why;
use crate::dns::Dns;
use crate::etcd::{Connector, Etcd};
use crate::facts::rebuild::{confirmed, proves, reasked, RebuildRequest};
use crate::facts::{BackupFacts, RecoveryRequest, RestoreRequest, RestoreWanted};
use crate::observe::{list_backups, HttpReports, Observer};
use crate::sidecar::conn::hash_kv_at;
use crate::sidecar::http::control::CheckRequests;
use crate::volume;

/// How long a listing of the store answers restore requests.
const LISTING_TTL: Duration = Duration::from_secs(5);

/// The real checks: this pod's observer and store.
pub struct Checks<D, C> {
    obs: Observer<D, C, HttpReports>,
    store: Option<Store>,
    listing: tokio::sync::Mutex<Option<(Instant, BackupFacts)>>,
    /// Where this pod's etcd answers (the rebuild's own look).
    local_ip: std::net::IpAddr,
}

impl<D, C> Checks<D, C>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    pub fn new(cfg: &Config, dns: D, connector: C) -> Self {
        let store = cfg.backup.as_ref().and_then(|b| match Store::open(&b.url) {
            Ok(s) => Some(s.with_keys(b.keys.clone())),
            Err(e) => {
                tracing::warn!(error = %e, "the backup store cannot be opened: restore requests are refused");
                None
            }
        });
        Checks {
            obs: cfg.observer(dns, connector),
            store,
            listing: tokio::sync::Mutex::new(None),
            local_ip: cfg.local_ip(),
        }
    }

    async fn check_restore(&self, r: &RestoreRequest) -> Result<(), String> {
        let Some(store) = &self.store else {
            return Err(format!(
                "this pod has no backup store (--backup-url) to find snapshot {} in",
                r.snapshot
            ));
        };
        let listed = {
            let mut cached = self.listing.lock().await;
            match cached.as_ref() {
                Some((at, facts)) if at.elapsed() < LISTING_TTL => facts.clone(),
                _ => {
                    let facts = list_backups(store, RestoreWanted::Latest).await;
                    *cached = Some((Instant::now(), facts.clone()));
                    facts
                }
            }
        };
        let listed = match listed {
            BackupFacts::Listed {
                snapshots, keys, ..
            } => BackupFacts::Listed {
                wanted: RestoreWanted::Named(r.snapshot.clone()),
                snapshots,
                keys,
            },
            other => other,
        };
        let rejected = volume::marker::rejected_snapshots(&self.obs.pod.data_dir)
            .map_err(|e| format!("cannot read the list of rejected snapshots {e}"))?;
        match crate::decision::snapshot_choice(&listed, &rejected) {
            Ok(Some(name)) if name == r.snapshot => Ok(()),
            Ok(_) => Err(format!("snapshot {} is not in the store", r.snapshot)),
            Err(Why::NamedBackupUnusable { name, problem }) => {
                Err(format!("snapshot {name} {problem}"))
            }
            Err(Why::BackupStoreUnreachable { error }) => {
                Err(format!("the backup store does not answer: {error}"))
            }
            Err(why) => Err(why.to_string()),
        }
    }

    async fn check_recovery(&self, r: &RecoveryRequest) -> Result<(), String> {
        let id = &self.obs.pod.identity;
        for pod in std::iter::once(&r.survivor).chain(&r.force_lost) {
            if id.ordinal_of_name(pod).is_none() {
                return Err(format!("{pod:?} is not a pod of this set"));
            }
        }
        if r.survivor != id.name() {
            // Held and shown in the report only: nothing is stopped here for it.
            return Ok(());
        }
        let mut f = self
            .obs
            .observe(String::new())
            .await
            .map_err(|e| format!("this pod cannot observe: {e}"))?;
        if f.data.has_data() {
            f.data.tail = volume::log_tail(&self.obs.pod.data_dir)
                .map_err(|e| format!("this volume's WAL tail cannot be read: {e}"))?;
        }
        if f.data.recovery.as_ref().is_some_and(|m| m.id == r.id) {
            // init has acted on it already: nothing more is stopped for it.
            return Ok(());
        }
        let under_way = crate::recovery::recorded(&f);
        let pending = under_way
            .as_ref()
            .filter(|(_, applied, _)| !applied)
            .map(|(id, _, _)| id.as_str());
        match crate::recovery::plan(&f, &r.force_lost, pending) {
            Ok(p) if p.survivor == r.survivor && p.id == r.id => Ok(()),
            Ok(p) => Err(format!(
                "this pod's own observations make plan {} with survivor {}, not {} with {}",
                p.id, p.survivor, r.id, r.survivor
            )),
            Err(refusal) => Err(format!("this pod's own observations refuse it: {refusal}")),
        }
    }
}

impl<D, C> Checks<D, C>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    async fn check_rebuild(&self, r: &RebuildRequest) -> Result<(), String> {
        let id = &self.obs.pod.identity;
        let local = self
            .obs
            .connector
            .connect(&id.host(id.ordinal), self.local_ip, id.client_port)
            .await
            .map_err(|e| format!("this pod's etcd does not answer: {e}"))?;
        let status = local
            .status()
            .await
            .map_err(|e| format!("this pod's etcd does not answer: {e}"))?;
        if status.member_id != r.member {
            return Err(format!(
                "this pod's member is {:x}, not {:x}",
                status.member_id, r.member
            ));
        }
        if status.leader == 0 {
            return Err("this pod's etcd sees no leader: nothing is rebuilt without quorum".into());
        }
        let (_, members) = local
            .members()
            .await
            .map_err(|e| format!("this pod's etcd does not list the members: {e}"))?;
        if members.iter().any(|m| m.is_learner) {
            return Err("a learner is joining: one member is rebuilt at a time".into());
        }
        let voters: Vec<u64> = members.iter().map(|m| m.id).collect();
        let d = proves(r, &voters)?;
        let own = local.hash_kv(d.revision).await.map_err(|e| e.to_string());
        confirmed(d, own)?;
        let mut again = Vec::new();
        for id in &d.agreeing {
            let url = members
                .iter()
                .find(|m| m.id == *id)
                .and_then(|m| m.client_urls.first().cloned());
            again.push((
                *id,
                hash_kv_at(
                    &self.obs.dns,
                    &self.obs.connector,
                    url.as_deref(),
                    d.revision,
                )
                .await,
            ));
        }
        reasked(d, &again)
    }
}

impl<D, C> CheckRequests for Checks<D, C>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    fn recovery<'a>(&'a self, request: &'a RecoveryRequest) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.check_recovery(request))
    }

    fn restore<'a>(&'a self, request: &'a RestoreRequest) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.check_restore(request))
    }

    fn rebuild<'a>(&'a self, request: &'a RebuildRequest) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.check_rebuild(request))
    }
}
