//! The `etcd-steward` command: parses the CLI, sets up JSON logs, runs a role, and turns
//! the outcome into an exit code. The only place that exits.

use std::process::ExitCode;

use clap::Parser;
use etcd_steward::backup::snapshot::{EtcdSource, EtcdTarget};
use etcd_steward::commands::leave::Left;
use etcd_steward::commands::recover::Ended;
use etcd_steward::config::{Cli, Command, Config, ConfigError, InitConfig};
use etcd_steward::dns::HickoryDns;
use etcd_steward::etcd::EtcdClientConnector;
use etcd_steward::init::{self, Outcome};
use etcd_steward::{backup, commands, exec, sidecar};

/// EX_USAGE: a configuration error.
const EXIT_CONFIG: u8 = 64;
const EXIT_RUNTIME: u8 = 1;
/// `recover` refused (quorum, no data, a pod that could hold fresher data is silent).
const EXIT_REFUSED: u8 = 2;

/// Writes the error where `kubectl describe pod` shows it, logs it once, and fails.
fn fail(e: &anyhow::Error) -> ExitCode {
    let chain = format!("{e:#}");
    tracing::error!(error = %chain, "etcd-steward failed");
    let _ = std::fs::write("/dev/termination-log", &chain);
    ExitCode::from(EXIT_RUNTIME)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

async fn stop_on_sigterm(tx: tokio::sync::watch::Sender<bool>) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("termination signal received");
    let _ = tx.send(true);
}

/// How a command ended, turned into the process's exit status in one place ([`exit`]).
enum Exit {
    Success,
    /// Refused, and the one line that says why (exit 2).
    Refused {
        what: &'static str,
        why: String,
    },
    /// Failed with what was already printed, or one line to print (exit 1).
    Failed(Option<String>),
}

/// The one place that turns an outcome into an exit status: a configuration error is one
/// line on stderr and exit 64 (EX_USAGE); any other error is written where `kubectl
/// describe pod` shows it and exits 1.
fn exit(outcome: anyhow::Result<Exit>) -> ExitCode {
    match outcome {
        Ok(Exit::Success) => ExitCode::SUCCESS,
        Ok(Exit::Refused { what, why }) => {
            eprintln!("etcd-steward: {what} refused: {why}");
            ExitCode::from(EXIT_REFUSED)
        }
        Ok(Exit::Failed(said)) => {
            if let Some(line) = said {
                eprintln!("etcd-steward: {line}");
            }
            ExitCode::from(EXIT_RUNTIME)
        }
        Err(e) => match e.downcast_ref::<ConfigError>() {
            Some(config) => {
                eprintln!("etcd-steward: {config}");
                ExitCode::from(EXIT_CONFIG)
            }
            None => fail(&e),
        },
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line, naming the problem; the usage is a --help away.
            let text = e.render().to_string();
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            let mut first = lines
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ")
                .to_string();
            // "the following required arguments were not provided:" names them on the next
            // lines: they are the message.
            if first.ends_with(':') {
                let named: Vec<&str> = lines
                    .take_while(|l| l.starts_with('-') || l.starts_with('<'))
                    .collect();
                first = format!("{first} {}", named.join(", "));
            }
            eprintln!("etcd-steward: {first} (see --help)");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    etcd_steward::logs::init();
    exit(run(cli.command))
}

/// Runs one command to its end.
fn run(command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::Init(args) => init_command(args.validate()?),
        Command::Install(args) => {
            let path = exec::install_self(&args.dir)
                .map_err(|e| anyhow::anyhow!("cannot install into {}: {e}", args.dir.display()))?;
            tracing::info!(path = %path.display(), "etcd-steward installed");
            Ok(Exit::Success)
        }
        Command::Sidecar(args) => {
            let cfg = tool_checked(args.common.validate()?)?;
            etcd_steward::config::check_restore_jump(&cfg)?;
            with_cluster(cfg, |cfg, dns, connector| async move {
                let (tx, rx) = tokio::sync::watch::channel(false);
                tokio::spawn(stop_on_sigterm(tx));
                sidecar::run(cfg, dns, connector, rx).await?;
                Ok(Exit::Success)
            })
        }
        Command::Recover(args) => {
            let ended = with_cluster(args.common.validate()?, |cfg, dns, connector| {
                commands::recover::run(cfg, &args, dns, connector)
            })?;
            Ok(exit_of(ended, "recover"))
        }
        Command::Restore(args) => {
            let ended = with_cluster(args.common.validate()?, |cfg, dns, connector| {
                commands::restore::run(cfg, &args, dns, connector)
            })?;
            Ok(exit_of(ended, "restore"))
        }
        Command::Leave(args) => {
            let left = with_cluster(args.common.validate()?, |cfg, dns, connector| {
                commands::leave::leave(cfg, args.yes, args.if_scaled_in, dns, connector)
            })?;
            Ok(match left {
                Left::Planned | Left::Done | Left::NotScaledIn => Exit::Success,
                Left::Refused(why) => Exit::Refused { what: "leave", why },
            })
        }
        Command::SetAside(args) => {
            let cfg = args.common.validate()?;
            let ended = commands::set_aside::run(
                &cfg.data_dir,
                args.remove.as_deref(),
                args.yes,
                args.output == "json",
                etcd_steward::clock::unix_now(),
            )?;
            Ok(match ended {
                commands::set_aside::Ended::Refused(why) => Exit::Refused {
                    what: "set-aside",
                    why,
                },
                _ => Exit::Success,
            })
        }
        Command::Rejoin(args) => {
            commands::leave::rejoin(&args.common.validate()?)?;
            Ok(Exit::Success)
        }
        Command::Status(args) if args.history => {
            let since = args.since;
            let t = with_cluster(args.common.validate()?, |cfg, dns, connector| {
                commands::history::gather(cfg, dns, connector, since)
            })?;
            if args.output == "json" {
                println!("{}", serde_json::to_string(&t)?);
            } else {
                print!("{}", commands::history::render(&t));
            }
            Ok(Exit::Success)
        }
        Command::Status(args) => {
            let s = with_cluster(args.common.validate()?, commands::status::gather)?;
            if args.output == "json" {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                print!("{}", commands::status::render(&s));
            }
            Ok(Exit::Success)
        }
        Command::Backup(args) if args.generate_key => {
            // A new key file on stdout; nothing else is read or written.
            print!("{}", backup::crypt::Key::generate_file());
            Ok(Exit::Success)
        }
        Command::Backup(args) => {
            let mut cfg = args.common.validate()?;
            if args.drill {
                cfg = tool_checked(cfg)?;
            }
            let Some(backup_cfg) = cfg.backup.clone() else {
                return Err(ConfigError {
                    problems: vec!["backup needs --backup-url (or ETCD_STEWARD_BACKUP_URL)".into()],
                }
                .into());
            };
            let list = args.list.then_some(args.output == "text");
            let passed =
                runtime()?.block_on(backup_command(&cfg, &backup_cfg, list, args.drill))?;
            Ok(if passed {
                Exit::Success
            } else {
                Exit::Failed(None)
            })
        }
    }
}

