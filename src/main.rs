//! The `etcd-steward` command: parses the CLI, sets up JSON logs, runs a role, and turns
//! the outcome into an exit code. The only place that exits.

use std::process::ExitCode;

use clap::Parser;
use etcd_steward::backup::snapshot::{EtcdSource, EtcdTarget};
use etcd_steward::config::{Cli, Command, CommonArgs, Config};
use etcd_steward::dns::HickoryDns;
use etcd_steward::etcd::EtcdClientConnector;
use etcd_steward::init::observe::HttpReports;
use etcd_steward::init::{self, Outcome};
use etcd_steward::leave::Left;
use etcd_steward::recover::command::Ended;
use etcd_steward::{backup, exec, recover, sidecar};

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
            let first = text
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ");
            eprintln!("etcd-steward: {first} (see --help)");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    etcd_steward::logs::init();
    match cli.command {
        Command::Init(args) => {
            let mut cfg = match args.validate() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("etcd-steward: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            if !cfg.dry_run {
                if let Err(code) = tool_checked(&mut cfg.config) {
                    return code;
                }
            }
            let outcome = runtime().and_then(|rt| {
                let dns = HickoryDns::new(cfg.config.dns_server)?;
                let connector = EtcdClientConnector::new(&cfg.config);
                let reports = HttpReports::new(&cfg.config);
                Ok(rt.block_on(init::run(cfg, dns, connector, reports))?)
            });
            match outcome {
                Ok(Outcome::DryRun(decision)) => {
                    println!("{decision}");
                    ExitCode::SUCCESS
                }
                Ok(Outcome::Exec { bin, argv }) => {
                    tracing::info!(etcd = %bin.display(), args = ?argv, "exec etcd");
                    let err = exec::exec_etcd(&bin, &argv);
                    fail(&anyhow::anyhow!("cannot exec {}: {err}", bin.display()))
                }
                Err(e) => fail(&e),
            }
        }
        Command::Install(args) => match exec::install_self(&args.dir) {
            Ok(path) => {
                tracing::info!(path = %path.display(), "etcd-steward installed");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&anyhow::anyhow!(
                "cannot install into {}: {e}",
                args.dir.display()
            )),
        },
        Command::Sidecar(args) => {
            let mut cfg = match validated(&args.common) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if let Err(code) = tool_checked(&mut cfg) {
                return code;
            }
            let result = with_cluster(cfg, |cfg, dns, connector| async move {
                let (tx, rx) = tokio::sync::watch::channel(false);
                tokio::spawn(stop_on_sigterm(tx));
                Ok(sidecar::run(cfg, dns, connector, rx).await?)
            });
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
        Command::Recover(args) => {
            let cfg = match validated(&args.common) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let result = with_cluster(cfg, |cfg, dns, connector| {
                recover::command::run(cfg, &args, dns, connector)
            });
            ended(result, "recover")
        }
        Command::Leave(args) => {
            let cfg = match validated(&args.common) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let result = with_cluster(cfg, |cfg, dns, connector| {
                etcd_steward::leave::leave(cfg, args.yes, args.if_scaled_in, dns, connector)
            });
            match result {
                Ok(Left::Planned | Left::Done | Left::NotScaledIn) => ExitCode::SUCCESS,
                Ok(Left::Refused(why)) => {
                    eprintln!("etcd-steward: leave refused: {why}");
                    ExitCode::from(EXIT_REFUSED)
                }
                Err(e) => fail(&e),
            }
        }
        Command::Rejoin(args) => {
            let cfg = match validated(&args.common) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match etcd_steward::leave::rejoin(&cfg) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
        Command::Status(args) => {
            let cfg = match validated(&args.common) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let result = with_cluster(cfg, |cfg, dns, connector| {
                etcd_steward::status::gather(cfg, dns, connector)
            });
            match result {
                Ok(s) if args.output == "json" => match serde_json::to_string(&s) {
                    Ok(text) => {
                        println!("{text}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(&e.into()),
                },
                Ok(s) => {
                    print!("{}", etcd_steward::status::render(&s));
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Restore(args) => {
            let cfg = match validated(&args.common) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let result = with_cluster(cfg, |cfg, dns, connector| {
                recover::to_snapshot::run(cfg, &args, dns, connector)
            });
            ended(result, "restore")
        }
        Command::Backup(args) if args.generate_key => {
            // A new key file on stdout; nothing else is read or written.
            print!("{}", backup::crypt::Key::generate_file());
            ExitCode::SUCCESS
        }
        Command::Backup(args) => {
            let mut cfg = match validated(&args.common) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if args.drill {
                if let Err(code) = tool_checked(&mut cfg) {
                    return code;
                }
            }
            let Some(backup_cfg) = cfg.backup.clone() else {
                eprintln!("etcd-steward: backup needs --backup-url (or ETCD_STEWARD_BACKUP_URL)");
                return ExitCode::from(EXIT_CONFIG);
            };
            let result = runtime().and_then(|rt| {
                rt.block_on(backup_command(&cfg, &backup_cfg, args.list, args.drill))
            });
            match result {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(EXIT_RUNTIME),
                Err(e) => fail(&e),
            }
        }
    }
}

/// The shared options validated, or the exit code of a configuration error (said in one
/// line on stderr).
fn validated(common: &CommonArgs) -> Result<Config, ExitCode> {
    common.validate().map_err(|e| {
        eprintln!("etcd-steward: {e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

/// etcd's offline tool run once at start when backups are configured (a restore or a drill
/// needs it), or the exit code of a configuration error (said in one line on stderr).
fn tool_checked(cfg: &mut Config) -> Result<(), ExitCode> {
    let checked = match runtime() {
        Ok(rt) => rt.block_on(etcd_steward::config::check_restore_tool(cfg)),
        Err(e) => return Err(fail(&e)),
    };
    checked.map_err(|e| {
        eprintln!("etcd-steward: {e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

/// Runs `f` on a runtime with this configuration's DNS resolver and etcd connector.
fn with_cluster<T, F, Fut>(cfg: Config, f: F) -> anyhow::Result<T>
where
    F: FnOnce(Config, HickoryDns, EtcdClientConnector) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    runtime().and_then(|rt| {
        rt.block_on(async {
            let dns = HickoryDns::new(cfg.dns_server)?;
            let connector = EtcdClientConnector::new(&cfg);
            f(cfg, dns, connector).await
        })
    })
}

/// How `recover` or `restore` (`what`) ended, as an exit code.
fn ended(result: anyhow::Result<Ended>, what: &str) -> ExitCode {
    match result {
        Ok(Ended::Planned | Ended::Recovered) => ExitCode::SUCCESS,
        Ok(Ended::Refused(why)) => {
            eprintln!("etcd-steward: {what} refused: {why}");
            ExitCode::from(EXIT_REFUSED)
        }
        Ok(Ended::TimedOut(why)) => {
            eprintln!("etcd-steward: {why}");
            ExitCode::from(EXIT_RUNTIME)
        }
        Err(e) => fail(&e),
    }
}

/// `etcd-steward backup [--list | --drill]`: prints JSON lines on stdout; `Ok(false)` when
/// the drill ran and failed.
async fn backup_command(
    cfg: &etcd_steward::config::Config,
    backup_cfg: &backup::BackupConfig,
    list: bool,
    drill: bool,
) -> anyhow::Result<bool> {
    let backups = backup::Backups::new(backup_cfg, cfg.etcd_bin.clone())?;
    if list {
        for m in backups.list().await? {
            println!("{}", backup::manifest::list_line(&m));
        }
        return Ok(true);
    }
    let source = EtcdSource::connect(&EtcdTarget::local(cfg)).await?;
    let now = std::time::SystemTime::now();
    if drill {
        return match backups.drill_newest(&source, now).await? {
            Some(outcome) => {
                println!("{}", outcome.to_json());
                Ok(outcome.passed)
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
