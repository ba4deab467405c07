//! `sidecar`: binds its HTTP port (failing start-up if it is taken), then runs one loop:
//! observe once per tick → the health verdict and the pure planners (promotion, stalled
//! learners, backups, …), each returning the steps it intends → one executor that performs
//! them (a backup round in its own task, reported back through a later observation).
//! Stops cleanly on SIGTERM.

pub mod checks;
pub mod conn;
pub mod execute;
pub mod gather;
pub mod health;
pub mod http;
pub mod init_events;
pub mod plan;
pub mod rebuild;
pub mod recovery;
pub mod refused;

/// The hardened listener, where it was before `http/` (tests/peer_evidence.rs uses it).
pub use http::server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use thiserror::Error;
use tokio::sync::watch;

use crate::config::Config;
use crate::dns::Dns;
use crate::etcd::Connector;
use conn::Connections;
use execute::archive::ArchiveRounds;
use execute::backup::BackupRounds;
pub use execute::scale_in::ScaleInDuty;
use execute::Jobs;
use gather::{HttpPeerProbe, Journal, Observation, PeerProbe};
use health::{assess, Health};
use http::metrics::{CertificateMetrics, HealthMetrics, InitMetrics, VolumeMetrics};
use http::AppState;
use plan::{Outcome, Planner, Step};
pub use recovery::RecoveryDuty;

/// How often the loop looks: once a second while this member is ready; ten times a second
/// while it is not (etcd starting, or waiting for its peers), so `/ready` turns 200 within
/// 100 ms of etcd serving; four times a second while it is a learner, and again 100 ms
/// after a promotion (the member is ready as a voter at once).
pub const TICK: Duration = Duration::from_secs(1);
pub const FAST_TICK: Duration = Duration::from_millis(100);
pub const LEARNER_TICK: Duration = Duration::from_millis(250);