/// `init`: decide, act, and exec etcd (or print the decision with `--dry-run`).
fn init_command(mut cfg: InitConfig) -> anyhow::Result<Exit> {
    if !cfg.dry_run {
        cfg.config = tool_checked(cfg.config)?;
        etcd_steward::config::check_restore_jump(&cfg.config)?;
    }
    let rt = runtime()?;
    let dns = HickoryDns::new(cfg.config.dns_server)?;
    let connector = EtcdClientConnector::new(&cfg.config.etcd);
    let reports = cfg.config.peer_reports();
    match rt.block_on(init::run(cfg, dns, connector, reports))? {
        Outcome::DryRun(decision) => {
            println!("{decision}");
            Ok(Exit::Success)
        }
        Outcome::Exec { bin, argv } => {
            tracing::info!(etcd = %bin.display(), args = ?argv, "exec etcd");
            let err = exec::exec_etcd(&bin, &argv);
            anyhow::bail!("cannot exec {}: {err}", bin.display())
        }
    }
}

/// etcd's offline tool run once at start when backups are configured (a restore or a drill
/// needs it): a tool that does not run is a configuration error.
fn tool_checked(mut cfg: Config) -> anyhow::Result<Config> {
    runtime()?.block_on(etcd_steward::config::check_restore_tool(&mut cfg))?;
    Ok(cfg)
}

/// Runs `f` on a runtime with this configuration's DNS resolver and etcd connector.
fn with_cluster<T, F, Fut>(cfg: Config, f: F) -> anyhow::Result<T>
where
    F: FnOnce(Config, HickoryDns, EtcdClientConnector) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    runtime()?.block_on(async {
        let dns = HickoryDns::new(cfg.dns_server)?;
        let connector = EtcdClientConnector::new(&cfg.etcd);
        f(cfg, dns, connector).await
    })
}

/// How `recover` or `restore` (`what`) ended.
fn exit_of(ended: Ended, what: &'static str) -> Exit {
    match ended {
        Ended::Planned | Ended::Recovered => Exit::Success,
        Ended::Refused(why) => Exit::Refused { what, why },
        Ended::TimedOut(why) => Exit::Failed(Some(why)),
    }
}

/// `etcd-steward backup [--list [-o text] | --drill]`: prints JSON lines on stdout (or the
/// list's text form, `list: Some(true)`); `Ok(false)` when the drill ran and failed.
async fn backup_command(
    cfg: &etcd_steward::config::Config,
    backup_cfg: &backup::BackupConfig,
    list: Option<bool>,
    drill: bool,
) -> anyhow::Result<bool> {
    let backups = backup::Backups::new(backup_cfg, cfg.etcd_bin.clone())?
        .with_etcd_auth(cfg.etcd.auth.clone());
    if let Some(text) = list {
        etcd_steward::commands::backups::list(&backups, text).await?;
        return Ok(true);
    }
    let source =
        EtcdSource::connect(&EtcdTarget::local(&cfg.identity, cfg.local_ip(), &cfg.etcd)).await?;
    let now = std::time::SystemTime::now();
    if drill {
        return match backups.drill_newest(&source, now).await? {
            Some(outcome) => {
                println!("{}", outcome.to_json());
                Ok(outcome.passed_all())
            }
            None => anyhow::bail!("no verified snapshot to drill in {}", backup_cfg.url),
        };
    }
    match backups.take_now(&source, now).await {
        Ok(m) => {
            println!("{}", serde_json::to_string(&m)?);
            Ok(true)
        }
        // Printed too: it is stored and listed, marked unverified.
        Err(backup::BackupError::Unverified(m)) => {
            println!("{}", serde_json::to_string(&m)?);
            anyhow::bail!(backup::BackupError::Unverified(m))
        }
        Err(e) => Err(e.into()),
    }
}
