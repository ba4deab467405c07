//! Bad input ends in one clear line and a known exit status, with no data touched:
//! 64 (EX_USAGE) for configuration errors, 1 for runtime failures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use harness::logs::dry_run_decision;

fn steward(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_etcd-steward"))
        .args(args)
        .env_remove("HOSTNAME")
        .env_remove("POD_NAME")
        .env("ETCD_STEWARD_LOG", "off")
        .output()
        .unwrap()
}

#[track_caller]
fn refused(args: &[&str], needle: &str) {
    let out = steward(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{args:?} → {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: expected {needle:?} in {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

const OK: [&str; 5] = [
    "init",
    "--dry-run",
    "--name=etcd-0",
    "--replicas=3",
    "--data-dir=/nonexistent/etcd-steward-test",
];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    OK.iter().copied().chain(extra.iter().copied()).collect()
}

#[test]
fn configuration_errors_exit_64_naming_the_constraint() {
    refused(
        &["init", "--dry-run", "--name=etcd", "--replicas=3"],
        "must end in -<ordinal>",
    );
    refused(
        &["init", "--dry-run", "--name=etcd-0", "--replicas=0"],
        "--replicas must be the initial cluster size",
    );
    refused(
        &with(&["--client-port=70000"]),
        "--client-port must be a port from 1 to 65535",
    );
    refused(
        &with(&["--client-port=2380"]),
        "--client-port and --peer-port must differ",
    );
    refused(
        &with(&["--listen-ip=pod.local"]),
        "--listen-ip must be an IP address",
    );
    refused(
        &with(&["--dns-server=10.0.0.1"]),
        "--dns-server must be IP:PORT",
    );
    refused(
        &with(&["--learner-stall-timeout=soon"]),
        "--learner-stall-timeout",
    );
    refused(&with(&["--bogus"]), "--bogus");
    let out = steward(&with(&["--bogus"]));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr)
            .trim_end()
            .lines()
            .count(),
        1,
        "one line"
    );
    refused(&with(&["--client-cert-file=/etc/hostname"]), "go together");
    refused(&["sidecar", "--name=etcd-0"], "--replicas");
}

#[test]
fn a_missing_or_empty_control_token_file_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("token");
    std::fs::write(&empty, "\n").unwrap();
    let missing = format!("--control-token-file={}", dir.path().join("none").display());
    let empty = format!("--control-token-file={}", empty.display());
    for (arg, needle) in [(missing, "cannot be read"), (empty, "is empty")] {
        for role in ["sidecar", "recover"] {
            let mut args = vec![role, "--name=etcd-0", "--replicas=3", arg.as_str()];
            args.push("--data-dir=/nonexistent/etcd-steward-test");
            refused(&args, needle);
            let out = steward(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("--control-token-file"), "{stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        }
    }
}

#[test]
fn all_problems_are_reported_on_one_line() {
    let out = steward(&[
        "init",
        "--dry-run",
        "--name=etcd",
        "--replicas=0",
        "--listen-ip=x",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    for needle in ["-<ordinal>", "--replicas", "--listen-ip"] {
        assert!(stderr.contains(needle), "{stderr}");
    }
}

#[test]
fn an_etcd_binary_that_is_missing_or_not_executable_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = format!("--data-dir={}", data.display());
    let base = ["init", "--name=etcd-0", "--replicas=1", data_arg.as_str()];
    let missing = [&base[..], &["--etcd-bin=/nonexistent/etcd"]].concat();
    refused(&missing, "does not exist or is not an executable file");
    let plain = dir.path().join("etcd");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let arg = format!("--etcd-bin={}", plain.display());
    refused(
        &[&base[..], &[arg.as_str()]].concat(),
        "not an executable file",
    );
    assert!(!data.exists(), "nothing was created");
}

#[test]
fn init_and_sidecar_with_backups_but_no_restore_tool_anywhere_exit_64_naming_etcdutl_bin() {
    let dir = tempfile::tempdir().unwrap();
    // etcd with nothing beside it, and a PATH that holds no etcdutl or etcdctl.
    let opt = dir.path().join("opt-etcd");
    let empty_path = dir.path().join("empty-path");
    std::fs::create_dir_all(&opt).unwrap();
    std::fs::create_dir_all(&empty_path).unwrap();
    let etcd = opt.join("etcd");
    std::fs::write(&etcd, "#!/bin/sh\nsleep 600\n").unwrap();
    std::fs::set_permissions(&etcd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("data");
    let (data_arg, etcd_arg, store_arg) = (
        format!("--data-dir={}", data.display()),
        format!("--etcd-bin={}", etcd.display()),
        format!("--backup-url=file://{}", dir.path().join("store").display()),
    );
    for role in ["init", "sidecar"] {
        // Bounded: an agent that started anyway is stopped (exit 124) instead of hanging.
        let out = Command::new("/usr/bin/timeout")
            .args(["20", env!("CARGO_BIN_EXE_etcd-steward")])
            .args([role, "--name=etcd-0", "--replicas=1", "--http-port=18931"])
            .args([&data_arg, &etcd_arg, &store_arg])
            .env_remove("HOSTNAME")
            .env_remove("POD_NAME")
            .env_remove("ETCD_STEWARD_ETCDUTL_BIN")
            .env("PATH", &empty_path)
            .env("ETCD_STEWARD_LOG", "off")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{role}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{role}: one line: {stderr}"
        );
        for needle in [
            "--etcdutl-bin".to_string(),
            opt.join("etcdutl").display().to_string(),
            empty_path.join("etcdctl").display().to_string(),
        ] {
            assert!(stderr.contains(&needle), "{role}: {needle:?} in {stderr}");
        }
        assert!(
            !stderr.contains(
                "cannot run \"etcdutl\": No such file or directory (os error 2): cannot run"
            ),
            "{role}: each cause said once: {stderr}"
        );
        assert!(!data.exists(), "{role}: nothing was created");
    }
}

/// A tool that runs but whose `snapshot restore` has no `--bump-revision` (etcd 3.4's
/// etcdctl, etcdutl before 3.5.?): a restore with it would take the revision backwards.
fn tool_without_jump(dir: &std::path::Path) -> std::path::PathBuf {
    let tool = dir.join("etcdutl");
    std::fs::write(
        &tool,
        "#!/bin/sh\ncase \"$1\" in\n  version) echo 'etcdutl version: 3.5.1' ;;\n  snapshot) echo '  --data-dir string  Path to the data directory' ;;\nesac\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    tool
}

#[test]
fn a_restore_tool_that_cannot_jump_the_revision_is_refused_at_start_unless_the_jump_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let tool = tool_without_jump(dir.path());
    let etcd = dir.path().join("etcd");
    std::fs::write(&etcd, "#!/bin/sh\nsleep 600\n").unwrap();
    std::fs::set_permissions(&etcd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let args = |extra: &[&str]| -> Output {
        Command::new("/usr/bin/timeout")
            .args(["5", env!("CARGO_BIN_EXE_etcd-steward")])
            .args([
                "sidecar",
                "--name=etcd-0",
                "--replicas=1",
                "--http-port=18932",
            ])
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--etcd-bin={}", etcd.display()))
            .arg(format!("--etcdutl-bin={}", tool.display()))
            .arg(format!(
                "--backup-url=file://{}",
                dir.path().join("store").display()
            ))
            .args(extra)
            .env_remove("HOSTNAME")
            .env_remove("POD_NAME")
            .env("ETCD_STEWARD_LOG", "off")
            .output()
            .unwrap()
    };
    let out = args(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    for needle in [
        "cannot move a restore's revision forward",
        "etcdutl version: 3.5.1",
        "--restore-bump-revision 0",
    ] {
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
    // `--restore never` does not turn off an operator's restore: still refused.
    let out = args(&["--restore", "never"]);
    assert_eq!(out.status.code(), Some(64));
    // Turning the jump off is accepted: the agent starts (and is stopped by `timeout`,
    // 124), it is not refused.
    let out = args(&["--restore-bump-revision", "0"]);
    assert_ne!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn unreadable_tls_files_are_configuration_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("peer.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let g = garbage.display().to_string();
    let args = [
        format!("--peer-cert-file={g}"),
        format!("--peer-key-file={g}"),
        format!("--peer-trusted-ca-file={g}"),
    ];
    let all: Vec<&str> = OK
        .iter()
        .copied()
        .chain(args.iter().map(String::as_str))
        .collect();
    refused(&all, "peer.pem");
}

#[test]
fn a_data_dir_that_is_a_file_fails_with_one_line_and_is_left_alone() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "precious").unwrap();
    let arg = format!("--data-dir={}", file.path().display());
    let out = steward(&[
        "init",
        "--dry-run",
        "--name=etcd-0",
        "--replicas=1",
        &arg,
        "--dns-server=127.0.0.1:1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read_to_string(file.path()).unwrap(), "precious");
}

#[test]
fn a_garbage_wal_is_data_never_deleted_and_never_a_new_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("member/wal");
    std::fs::create_dir_all(&wal).unwrap();
    std::fs::write(
        wal.join("0000000000000000-0000000000000000.wal"),
        b"garbage, truncated",
    )
    .unwrap();
    let arg = format!("--data-dir={}", dir.path().display());
    let out = steward(&[
        "init",
        "--dry-run",
        "--name=etcd-0",
        "--replicas=1",
        &arg,
        "--dns-server=127.0.0.1:1",
    ]);
    let decision = dry_run_decision(&out).unwrap();
    assert_ne!(decision["action"], "bootstrap", "{decision}");
    assert!(
        decision["data_dir"]["has_data"].as_bool().unwrap(),
        "{decision}"
    );
    assert!(decision["data_dir"]["wal_error"].is_string(), "{decision}");
    assert!(wal.join("0000000000000000-0000000000000000.wal").exists());
}

#[test]
fn help_and_version_exit_zero() {
    assert_eq!(steward(&["--help"]).status.code(), Some(0));
    assert_eq!(steward(&["--version"]).status.code(), Some(0));
    assert_eq!(steward(&["init", "--help"]).status.code(), Some(0));
}

/// Mounts a small tmpfs (root only, as CI runs); unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn new(options: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(ok.success(), "mount tmpfs (the tests run as root)");
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

fn init_for_real(data: &std::path::Path) -> Output {
    let arg = format!("--data-dir={}", data.display());
    Command::new(env!("CARGO_BIN_EXE_etcd-steward"))
        .args([
            "init",
            "--name=etcd-0",
            "--replicas=1",
            "--etcd-bin=/bin/true",
            "--dns-server=127.0.0.1:9",
            &arg,
        ])
        .env("ETCD_STEWARD_LOG", "error")
        .output()
        .unwrap()
}

#[test]
fn a_full_data_disk_fails_with_one_line_naming_it() {
    let disk = Tmpfs::new("size=64k");
    let filler = disk.0.path().join("filler");
    let _ = std::fs::write(&filler, vec![7u8; 128 * 1024]);
    let kept = std::fs::metadata(&filler).map(|m| m.len()).unwrap_or(0);
    let out = init_for_real(disk.0.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot write in data directory") && stderr.contains("full"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::metadata(&filler).map(|m| m.len()).unwrap_or(0),
        kept,
        "nothing touched"
    );
}

#[test]
fn a_read_only_data_disk_fails_with_one_line_naming_it() {
    let disk = Tmpfs::new("size=64k,ro");
    let out = init_for_real(disk.0.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot write in data directory"),
        "{stderr}"
    );
}

/// `set-aside` lists the copies set aside on the volume (JSON with `-o json`), refuses a name
/// it did not list (exit 2, nothing removed), prints the plan for a listed one without
/// `--yes` and changes nothing, and removes that one only with `--yes`: never the live data,
/// never another copy.
#[test]
fn set_aside_lists_the_copies_and_removes_only_the_one_named_with_yes() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [("100-removed-member", 3), ("200-left", 7)] {
        let wal = dir.path().join("set-aside").join(name).join("member/wal");
        std::fs::create_dir_all(&wal).unwrap();
        std::fs::write(wal.join("0.wal"), vec![1u8; bytes]).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("member/wal")).unwrap();
    std::fs::write(dir.path().join("member/wal/0.wal"), b"live").unwrap();
    let data = format!("--data-dir={}", dir.path().display());
    let base = ["set-aside", "--name=etcd-0", "--replicas=3", data.as_str()];
    let run = |more: &[&str]| steward(&base.iter().chain(more).copied().collect::<Vec<_>>());

    let out = run(&["-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<_> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["100-removed-member", "200-left"]);
    assert_eq!(listed[1]["bytes"], 7);
    let text = String::from_utf8_lossy(&run(&[]).stdout).to_string();
    assert!(
        text.contains("200-left") && text.contains("2 copies"),
        "{text}"
    );

    for bad in ["../member", "300-left", "200-left/member"] {
        let out = run(&["--remove", bad, "--yes"]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let planned = run(&["--remove", "100-removed-member"]);
    assert!(planned.status.success());
    assert!(String::from_utf8_lossy(&planned.stdout).contains("100-removed-member"));
    assert!(
        dir.path().join("set-aside/100-removed-member").is_dir(),
        "the plan removed it"
    );

    let removed = run(&["--remove", "100-removed-member", "--yes"]);
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    assert!(!dir.path().join("set-aside/100-removed-member").exists());
    assert!(dir
        .path()
        .join("set-aside/200-left/member/wal/0.wal")
        .is_file());
    assert_eq!(
        std::fs::read(dir.path().join("member/wal/0.wal")).unwrap(),
        b"live"
    );
    refused(
        &["set-aside", "--name=etcd-0", "--replicas=3", "--yes"],
        "--remove",
    );
}

/// Every `etcd-steward …` command the docs, the chart's NOTES and the alerts tell an operator
/// to run (after `kubectl exec … --`, or quoted as code) parses with this binary: the same
/// words with `--help` last exit 0, so a renamed command or option in the CLI that the
/// runbooks still name fails here. Abbreviated (`…`), placeholder (`<…>`, `A | B`) and shell
/// (`$(…)`) forms are skipped; at least the runbooks' core commands must be found.
#[test]
fn every_command_the_docs_and_alerts_name_parses() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![
        root.join("README.md"),
        root.join("charts/etcd-steward/templates/NOTES.txt"),
        root.join("charts/etcd-steward/files/alerts.yaml"),
    ];
    let mut dirs = vec![root.join("docs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    let mut commands = std::collections::BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for line in text.lines() {
            let mut rest = line;
            while let Some(i) = rest.find("etcd-steward ") {
                let before = &rest[..i];
                let after = &rest[i + "etcd-steward ".len()..];
                rest = after;
                // After `-- ` (a kubectl exec) or inside a code span.
                let exec = before.trim_end().ends_with("--") || before.ends_with("/steward/");
                let quoted = before.ends_with('`') || before.ends_with("`/steward/");
                if !(exec || quoted) {
                    continue;
                }
                let end = after
                    .find(['`', '#', '|', '"', ')', ';', '\\'])
                    .unwrap_or(after.len());
                let words = after[..end].trim();
                if words.is_empty()
                    || ["…", "<", "$(", "NAME |", "..."]
                        .iter()
                        .any(|s| words.contains(s))
                    || !words.starts_with(|c: char| c.is_ascii_lowercase())
                {
                    continue;
                }
                commands.insert(words.to_string());
            }
        }
    }
    for core in [
        "recover",
        "recover --yes",
        "status",
        "status --history --since 1h",
        "backup --list",
        "set-aside --list",
    ] {
        assert!(
            commands.contains(core),
            "the docs no longer show `etcd-steward {core}`: is this test still reading them? found {commands:?}"
        );
    }
    for c in &commands {
        let mut args: Vec<&str> = c.split_whitespace().collect();
        args.push("--help");
        let mut out = steward(&args);
        // An option named without its value (`restore --to-time`, in a sentence): give it one.
        if String::from_utf8_lossy(&out.stderr).contains("a value is required") {
            args.insert(args.len() - 1, "VALUE");
            out = steward(&args);
        }
        assert!(
            out.status.success(),
            "the docs name `etcd-steward {c}`, which this binary does not parse: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