#[derive(Debug, Error)]
pub enum SidecarError {
    #[error("cannot listen on {addr}: {source}; is another process using --{option}?")]
    Bind {
        addr: SocketAddr,
        option: &'static str,
        source: std::io::Error,
    },
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// The loop's state: connections, planners, and what it publishes.
pub struct Sidecar<D, C: Connector, P> {
    conn: Connections<D, C>,
    probe: P,
    journal: Journal,
    own_peer_url: String,
    planners: Vec<Box<dyn Planner>>,
    /// The jobs whose I/O runs beside the loop (backup rounds, scale-in's watcher).
    pub jobs: Jobs,
    /// The last tick's outcomes, which the next observation carries.
    previous: Vec<Outcome>,
    health: watch::Sender<Health>,
    /// The last time the cluster was seen to list this member (kept while etcd is down).
    vouch: watch::Sender<Option<crate::facts::Vouch>>,
    health_metrics: HealthMetrics,
    init_metrics: InitMetrics,
    volume_metrics: VolumeMetrics,
    /// The client and peer TLS material (each tick looks at their files, so a rotation is
    /// loaded, or a bad file logged, within a tick) and their expiry.
    tls: Vec<crate::tls::TlsMaterial>,
    certificate_metrics: CertificateMetrics,
    /// The recovery request this pod holds, and what to do for it.
    pub recovery: Option<RecoveryDuty>,
    /// The rebuild of this pod's member (its data diverged), when the leader asked for it.
    pub rebuild: rebuild::RebuildDuty,
    /// This pod's data judged while its etcd does not start (with the corruption check and
    /// backups' restore tool and scratch space).
    refused: Option<refused::RefusedLook<D, C>>,
    /// What `init` did and waits for, posted as Kubernetes Events on this pod.
    init_events: init_events::InitEvents,
}

impl<D, C, P> Sidecar<D, C, P>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
    P: PeerProbe,
{
    /// Sets the loop up and registers every metric in `registry`.
    pub fn new(cfg: &Config, dns: D, connector: C, probe: P, registry: &mut Registry) -> Self {
        let id = &cfg.identity;
        let events = events(cfg, registry);
        let corruption = cfg.corruption_check.map(|_| {
            let ask = execute::corruption::asker(dns.clone(), connector.clone());
            let mut checks = execute::corruption::HashChecks::new(ask, registry);
            checks.events = events.clone();
            checks
        });
        let mut rebuild = rebuild::RebuildDuty::new(&cfg.data_dir, registry);
        rebuild.events = events.clone();
        if cfg.corruption_check.is_some() && cfg.backup.is_none() {
            tracing::info!("a member whose etcd refuses to start on data that differs from its peers' is not judged while it is down without --backup-url (its restore tool and scratch space hash the data offline); it is judged at once if it starts again");
        }
        let refused = cfg.corruption_check.map(|_| {
            refused::RefusedLook::new(cfg, dns.clone(), connector.clone(), rebuild.inbox.clone())
        });
        Sidecar {
            conn: Connections::new(id.clone(), cfg.local_ip(), cfg.replicas, dns, connector),
            probe,
            journal: Journal::new(&cfg.data_dir),
            own_peer_url: id.peer_url(id.ordinal),
            planners: planners(cfg, registry),
            jobs: Jobs {
                backups: BackupRounds::new(cfg, registry).map(|mut b| {
                    b.events = events.clone();
                    b
                }),
                archive: ArchiveRounds::new(cfg, registry),
                scale_in: None,
                auto_recover: None,
                events: events.clone(),
                rebuild: corruption
                    .as_ref()
                    .map(|_| execute::rebuild::Teller::new(cfg)),
                corruption,
                certificates: cfg.issuing.clone(),
            },
            previous: Vec::new(),
            health: watch::channel(Health::starting()).0,
            vouch: watch::channel(None).0,
            health_metrics: HealthMetrics::register(registry),
            init_metrics: InitMetrics::register(registry),
            volume_metrics: VolumeMetrics::register(registry),
            tls: cfg.etcd.tls.iter().chain(&cfg.peer_tls).cloned().collect(),
            certificate_metrics: CertificateMetrics::register(registry),
            recovery: None,
            rebuild,
            refused,
            init_events: init_events::InitEvents::new(
                events,
                &id.name(),
                &cfg.data_dir,
                crate::clock::unix_now(),
            ),
        }
    }

    /// The health verdicts as the loop publishes them.
    pub fn health(&self) -> watch::Receiver<Health> {
        self.health.subscribe()
    }

    /// The cluster's last word for this member, as the loop publishes it.
    pub fn vouch(&self) -> watch::Receiver<Option<crate::facts::Vouch>> {
        self.vouch.subscribe()
    }

    /// One round: observe, assess, plan, execute. Returns how long to wait before the next.
    pub async fn tick(&mut self) -> Duration {
        for material in &self.tls {
            self.certificate_metrics.set(&material.expiry());
        }
        self.certificate_metrics.set_refused(
            self.tls
                .iter()
                .map(crate::tls::TlsMaterial::refused_reloads)
                .sum(),
        );
        let mut seen = gather::observe(
            &mut self.conn,
            &self.probe,
            &mut self.journal,
            &self.own_peer_url,
        )
        .await;
        seen.previous = std::mem::take(&mut self.previous);
        if self.planners.iter().any(|p| p.wants_peers(&seen)) {
            let me = seen.local.status.as_ref().map(|s| s.member_id).unwrap_or(0);
            seen.peers = gather::peer_statuses(&mut self.conn, me, seen.members.as_deref()).await;
        }
        self.jobs.gather(&mut self.conn, &mut seen).await;
        let mut health = assess(&seen.local);
        let note = match health.etcd_running {
            false => crate::volume::marker::waiting(self.journal.data_dir()),
            true => None,
        };
        let waiting = health::waiting_shown(note, health.etcd_running, seen.journal.last_ts);
        if let Some(w) = &waiting {
            health.ready.reason = format!("init is waiting: {}; {}", w.reason, health.ready.reason);
        }
        self.init_events.look(
            crate::clock::unix_now(),
            health.etcd_running,
            waiting.as_ref(),
        );
        let me = seen.local.status.as_ref().map_or(0, |s| s.member_id);
        let judged = self.jobs.corruption.as_ref().and_then(|c| c.about(me));
        seen.diverged = judged.is_some_and(|c| {
            matches!(
                c.verdict.standing(me),
                crate::facts::hashes::Standing::Diverged { .. }
            )
        });
        if let Some(reason) = health::diverged(judged, me) {
            health.ready = health::Check {
                ok: false,
                reason: format!("{reason}; {}", health.ready.reason),
            };
        }
        let serving = seen
            .local
            .status
            .as_ref()
            .ok()
            .map(|s| (s.member_id, s.is_learner));
        if let Some(look) = &mut self.refused {
            look.tick(serving, seen.now).await;
        }
        if let Some(text) = self.rebuild.tick(serving) {
            health.ready = health::Check {
                ok: false,
                reason: format!("{text}; {}", health.ready.reason),
            };
        }
        if let Some(text) = self.recovery.as_mut().and_then(RecoveryDuty::tick) {
            if !health.ready.ok {
                health.ready.reason = format!("{text}; {}", health.ready.reason);
            }
        }
        self.publish(&seen, &health);
        let data_dir = self.journal.data_dir().to_path_buf();
        self.volume_metrics.update(&data_dir);
        let mut outcomes = Vec::new();
        for planner in &mut self.planners {
            for step in planner.plan(&seen) {
                let outcome =
                    execute::execute(&mut self.conn, &self.jobs, &self.health, step).await;
                planner.learned(&outcome, tokio::time::Instant::now());
                self.jobs.record(&outcome);
                outcomes.push(outcome);
            }
        }
        let pause = pause(&seen, &health, &outcomes);
        self.previous = outcomes;
        pause
    }

    fn publish(&self, seen: &Observation, health: &Health) {
        let before = self.health.borrow().clone();
        if before.ready != health.ready || before.live != health.live {
            tracing::info!(live = health.live.ok, ready = health.ready.ok, live_reason = %health.live.reason, ready_reason = %health.ready.reason, "health changed");
        }
        if let Some(v) = seen.vouch(crate::clock::unix_now()) {
            self.vouch.send_if_modified(|held| {
                // Refreshed at most once a minute: the time only says "etcd served since".
                let stale = held.as_ref().is_none_or(|h| {
                    (h.member_id, h.cluster_id, &h.peer_url) != (v.member_id, v.cluster_id, &v.peer_url)
                        || v.ts >= h.ts + 60
                });
                if held.is_none() {
                    tracing::info!(member_id = %format!("{:x}", v.member_id), cluster_id = %format!("{:x}", v.cluster_id), "the cluster lists this member: a restart of etcd here does not wait on peers that do not answer");
                }
                if stale {
                    *held = Some(v);
                }
                stale
            });
        }
        self.health_metrics.set(health);
        self.init_metrics.set(&seen.journal.counts);
        self.health.send_replace(health.clone());
    }
}

/// Every planner, in the order their steps run. Each registers its own metrics (the
/// backup rounds' are the executor's: [`execute::backup::BackupRounds::new`]).
/// Kubernetes Events on this pod, when they are on; their failures counted either way
/// (`etcd_steward_events_failed_total`).
fn events(cfg: &Config, registry: &mut Registry) -> crate::kube_api::events::Events {
    use crate::kube_api::events::{ApiEvents, Events};
    let failed = prometheus_client::metrics::counter::Counter::default();
    registry.register(
        "etcd_steward_events_failed",
        "Kubernetes Events not posted: refused or unanswered by the API, or dropped while it was slow",
        failed.clone(),
    );
    // Kept for `/peer/history` and counted whether or not they are posted.
    let acts = crate::kube_api::acts::Acts::register(registry);
    let (Some(regarding), Some(access)) = (&cfg.events, &cfg.kube) else {
        return Events::off().with_acts(acts);
    };
    match ApiEvents::new(access) {
        Ok(api) => Events::start(api, regarding.clone(), failed).with_acts(acts),
        Err(e) => {
            tracing::warn!(error = %e, "Kubernetes Events are off: the API client cannot be set up");
            Events::off().with_acts(acts)
        }
    }
}

pub fn planners(cfg: &Config, registry: &mut Registry) -> Vec<Box<dyn Planner>> {
    let mut planners: Vec<Box<dyn Planner>> = vec![
        Box::new(plan::promote::Promote::new(registry)),
        Box::new(plan::evict::Evict::new(cfg.learner_stall_timeout, registry)),
        Box::new(plan::peer_url::PeerUrl::default()),
    ];
    if let Some(interval) = cfg.scale_in {
        planners.push(Box::new(
            plan::scale_in::ScaleIn::new(cfg.identity.clone(), cfg.replicas, interval, registry)
                .guarded(cfg.backup.is_some()),
        ));
    }
    if let Some(b) = &cfg.backup {
        planners.push(Box::new(plan::backup::Backup::new(b.interval)));
        if let Some(every) = b.archive_interval {
            planners.push(Box::new(plan::archive::Archive::new(every)));
        }
    }
    if let Some(every) = cfg.corruption_check {
        planners.push(Box::new(plan::corruption::CorruptionCheck::new(every)));
        planners.push(Box::new(plan::rebuild::Rebuild::new(
            crate::control::REQUEST_TTL,
        )));
    }
    planners.push(Box::new(plan::defrag::Defrag::new(cfg.defrag, registry)));
    if let Some(after) = cfg.auto_recover_after {
        planners.push(Box::new(plan::auto_recover::AutoRecover::new(
            cfg.identity.name(),
            after,
        )));
    }
    if cfg.issuing.is_some() {
        planners.push(Box::new(plan::certificates::Certificates::default()));
    }
    planners
}

/// How long to wait after a round (see [`TICK`]).
pub fn pause(seen: &Observation, health: &Health, outcomes: &[Outcome]) -> Duration {
    let promoted = outcomes.iter().any(|o| {
        matches!(
            o,
            Outcome::Done(Step::Promote { .. }) | Outcome::Moot(Step::Promote { .. })
        )
    });
    match &seen.local.status {
        Err(_) => FAST_TICK,
        Ok(s) if s.is_learner && promoted => FAST_TICK,
        Ok(s) if s.is_learner => LEARNER_TICK,
        Ok(_) if health.ready.ok => TICK,
        Ok(_) => FAST_TICK,
    }
}

/// Runs the sidecar until SIGTERM (or `stop` turns true).
pub async fn run<D, C>(
    cfg: Config,
    dns: D,
    connector: C,
    mut stop: watch::Receiver<bool>,
) -> Result<(), SidecarError>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    let addr = SocketAddr::new(cfg.listen_ip, cfg.http_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| SidecarError::Bind {
            addr,
            option: "http-port",
            source,
        })?;
    let report_addr = SocketAddr::new(cfg.listen_ip, cfg.peer_report_port);
    let report_listener = tokio::net::TcpListener::bind(report_addr)
        .await
        .map_err(|source| SidecarError::Bind {
            addr: report_addr,
            option: "peer-report-port",
            source,
        })?;
    let mut registry = Registry::default();
    let control_auth =
        crate::control::ControlAuth::new(cfg.peer_tls.is_some(), cfg.control_token.as_ref());
    let control = http::control::Control::register(
        &mut registry,
        control_auth.clone(),
        Arc::new(checks::Checks::new(&cfg, dns.clone(), connector.clone())),
    );
    let probe = HttpPeerProbe {
        identity: cfg.identity.clone(),
        ip: cfg.local_ip(),
        peer_tls: cfg.peer_tls.clone(),
    };
    let auto = cfg
        .auto_recover_after
        .map(|after| (after, dns.clone(), connector.clone()));
    let mut sidecar = Sidecar::new(&cfg, dns, connector, probe, &mut registry);
    if let (Some(interval), Some(access)) = (cfg.scale_in, &cfg.kube) {
        // The planner finds members' ordinals by this pod's name and pods by the set's: a
        // StatefulSet names its pods <set>-<ordinal>, so another name would make running
        // pods look gone.
        let api = match access.statefulset == cfg.identity.set_name {
            true => crate::kube_api::ApiWorkload::new(access),
            false => Err(crate::kube_api::KubeError::Setup(format!(
                "--statefulset-name {:?} is not the set this pod belongs to ({:?})",
                access.statefulset, cfg.identity.set_name
            ))),
        };
        if let Err(e) = &api {
            tracing::error!(error = %e, "scale-in is off: the Kubernetes API client cannot be set up; members are removed only by hand");
        }
        if let Ok(api) = api {
            let (tx, answers) = watch::channel(None);
            let (leading, leading_rx) = watch::channel(false);
            tokio::spawn(execute::scale_in::watch_workload(
                api,
                access.statefulset.clone(),
                interval,
                tx,
                leading_rx,
                stop.clone(),
            ));
            sidecar.jobs.scale_in = Some(ScaleInDuty {
                answers,
                leading,
                identity: cfg.identity.clone(),
                initial: cfg.replicas,
                interval,
            });
            tracing::info!(api = %access.url, statefulset = %access.statefulset, "scale-in on: members of ordinals >= spec.replicas whose pods are gone are removed by the leader (only the leader's sidecar asks the API)");
        }
    }
    let mut state = AppState::new(
        sidecar.health(),
        Arc::new(registry),
        &cfg.identity.name(),
        &cfg.data_dir,
    );
    state.vouch = sidecar.vouch();
    state.rebuild = sidecar.rebuild.inbox.clone();
    state.acts = sidecar.jobs.events.acts().clone();
    if let (Some(checks), Some(every)) = (&mut sidecar.jobs.corruption, cfg.corruption_check) {
        state.hash_check = checks.known();
        checks.reader = Some(execute::corruption::LeaderReader::new(
            cfg.peer_reports(),
            cfg.identity.clone(),
            every,
        ));
    }
    // The planner (`plan::auto_recover`) waits out --auto-recover-after; the task only looks.
    if let Some((_after, dns, connector)) = auto {
        let (looks_tx, looks) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(recovery::auto_recover(
            cfg.clone(),
            dns,
            connector,
            state.recovery.clone(),
            looks_tx,
            stop.clone(),
        ));
        sidecar.jobs.auto_recover = Some(recovery::AutoRecoverDuty {
            looks,
            inbox: state.recovery.clone(),
        });
    }
    sidecar.recovery = Some(RecoveryDuty::new(
        state.recovery.clone(),
        state.restore.clone(),
        recovery::Stopper::new(&cfg.data_dir),
        cfg.identity.name(),
        cfg.data_dir.clone(),
    ));
    state.control = control;
    // The material, not a config: each handshake takes the files as they are then.
    let peer_tls = cfg.peer_tls.clone();
    let on = match (&control_auth, &peer_tls) {
        (crate::control::ControlAuth::Off, _) => "off (neither peer TLS nor --control-token-file)",
        (crate::control::ControlAuth::Token(_), Some(_)) => "mutual TLS and the control token",
        (crate::control::ControlAuth::Token(_), None) => "the control token",
        (crate::control::ControlAuth::MutualTls, _) => "mutual TLS",
    };
    tracing::info!(addr = %report_addr, tls = peer_tls.is_some(), control = on, "serving /peer/report and control requests");
    tokio::spawn(server::serve(
        report_listener,
        peer_tls.clone(),
        http::peer_router(state.clone()),
        server::Limits::default(),
        stop.clone(),
    ));
    // Neither control requests nor the peer report on the probe port, which the
    // NetworkPolicy opens to every namespace (kubelet, Prometheus).
    let app = http::router(state.clone());
    tracing::info!(%addr, pod = %cfg.identity.name(), "sidecar serving /healthz, /ready, /metrics");
    let server = tokio::spawn(server::serve(
        listener,
        None,
        app,
        server::Limits::default(),
        stop.clone(),
    ));
    loop {
        let pause = sidecar.tick().await;
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    tracing::info!("sidecar stopping");
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    Ok(())
}
