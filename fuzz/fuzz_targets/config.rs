//! Options come from users and the environment: any argument list must parse and validate
//! to a configuration or a list of problems, never panic.
#![no_main]

use clap::Parser;
use etcd_steward::config::{Cli, Command};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let args = std::iter::once("etcd-steward").chain(text.split('\0'));
    if let Ok(cli) = Cli::try_parse_from(args) {
        match cli.command {
            Command::Sidecar(s) => {
                let _ = s.common.validate();
            }
            Command::Init(i) => {
                // Dry runs only: validation must not depend on what is installed.
                if i.dry_run {
                    if let Ok(c) = i.validate() {
                        assert!(c.config.replicas >= 1);
                    }
                }
            }
            Command::Backup(b) => {
                let _ = b.common.validate();
            }
            Command::Recover(r) => {
                let _ = r.common.validate();
            }
            Command::Restore(r) => {
                let _ = r.common.validate();
            }
            Command::Status(s) => {
                let _ = s.common.validate();
            }
            Command::Leave(l) => {
                let _ = l.common.validate();
            }
            Command::Rejoin(r) => {
                let _ = r.common.validate();
            }
            Command::SetAside(a) => {
                let _ = a.common.validate();
            }
            Command::Install(_) => {}
        }
    }
});
