//! `init`: observe → decide → act, round after round, until the decision is to start
//! etcd. [`observe`] gathers the facts, [`decide`] (pure) picks one action, [`act`]
//! performs it, [`retry`] (pure) says what follows a failure. Every act is followed by a
//! fresh observation, so the agent can be killed at any point and run again.

pub mod act;
pub mod decide;
pub mod etcd_args;
pub mod explain;
pub mod observe;
pub mod retry;
pub mod upgrade;

use std::path::PathBuf;

use serde_json::Value;

use crate::backup::restore::RestoreError;
use crate::backup::store::Store;
use crate::clock::unix_now;
use crate::config::InitConfig;
use crate::dns::Dns;
use crate::etcd::Connector;
use crate::volume;
use act::{act, ActError, Next, Pause};
use decide::decide;
use etcd_args::{etcd_argv, StartMode};
use observe::{Observer, PeerReports};
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
        cfg: cfg.clone(),
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
        async move { observe::binary_version(&bin).await }
    }));
    let mut binary = None;
    let mut backoff = Backoff::default();
    let mut round = 0u64;
    loop {
        round += 1;
        let mut facts = observer.observe(nonce()).await?;
        if let Some(task) = reading.take() {
            binary = task.await.unwrap_or(None);
        }
        facts.versions.binary = binary;
        facts.versions.auth_on_3_4 = observe::auth_on_3_4(&connector, &cfg.identity, &facts).await;
        let d = decide(&facts);
        explain::log(&facts, &d, round);
        if init.dry_run {
            return Ok(Outcome::DryRun(explain::decision_json(&facts, &d)));
        }
        backoff.observe(&d.why);
        let pause = match act(&world, &facts, &d, unix_now()).await {
            Ok(Next::Exec(mode)) => return Ok(exec(&init, &mode)),
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

fn exec(init: &InitConfig, mode: &StartMode) -> Outcome {
    Outcome::Exec {
        bin: init.config.etcd_bin.clone(),
        argv: etcd_argv(&init.config, mode, &init.etcd_args),
    }
}
