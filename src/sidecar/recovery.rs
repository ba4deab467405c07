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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::unix_now;
use crate::control::REQUEST_TTL;
use crate::exec::find_etcd;
use crate::facts::{RecoveryMarker, RecoveryRequest, WalTail};
pub use crate::sidecar::plan::observation::LossLook;

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

impl Expiring for crate::facts::rebuild::RebuildRequest {
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
                tracing::warn!(request = ?request, "control request held until it is done or expires");
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
                tracing::warn!(request = ?request, "control request held until it is done or expires");
                *held = Some(request);
                Taken::Held
            }
        }
    }

    /// Drops request `id` once it is done (another one held is kept).
    pub fn clear(&self, id: &str) {
        if let Ok(mut held) = self.held.lock() {
            if held.as_ref().is_some_and(|h| h.id() == id) {
                *held = None;
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

/// `--auto-recover-after`'s executor: the looks a task of its own takes, on their way to
/// the planner ([`crate::sidecar::plan::auto_recover`]), and the inbox its step hands the
/// request to.
pub struct AutoRecoverDuty {
    pub looks: tokio::sync::mpsc::UnboundedReceiver<LossLook>,
    pub inbox: std::sync::Arc<Inbox<RecoveryRequest>>,
}

impl AutoRecoverDuty {
    /// The looks taken since the last call, in order.
    pub fn looks(&mut self) -> Vec<LossLook> {
        let mut looks = Vec::new();
        while let Ok(look) = self.looks.try_recv() {
            looks.push(look);
        }
        looks
    }

    /// Hands this sidecar the request `recover --yes` would have handed it.
    pub fn offer(&self, id: &str, survivor: &str) {
        self.inbox.offer(RecoveryRequest {
            id: id.to_string(),
            survivor: survivor.to_string(),
            force_lost: vec![],
            expires_unix: unix_now() + REQUEST_TTL.as_secs(),
        });
    }
}

/// `--auto-recover-after`: looks every [`AUTO_LOOK`] as `init` does (every pod's report,
/// the cluster, this volume) while no request is held, and sends what
/// [`crate::recovery::automatic`] says of it to the loop, where the planner times it.
pub async fn auto_recover<D, C>(
    cfg: crate::config::Config,
    dns: D,
    connector: C,
    inbox: std::sync::Arc<Inbox<RecoveryRequest>>,
    looks: tokio::sync::mpsc::UnboundedSender<LossLook>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    D: crate::dns::Dns + Clone + 'static,
    C: crate::etcd::Connector + Clone + 'static,
{
    let obs = cfg.observer(dns, connector);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(AUTO_LOOK) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if inbox.current().is_some() {
            continue;
        }
        let look = match obs.observe(String::new()).await {
            Ok(f) if !f.data.has_data() => LossLook::Unknown,
            Ok(mut f) => {
                f.data.tail = crate::volume::log_tail(&obs.pod.data_dir).ok().flatten();
                match crate::recovery::automatic(&f) {
                    Ok(plan) => LossLook::Proven {
                        at: tokio::time::Instant::now(),
                        id: plan.id,
                        why: plan.why,
                    },
                    Err(why) => LossLook::NotProven { why },
                }
            }
            Err(_) => LossLook::Unknown,
        };
        if looks.send(look).is_err() {
            return;
        }
    }
}

/// The sidecar's share of a recovery (see the module's text): what the loop does each tick
/// for the request this pod holds.
pub struct RecoveryDuty {
    pub inbox: Arc<Inbox<crate::facts::RecoveryRequest>>,
    pub restore: Arc<Inbox<crate::facts::RestoreRequest>>,
    pub stopper: Stopper,
    pub me: String,
    pub data_dir: std::path::PathBuf,
    /// The last outcome logged, so that a state is logged once.
    reported: Option<String>,
}

impl RecoveryDuty {
    pub fn new(
        inbox: Arc<Inbox<crate::facts::RecoveryRequest>>,
        restore: Arc<Inbox<crate::facts::RestoreRequest>>,
        stopper: Stopper,
        me: String,
        data_dir: std::path::PathBuf,
    ) -> Self {
        RecoveryDuty {
            inbox,
            restore,
            stopper,
            me,
            data_dir,
            reported: None,
        }
    }

    /// Stops etcd when this pod is the survivor of a held request that `init` has not
    /// acted on; returns what `/ready` says meanwhile.
    pub fn tick(&mut self) -> Option<String> {
        match crate::volume::marker::left(&self.data_dir) {
            Ok(Some(l)) => {
                return Some(format!(
                    "this pod left the cluster (etcd-steward leave, member {:x}): it stays out until etcd-steward rejoin",
                    l.member_id
                ))
            }
            Ok(None) => {}
            Err(e) => {
                return Some(format!(
                    "the leave marker {e}: whether this pod left is unknown; init waits until it is repaired or moved away"
                ))
            }
        }
        if let Some(r) = self.restore.current() {
            return Some(self.restore_tick(&r));
        }
        let request = self.inbox.current()?;
        // A recovery marker that cannot be read is never "no marker": that would stop the
        // survivor's etcd again, and force a second new cluster. Nothing is stopped; init
        // waits on the same file.
        let marker = match crate::volume::marker::recovery(&self.data_dir) {
            Ok(marker) => marker,
            Err(e) => {
                let text = format!(
                    "recovery {}: cannot read the recovery marker {e}: whether init already forced this volume to a one-member cluster for it is unknown: etcd is not stopped for it, and init waits until the file is repaired or moved away",
                    request.id
                );
                self.report(&request.id, &text, true);
                return Some(text);
            }
        };
        let Some(r) = must_stop_etcd(&self.me, Some(&request), marker.as_ref()) else {
            return Some(match marker {
                Some(m) if m.id == request.id => format!(
                    "recovery {}: this pod's volume is the survivor; etcd was started as a one-member cluster on it",
                    request.id
                ),
                _ => format!(
                    "recovery {}: {} restarts as a one-member cluster from its volume; this pod then joins it as a new learner",
                    request.id, request.survivor
                ),
            });
        };
        let text = self.stop_etcd(&r.id, "this pod holds the freshest volume");
        Some(text)
    }

    /// A restore of the live cluster: every pod whose volume still holds data it was not
    /// set aside for stops its etcd, so that `init` sets the data aside and re-forms.
    fn restore_tick(&mut self, r: &crate::facts::RestoreRequest) -> String {
        // A volume that cannot be read, or whose markers cannot, is never taken as done
        // (nor as pending: init would only wait on it with its etcd stopped).
        let state = match crate::volume::inspect(&self.data_dir) {
            Ok(s) if s.unreadable_markers.is_empty() => s,
            Ok(s) => {
                let text = format!(
                    "restore {}: cannot read {}: etcd is not stopped for it, and init waits until the file is repaired or moved away",
                    r.id,
                    s.unreadable_markers.join("; ")
                );
                self.report(&r.id, &text, true);
                return text;
            }
            Err(e) => {
                let text = format!("restore {}: {e}: etcd is not stopped for it", r.id);
                self.report(&r.id, &text, true);
                return text;
            }
        };
        let pending = state.has_data() && state.restored_for.as_deref() != Some(r.id.as_str());
        if pending {
            self.stop_etcd(&r.id, "the cluster is restored to a snapshot")
        } else {
            format!(
                "restore {}: the cluster re-forms from snapshot {}; this pod's earlier data is set aside",
                r.id, r.snapshot
            )
        }
    }

    fn stop_etcd(&mut self, id: &str, why: &str) -> String {
        let text = match self.stopper.stop(id) {
            Stop::Signalled(pid) => {
                tracing::warn!(recovery = %id, pid, "{why}: etcd stopped (SIGTERM) so that init starts it again");
                format!("{id}: {why}; etcd stopped, init starts it again")
            }
            Stop::CoolingDown => format!("{id}: {why}; waiting for etcd to restart"),
            Stop::Done => format!("{id}: {why}; etcd was stopped once for it, init decides"),
            Stop::NotVisible => format!(
                "{id}: {why}, but no etcd process for {} is visible here (set shareProcessNamespace: true, or delete this pod so that init runs again)",
                self.data_dir.display()
            ),
            Stop::Failed(e) => format!("{id}: {why}; cannot stop etcd: {e}"),
        };
        self.report(id, &text, false);
        text
    }

    /// Logs the state of request `id`, once per state (a warning when it waits on a file
    /// that cannot be read).
    fn report(&mut self, id: &str, text: &str, unreadable: bool) {
        if self.reported.as_deref() != Some(text) {
            match unreadable {
                true => tracing::warn!(request = %id, state = %text, "recovery step waits"),
                false => tracing::info!(request = %id, state = %text, "recovery step"),
            }
            self.reported = Some(text.to_string());
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

    fn duty(dir: &Path) -> RecoveryDuty {
        RecoveryDuty::new(
            Arc::new(Inbox::default()),
            Arc::new(Inbox::default()),
            Stopper::with_cooldown(dir, Duration::ZERO),
            "etcd-1".into(),
            dir.to_path_buf(),
        )
    }

    /// The survivor's recovery marker torn or garbled while the request is still held:
    /// read as "no marker", etcd would be stopped again and forced to a second new cluster.
    /// Nothing is stopped, and `/ready` names the file.
    #[test]
    fn a_recovery_marker_that_cannot_be_read_stops_no_etcd_and_names_the_file() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut duty = duty(tmp.path());
        duty.inbox.offer(request("etcd-1"));
        // No marker: the survivor's etcd is to be stopped (none runs here to be found).
        let text = duty.tick().unwrap_or_default();
        assert!(text.contains("no etcd process"), "{text}");
        let steward = tmp.path().join("member/steward");
        std::fs::create_dir_all(&steward).ok();
        for broken in [&br#"{"id":"r1","com"#[..], b"\0\0garbage"] {
            std::fs::write(steward.join("recovery.json"), broken).ok();
            let text = duty.tick().unwrap_or_default();
            assert!(text.contains("recovery.json"), "{text}");
            assert!(text.contains("etcd is not stopped"), "{text}");
            assert!(!text.contains("no etcd process"), "{text}");
        }
    }

    /// A restore request while this volume's restore marker cannot be read: whether the
    /// data was already set aside for it is unknown, so etcd is not stopped for it.
    #[test]
    fn a_restore_marker_that_cannot_be_read_stops_no_etcd_and_names_the_file() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut duty = duty(tmp.path());
        duty.restore.offer(crate::facts::RestoreRequest {
            id: "restore-1".into(),
            snapshot: "s1".into(),
            expires_unix: u64::MAX,
        });
        let wal = tmp.path().join("member/wal");
        std::fs::create_dir_all(&wal).ok();
        std::fs::write(wal.join("0000000000000000-0000000000000000.wal"), b"data").ok();
        let text = duty.tick().unwrap_or_default();
        assert!(text.contains("no etcd process"), "{text}");
        std::fs::create_dir_all(tmp.path().join("member/steward")).ok();
        std::fs::write(
            tmp.path().join("member/steward/restored-for.json"),
            b"\"rest",
        )
        .ok();
        let text = duty.tick().unwrap_or_default();
        assert!(text.contains("restored-for.json"), "{text}");
        assert!(text.contains("etcd is not stopped"), "{text}");
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
