//! The sidecar's part in a recovery from the freshest surviving volume
//! (`etcd-steward recover --yes`):
//! - it holds the operator's request (`POST /peer/recovery`) until the request expires, and
//!   shows it in the peer report, where every pod's `init` reads it;
//! - it serves how far its volume's log goes (the WAL's tail), the evidence the plan
//!   compares;
//! - in the survivor's pod, it stops etcd once, so that the container restarts and `init`
//!   starts etcd again as a one-member cluster. etcd runs in the other container of the pod:
//!   the sidecar sees its process when the pod shares its process namespace
//!   (`shareProcessNamespace: true`, as the manifests set); otherwise it says so, and
//!   deleting the survivor's pod does the same.
//!
//! [`must_stop_etcd`] is the pure decision; the rest is I/O.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::clock::unix_now;
use crate::control::REQUEST_TTL;
use crate::exec::find_etcd;
use crate::facts::{RecoveryMarker, RecoveryRequest, WalTail};

/// Between two looks for an etcd process that was not visible.
const STOP_COOLDOWN: Duration = Duration::from_secs(20);
/// How often `--auto-recover-after` looks.
const AUTO_LOOK: Duration = Duration::from_secs(2);
/// How long a read of the WAL's tail is reused for reports.
const TAIL_TTL: Duration = Duration::from_secs(2);

/// A request an operator's command hands every sidecar, held until it expires.
pub trait Expiring: Clone + PartialEq + std::fmt::Debug {
    fn id(&self) -> &str;
    fn expires_unix(&self) -> u64;
    fn set_expires_unix(&mut self, at: u64);
}

impl Expiring for RecoveryRequest {
    fn id(&self) -> &str {
        &self.id
    }
    fn expires_unix(&self) -> u64 {
        self.expires_unix
    }
    fn set_expires_unix(&mut self, at: u64) {
        self.expires_unix = at;
    }
}

impl Expiring for crate::facts::RestoreRequest {
    fn id(&self) -> &str {
        &self.id
    }
    fn expires_unix(&self) -> u64 {
        self.expires_unix
    }
    fn set_expires_unix(&mut self, at: u64) {
        self.expires_unix = at;
    }
}

/// The request this sidecar holds.
pub struct Inbox<T> {
    held: Mutex<Option<T>>,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox {
            held: Mutex::new(None),
        }
    }
}

/// What [`Inbox::take`] did with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// Now held.
    Held,
    /// The same request ID was already held: kept as it was (its expiry counts from its
    /// first receipt).
    AlreadyHeld,
    /// Another request (this ID) is held: refused.
    Conflict(String),
}

impl<T: Expiring> Inbox<T> {
    /// Takes a request (a newer one replaces the one held). For the sidecar's own
    /// `--auto-recover-after`, which offers only while nothing is held.
    pub fn offer(&self, request: T) {
        if let Ok(mut held) = self.held.lock() {
            if held.as_ref() != Some(&request) {
                tracing::warn!(request = ?request, "request from an operator's command held until it expires");
            }
            *held = Some(request);
        }
    }

    /// Takes an operator's request unless another one is held: one request at a time, and
    /// the same request handed again is not renewed.
    pub fn take(&self, request: T) -> Taken {
        let now = unix_now();
        let Ok(mut held) = self.held.lock() else {
            return Taken::Conflict("(unreadable)".into());
        };
        match held.as_ref().filter(|h| h.expires_unix() > now) {
            Some(h) if h.id() == request.id() => Taken::AlreadyHeld,
            Some(h) => Taken::Conflict(h.id().to_string()),
            None => {
                tracing::warn!(request = ?request, "request from an operator's command held until it expires");
                *held = Some(request);
                Taken::Held
            }
        }
    }

    /// The ID of the request held, unless it has expired.
    pub fn held_id(&self) -> Option<String> {
        self.current().map(|r| r.id().to_string())
    }

    /// The request held, unless it has expired.
    pub fn current(&self) -> Option<T> {
        let now = unix_now();
        self.held
            .lock()
            .ok()?
            .clone()
            .filter(|r| r.expires_unix() > now)
    }
}

/// The WAL's tail, read at most every [`TAIL_TTL`] (a report may be asked for often).
pub struct TailCache {
    dir: PathBuf,
    cached: Mutex<Option<(Instant, Option<WalTail>)>>,
}

impl TailCache {
    pub fn new(dir: &Path) -> Self {
        TailCache {
            dir: dir.to_path_buf(),
            cached: Mutex::new(None),
        }
    }

    pub async fn get(&self) -> Option<WalTail> {
        if let Ok(cached) = self.cached.lock() {
            if let Some((at, tail)) = *cached {
                if at.elapsed() < TAIL_TTL {
                    return tail;
                }
            }
        }
        let dir = self.dir.clone();
        let tail = tokio::task::spawn_blocking(move || crate::volume::log_tail(&dir))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        if let Ok(mut cached) = self.cached.lock() {
            *cached = Some((Instant::now(), tail));
        }
        tail
    }
}

/// Pure: the recovery whose forced start this pod's etcd must be stopped for — this pod
/// is the request's survivor and its volume has no marker of that recovery yet (once
/// `init` wrote it, the restart has happened).
pub fn must_stop_etcd<'a>(
    me: &str,
    request: Option<&'a RecoveryRequest>,
    marker: Option<&RecoveryMarker>,
) -> Option<&'a RecoveryRequest> {
    let request = request?;
    (request.survivor == me && marker.map(|m| m.id.as_str()) != Some(request.id.as_str()))
        .then_some(request)
}

