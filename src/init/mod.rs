//! `init`: observe → decide → act, round after round, until the decision is to start
//! etcd. [`crate::observe`] gathers the facts, [`crate::decision`] (pure) picks one action, [`act`]
//! performs it, [`retry`] (pure) says what follows a failure. Every act is followed by a
//! fresh observation, so the agent can be killed at any point and run again.

pub mod act;
pub mod etcd_args;
pub mod explain;
pub mod releases;
pub mod retry;
pub mod waiting;

use std::path::PathBuf;

use serde_json::Value;

use crate::backup::restore::RestoreError;
use crate::backup::store::Store;
use crate::clock::unix_now;
use crate::config::InitConfig;
use crate::decision::{decide, Action};
use crate::dns::Dns;
use crate::etcd::Connector;
use crate::facts::EtcdVersion;
use crate::observe::{Observer, PeerReports};
use crate::volume;
use act::{act, ActError, Next, Pause};
use etcd_args::{checks_for, corruption_checks, etcd_argv, StartMode};
use retry::{Backoff, Retry};

/// What `init` ends with.
#[derive(Debug)]
pub enum Outcome {
    /// `--dry-run`: the decision, to print.
    DryRun(Value),
    /// Start etcd: exec `bin` with `argv`.
    Exec { bin: PathBuf, argv: Vec<String> },
}

fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Runs `init` until etcd can be started (or, with `--dry-run`, for one round), on the
/// outside world it is given: DNS, etcd, the peers' reports.
pub async fn run<D, C, R>(
    init: InitConfig,
    dns: D,
    connector: C,
    reports: R,
) -> Result<Outcome, ActError>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
    R: PeerReports + Clone + 'static,
{
    let cfg = &init.config;
    if !init.dry_run {
        volume::prepare(&cfg.data_dir)?;
    }
    // The store a new cluster may restore from (with --restore never, only at an
    // operator's restore request); opening it makes no request.
    let store = match &cfg.backup {
        Some(b) => Some(
            Store::open(&b.url)
                .map_err(RestoreError::from)?
                .with_keys(b.keys.clone()),
        ),
        _ => None,
    };
    let observer = Observer {
        pod: cfg.pod(),
        dns,
        connector: connector.clone(),
        reports,
        store: store.clone(),
        starting: true,
    };
    let world = act::World {
        cfg,
        connector: &connector,
        store: store.as_ref(),
    };
    // The release this pod starts: read once per start (it cannot change meanwhile), while
    // the first round observes, so a restart does not wait for it.
    let mut reading = Some(tokio::spawn({
        let bin = cfg.etcd_bin.clone();
        async move { crate::observe::binary_version(&bin).await }
    }));
    let mut binary = None;
    let mut backoff = Backoff::default();
    let mut note = Note::load(&cfg.data_dir);
    let mut round = 0u64;
    loop {
        round += 1;
        let mut facts = observer.observe(nonce()).await?;
        if let Some(task) = reading.take() {
            binary = task.await.unwrap_or(None);
        }
        facts.versions.binary = binary;
        facts.versions.auth_on_3_4 =
            crate::observe::auth_on_3_4(&connector, &cfg.identity, &facts).await;
        // With backups, only when this pod would start the first member of a newer minor
        // release: how old the store's newest verified snapshot is.
        facts.versions.snapshot_age = match (
            &store,
            crate::decision::upgrade::first_of_new_minor(&facts.versions),
        ) {
            (Some(store), Some(_)) => {
                Some(crate::observe::newest_snapshot_age(store, unix_now()).await)
            }
            _ => None,
        };
        let d = decide(&facts);
        explain::log(&facts, &d, round);
        if init.dry_run {
            return Ok(Outcome::DryRun(explain::decision_json(&facts, &d)));
        }
        backoff.observe(&d.why);
        let done = act(&world, &facts, &d, unix_now()).await;
        let waits = match (&d.action, &done) {
            (Action::Wait, _) => Some((d.why.name(), d.why.to_string())),
            (_, Err(e)) if retry::policy(e) != Retry::GiveUp => Some((
                "ActionNotDone".to_string(),
                format!("{} not done, tried again: {e}", d.action.name()),
            )),
            _ => None,
        };
        note.set(waits, unix_now());
        let pause = match done {
            Ok(Next::Exec(mode)) => return Ok(exec(&init, &mode, binary)),
            Ok(Next::LookAgain(pause)) => pause,
            Err(e) => match retry::policy(&e) {
                Retry::GiveUp => return Err(e),
                Retry::After(pause) => {
                    tracing::info!(error = %e, retry_in = ?pause, "action not done; retrying");
                    Pause::For(pause)
                }
                Retry::Backoff => {
                    tracing::warn!(error = %e, "action not done; looking again");
                    Pause::Backoff
                }
            },
        };
        // While an operator's recovery or restore is under way, the cluster changes within
        // seconds: look again often instead of at the back-off's (up to 5 s) pace.
        let requested = facts.recovery_request.is_some() || facts.restore_request.is_some();
        match pause {
            Pause::Now => {}
            Pause::For(p) => tokio::time::sleep(p).await,
            Pause::Backoff if requested => {
                tokio::time::sleep(backoff.next_delay().min(LOOK_DURING_REQUEST)).await
            }
            Pause::Backoff => tokio::time::sleep(backoff.next_delay()).await,
        }
    }
}

/// The longest wait between two rounds while a recovery or restore request is held.
const LOOK_DURING_REQUEST: std::time::Duration = std::time::Duration::from_millis(500);