/// What stopping etcd came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM sent to this pid.
    Signalled(i32),
    /// Not attempted: the last attempt was too recent.
    CoolingDown,
    /// Not attempted: etcd was already stopped once for this request; `init` decides from
    /// there (it may find the request unfounded and start etcd again).
    Done,
    /// No etcd process for this volume is visible (not running, or not in this
    /// process namespace).
    NotVisible,
    Failed(String),
}

/// Stops this pod's etcd for a request: at most once per request ID, and looks for the
/// process at most once per [`STOP_COOLDOWN`].
pub struct Stopper {
    data_dir: PathBuf,
    cooldown: Duration,
    last: Option<Instant>,
    signalled_for: Option<String>,
}

impl Stopper {
    pub fn new(data_dir: &Path) -> Self {
        Stopper::with_cooldown(data_dir, STOP_COOLDOWN)
    }

    /// As [`Stopper::new`], looking for etcd again only after `cooldown`.
    pub fn with_cooldown(data_dir: &Path, cooldown: Duration) -> Self {
        Stopper {
            data_dir: data_dir.to_path_buf(),
            cooldown,
            last: None,
            signalled_for: None,
        }
    }

    /// Stops etcd for request `id`, at most once per request: after a signal went out,
    /// `init` decides (it may rightly start etcd again on its data: a recovery it does not
    /// agree with, a snapshot unusable from here). Only a look that found no etcd is
    /// repeated, after [`STOP_COOLDOWN`].
    pub fn stop(&mut self, id: &str) -> Stop {
        if self.signalled_for.as_deref() == Some(id) {
            return Stop::Done;
        }
        if self.last.is_some_and(|t| t.elapsed() < self.cooldown) {
            return Stop::CoolingDown;
        }
        self.last = Some(Instant::now());
        let Some(pid) = find_etcd(&self.data_dir) else {
            return Stop::NotVisible;
        };
        let Some(p) = rustix::process::Pid::from_raw(pid) else {
            return Stop::Failed(format!("{pid} is not a pid"));
        };
        match rustix::process::kill_process(p, rustix::process::Signal::TERM) {
            Ok(()) => {
                self.signalled_for = Some(id.to_string());
                Stop::Signalled(pid)
            }
            Err(e) => Stop::Failed(format!("SIGTERM to etcd (pid {pid}): {e}")),
        }
    }
}

/// `--auto-recover-after`: looks every [`AUTO_LOOK`] as `init` does (every pod's report,
/// the cluster, this volume); when [`crate::recovery::automatic`] holds without a break
/// for `after`, hands this sidecar the request `recover --yes` would have handed it. The
/// rest is the same path as an operator's request.
pub async fn auto_recover<D, C>(
    cfg: crate::config::Config,
    dns: D,
    connector: C,
    inbox: std::sync::Arc<Inbox<RecoveryRequest>>,
    after: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    D: crate::dns::Dns + Clone + 'static,
    C: crate::etcd::Connector + Clone + 'static,
{
    let obs = cfg.observer(dns, connector);
    let me = obs.pod.identity.name();
    let mut since: Option<Instant> = None;
    let mut said = String::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(AUTO_LOOK) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if inbox.current().is_some() {
            continue;
        }
        let Ok(mut f) = obs.observe(String::new()).await else {
            since = None;
            continue;
        };
        if !f.data.has_data() {
            since = None;
            continue;
        }
        f.data.tail = crate::volume::log_tail(&obs.pod.data_dir).ok().flatten();
        match crate::recovery::automatic(&f) {
            Ok(plan) => {
                let first = *since.get_or_insert_with(Instant::now);
                if first.elapsed() >= after {
                    tracing::warn!(recovery = %plan.id, why = %plan.why, after = ?after, "auto-recover: a majority of the initial pods has answered with empty volumes for --auto-recover-after and this volume is the freshest: recovering from it");
                    inbox.offer(RecoveryRequest {
                        id: plan.id,
                        survivor: me.clone(),
                        force_lost: vec![],
                        expires_unix: unix_now() + REQUEST_TTL.as_secs(),
                    });
                    since = None;
                } else if said != plan.id {
                    tracing::warn!(recovery = %plan.id, why = %plan.why, after = ?after, "auto-recover: the loss is proven; recovering if it stays so for --auto-recover-after");
                    said = plan.id;
                }
            }
            Err(why) => {
                if since.is_some() {
                    tracing::info!(why = %why, "auto-recover: the proof of loss no longer holds; waiting again");
                }
                since = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(survivor: &str) -> RecoveryRequest {
        RecoveryRequest {
            id: "r1".into(),
            survivor: survivor.into(),
            force_lost: vec![],
            expires_unix: u64::MAX,
        }
    }

    #[test]
    fn only_the_survivor_stops_its_etcd_and_only_before_init_marked_the_recovery() {
        let r = request("etcd-1");
        assert_eq!(must_stop_etcd("etcd-1", Some(&r), None), Some(&r));
        assert_eq!(must_stop_etcd("etcd-0", Some(&r), None), None);
        assert_eq!(must_stop_etcd("etcd-1", None, None), None);
        let done = RecoveryMarker {
            id: "r1".into(),
            commit: 9,
        };
        assert_eq!(must_stop_etcd("etcd-1", Some(&r), Some(&done)), None);
        let earlier = RecoveryMarker {
            id: "r0".into(),
            commit: 3,
        };
        assert_eq!(must_stop_etcd("etcd-1", Some(&r), Some(&earlier)), Some(&r));
    }

    #[test]
    fn an_expired_request_is_no_longer_held() {
        let inbox = Inbox::<RecoveryRequest>::default();
        let mut r = request("etcd-0");
        r.expires_unix = 1;
        inbox.offer(r.clone());
        assert_eq!(inbox.current(), None);
        r.expires_unix = u64::MAX;
        inbox.offer(r.clone());
        assert_eq!(inbox.current(), Some(r));
    }
}