fn exec(init: &InitConfig, mode: &StartMode, release: Option<EtcdVersion>) -> Outcome {
    // etcd reads `ETCD_<FLAG>` variables too: one the user set keeps its value.
    let env: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("ETCD_") && !k.starts_with("ETCD_STEWARD_"))
        .collect();
    let checks = checks_for(mode, corruption_checks(release, &init.etcd_args, &env));
    if release.is_none() {
        tracing::warn!("etcd's release is unknown: it starts without its corruption checks (--experimental-initial-corrupt-check and the periodic check)");
    }
    Outcome::Exec {
        bin: init.config.etcd_bin.clone(),
        argv: etcd_argv(&init.config, mode, &checks, &init.etcd_args),
    }
}

/// When `init` last acted on the volume, by its journal (`None`: never, or the journal
/// cannot be read).
fn last_act(dir: &std::path::Path) -> Option<u64> {
    volume::journal::read(dir).ok()?.pop().map(|e| e.ts)
}

/// The waiting note on the volume, as last written by this init (or, at start, as a
/// previous one left it while it is still current). Writing it never stops init: an error
/// is logged and the note is tried again at the next change.
struct Note {
    dir: PathBuf,
    held: Option<crate::facts::Waiting>,
}

impl Note {
    fn load(dir: &std::path::Path) -> Note {
        // Only dates the note shown in `/ready` and `status`: with the journal unreadable
        // the note is taken as it is (init then waits, naming the journal, and writes anew).
        let last_act = last_act(dir);
        Note {
            dir: dir.to_path_buf(),
            held: volume::marker::waiting(dir).filter(|w| w.current(last_act)),
        }
    }

    /// After a round: what it waits for (kind, sentence), or nothing when it acted.
    fn set(&mut self, waits: Option<(String, String)>, now: u64) {
        let waits = waits.as_ref().map(|(k, r)| (k.as_str(), r.clone()));
        let result = match waiting::change(self.held.as_ref(), waits, now) {
            waiting::Change::Keep => return,
            waiting::Change::Write(mut w) => {
                // Dated after init's last act, even one in the same second (a set-aside, a
                // join): readers take a note no newer than the last act for one left behind.
                let last_act = last_act(&self.dir);
                w.since = w.since.max(last_act.map_or(0, |ts| ts + 1));
                volume::marker::write_waiting(&self.dir, &w).map(|()| Some(w))
            }
            waiting::Change::Clear => volume::marker::clear_waiting(&self.dir).map(|()| None),
        };
        match result {
            Ok(held) => self.held = held,
            Err(e) => {
                tracing::warn!(error = %e, "the waiting note (for /ready and status) is not updated; init goes on")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{marker, tests::temp, VolumeError};

    fn waits(reason: &str) -> Option<(String, String)> {
        Some(("NoUsableBackup".into(), reason.into()))
    }

    #[test]
    fn the_note_is_written_when_the_reason_changes_and_goes_when_init_acts(
    ) -> Result<(), VolumeError> {
        let tmp = temp()?;
        let dir = tmp.path();
        let mut note = Note::load(dir);
        note.set(waits("no key"), 10);
        assert_eq!(marker::waiting(dir).map(|w| w.since), Some(10));
        // Removed behind its back: the same reason again writes nothing.
        marker::clear_waiting(dir)?;
        note.set(waits("no key"), 11);
        assert_eq!(marker::waiting(dir), None, "same reason, no write");
        note.set(waits("no key, other keys"), 12);
        assert_eq!(
            marker::waiting(dir).map(|w| (w.since, w.reason)),
            Some((10, "no key, other keys".into()))
        );
        note.set(None, 13);
        assert_eq!(marker::waiting(dir), None, "init acted: the note went");
        Ok(())
    }

    #[test]
    fn a_new_init_keeps_a_current_note_and_forgets_one_older_than_its_last_act(
    ) -> Result<(), VolumeError> {
        let tmp = temp()?;
        let dir = tmp.path();
        Note::load(dir).set(waits("no key"), 10);
        let mut again = Note::load(dir);
        again.set(waits("no key"), 20);
        assert_eq!(
            marker::waiting(dir).map(|w| w.since),
            Some(10),
            "still the same wait"
        );
        let entry =
            volume::journal::Entry::new(30, crate::facts::ActionKind::Restart, "etcd started");
        volume::journal::append(dir, &entry)?;
        let mut after = Note::load(dir);
        after.set(waits("no key"), 40);
        assert_eq!(
            marker::waiting(dir).map(|w| w.since),
            Some(40),
            "a new wait"
        );
        Ok(())
    }

    #[test]
    fn a_wait_begun_in_the_second_of_inits_last_act_is_dated_after_it() -> Result<(), VolumeError> {
        let tmp = temp()?;
        let dir = tmp.path();
        let left = volume::journal::Entry::new(50, crate::facts::ActionKind::SetAside, "left");
        volume::journal::append(dir, &left)?;
        let mut note = Note::load(dir);
        note.set(waits("this pod left the cluster"), 50);
        let w = marker::waiting(dir);
        assert_eq!(w.as_ref().map(|w| w.since), Some(51));
        assert!(w.is_some_and(|w| w.current(Some(50))), "shown, not stale");
        Ok(())
    }

    #[test]
    fn a_note_that_cannot_be_written_does_not_stop_init() -> Result<(), VolumeError> {
        let tmp = temp()?;
        let file = tmp.path().join("not-a-dir");
        std::fs::write(&file, b"x").map_err(|source| VolumeError::Unwritable {
            path: file.clone(),
            source,
        })?;
        let mut note = Note::load(&file);
        note.set(waits("no key"), 10);
        assert_eq!(
            note.held, None,
            "not written, tried again at the next change"
        );
        Ok(())
    }
}
