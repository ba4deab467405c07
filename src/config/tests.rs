//! Option parsing and validation, through `Cli::try_parse_from`.

use clap::Parser;

use super::*;

fn parse(args: &[&str]) -> Cli {
    match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => panic!("parse failed: {e}"),
    }
}

fn common(args: &[&str]) -> CommonArgs {
    let mut full = vec!["etcd-steward", "sidecar", "--hostname-fallback", ""];
    full.extend_from_slice(args);
    match parse(&full).command {
        Command::Sidecar(s) => s.common,
        _ => unreachable!(),
    }
}

#[test]
fn scale_in_needs_the_api_and_an_interval_of_at_least_a_second() {
    let base = [
        "--name",
        "etcd-4",
        "--replicas",
        "3",
        "--kubernetes-service-host=",
    ];
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        common(&a).validate()
    };
    let problems = |r: Result<Config, ConfigError>| match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.problems.join("; "),
    };
    assert!(problems(with(&["--scale-in"])).contains("--scale-in needs the Kubernetes API"));
    let p = problems(with(&[
        "--scale-in",
        "--kube-api-url=http://127.0.0.1:8001",
        "--scale-in-interval=0s",
    ]));
    assert!(
        p.contains("--scale-in-interval must be a duration of at least 1s"),
        "{p}"
    );
    assert!(problems(with(&[
        "--scale-in",
        "--kube-api-url=https://10.96.0.1",
        "--kube-ca-file=/nonexistent/ca.crt"
    ]))
    .contains("--kube-ca-file"));
    let c = match with(&["--scale-in", "--kube-api-url=http://127.0.0.1:8001"]) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(c.scale_in, Some(Duration::from_secs(10)));
    assert_eq!(c.kube.map(|k| k.statefulset), Some("etcd".to_string()));
    // Off by default; in a cluster the API's address is known all the same (for the
    // preStop hook, `leave --if-scaled-in`).
    let c = match common(&[
        "--name",
        "etcd-0",
        "--replicas",
        "3",
        "--kubernetes-service-host=10.96.0.1",
        "--kubernetes-service-port=443",
    ])
    .validate()
    {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(c.scale_in, None);
    assert_eq!(
        c.kube.map(|k| k.url),
        Some("https://10.96.0.1:443".to_string())
    );
}

#[test]
fn defaults_follow_the_statefulset_conventions() {
    let c = common(&["--name", "etcd-2", "--replicas", "3"]).validate();
    let c = c.map_err(|e| e.to_string());
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(c.identity.set_name, "etcd");
    assert_eq!(c.identity.service, "etcd");
    assert_eq!(c.identity.ordinal, 2);
    assert_eq!(c.identity.host(2), "etcd-2.etcd.default.svc.cluster.local");
    assert_eq!(c.data_dir, PathBuf::from("/var/lib/etcd"));
    assert_eq!(
        (c.identity.client_port, c.identity.peer_port, c.http_port),
        (2379, 2380, 8080)
    );
    assert_eq!(c.learner_stall_timeout, Duration::from_secs(300));
    assert_eq!(c.corruption_check, Some(Duration::from_secs(600)));
    assert!(c.dns_server.is_none());
}

#[test]
fn every_broken_constraint_is_reported_in_one_run() {
    let err = common(&[
        "--name",
        "etcd",
        "--replicas",
        "0",
        "--client-port",
        "70000",
        "--peer-port",
        "8080",
        "--listen-ip",
        "pod.local",
        "--dns-server",
        "10.0.0.1",
        "--learner-stall-timeout",
        "soon",
    ])
    .validate()
    .err()
    .map(|e| e.problems)
    .unwrap_or_default();
    let text = err.join("\n");
    for needle in [
        "-<ordinal>",
        "--replicas",
        "--client-port",
        "--peer-port and --http-port must differ",
        "--listen-ip",
        "--dns-server",
        "--learner-stall-timeout",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert_eq!(err.len(), 7, "{text}");
}

#[test]
fn missing_name_falls_back_to_hostname() {
    let full = [
        "etcd-steward",
        "sidecar",
        "--hostname-fallback",
        "db-4",
        "--replicas",
        "5",
    ];
    let Command::Sidecar(s) = parse(&full).command else {
        unreachable!()
    };
    let c = s.common.validate().map_err(|e| e.to_string());
    assert_eq!(c.map(|c| c.identity.ordinal), Ok(4));
}

#[test]
fn init_takes_extra_etcd_args_after_double_dash() {
    let Command::Init(i) = parse(&[
        "etcd-steward",
        "init",
        "--name",
        "etcd-0",
        "--replicas",
        "1",
        "--dry-run",
        "--",
        "--quota-backend-bytes",
        "8589934592",
    ])
    .command
    else {
        unreachable!()
    };
    assert!(i.dry_run);
    assert_eq!(i.etcd_args, ["--quota-backend-bytes", "8589934592"]);
}

#[test]
fn a_missing_etcd_binary_is_a_configuration_error() {
    let Command::Init(i) = parse(&[
        "etcd-steward",
        "init",
        "--name",
        "etcd-0",
        "--replicas",
        "1",
        "--etcd-bin",
        "/nonexistent/etcd",
    ])
    .command
    else {
        unreachable!()
    };
    let err = i
        .validate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("--etcd-bin \"/nonexistent/etcd\" does not exist"),
        "{err}"
    );
}

#[test]
fn status_history_takes_since_as_a_duration_and_since_needs_history() {
    match parse(&[
        "etcd-steward",
        "status",
        "--hostname-fallback",
        "",
        "--history",
        "--since",
        "1h",
    ])
    .command
    {
        Command::Status(a) => {
            assert!(a.history);
            assert_eq!(a.since, Some(std::time::Duration::from_secs(3600)));
        }
        _ => panic!("status parses as status"),
    }
    assert!(Cli::try_parse_from(["etcd-steward", "status", "--since", "1h"]).is_err());
    assert!(
        Cli::try_parse_from(["etcd-steward", "status", "--history", "--since", "soon"]).is_err()
    );
}

#[test]
fn unknown_options_are_rejected_by_the_parser() {
    assert!(Cli::try_parse_from(["etcd-steward", "init", "--bogus"]).is_err());
}

/// Backup options (issue 10).
#[allow(clippy::unwrap_used)]
mod backup_options {
    use super::*;

    #[test]
    fn without_a_backup_url_there_are_no_backups() {
        let c = common(&["--name", "etcd-0", "--replicas", "3"])
            .validate()
            .unwrap();
        assert_eq!(c.backup, None);
    }

    #[test]
    fn backup_options_default_to_latest_restore_every_30m_keeping_48() {
        let c = common(&[
            "--name",
            "etcd-0",
            "--replicas",
            "3",
            "--backup-url",
            "s3://bucket/etcd",
        ])
        .validate()
        .unwrap();
        let b = c.backup.unwrap();
        assert_eq!(b.url, "s3://bucket/etcd");
        assert_eq!(b.interval, Duration::from_secs(1800));
        assert_eq!(b.keep, 48);
        assert_eq!(b.archive_interval, Some(Duration::from_secs(5)));
        assert_eq!(b.restore, crate::backup::RestoreChoice::Latest);
        // Which tool is found depends on this machine's PATH (tool.rs tests the search).
        assert_eq!(b.tool.bump_revision, 1_000_000_000);
    }

    #[test]
    fn bad_backup_options_are_reported_with_the_others() {
        let e = common(&[
            "--name",
            "etcd-0",
            "--replicas",
            "0",
            "--backup-url",
            "ftp://x",
            "--backup-interval",
            "soon",
            "--backup-keep",
            "0",
            "--restore",
            "../x",
            "--restore-bump-revision",
            "1e9",
        ])
        .validate()
        .unwrap_err();
        let all = e.problems.join("\n");
        for flag in [
            "--replicas",
            "--backup-url",
            "--backup-interval",
            "--backup-keep",
            "--restore",
            "--restore-bump-revision",
        ] {
            assert!(all.contains(flag), "{flag} missing from {all}");
        }
    }

    #[test]
    fn archive_interval_zero_turns_archiving_off_and_a_bad_one_is_named() {
        let with = |value: &str| {
            common(&[
                "--name",
                "etcd-0",
                "--replicas",
                "3",
                "--backup-url",
                "file:///b",
                "--archive-interval",
                value,
            ])
            .validate()
        };
        let off = with("0").unwrap().backup.unwrap();
        assert_eq!(off.archive_interval, None);
        let minute = with("1m").unwrap().backup.unwrap();
        assert_eq!(minute.archive_interval, Some(Duration::from_secs(60)));
        for bad in ["soon", "100ms"] {
            let e = with(bad).unwrap_err();
            assert!(
                e.problems.iter().any(|p| p.contains("--archive-interval")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_named_restore_needs_a_backup_url() {
        let e = common(&["--name", "etcd-0", "--replicas", "1", "--restore", "latest"])
            .validate()
            .unwrap_err();
        assert!(e.problems[0].contains("--backup-url"), "{e}");
        let c = common(&[
            "--name",
            "etcd-0",
            "--replicas",
            "1",
            "--backup-url",
            "file:///b",
            "--restore",
            "never",
            "--etcdutl-bin",
            "/usr/bin/etcdctl",
        ])
        .validate()
        .unwrap();
        let b = c.backup.unwrap();
        assert_eq!(b.restore, crate::backup::RestoreChoice::Never);
        assert_eq!(b.tool.kind, crate::backup::tool::ToolKind::Etcdctl);
    }
}
#[test]
fn defrag_options_default_on_and_bad_ones_name_their_constraint() {
    let c = match common(&["--name", "etcd-0", "--replicas", "3"]).validate() {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let t = c.defrag.threshold.map(|t| (t.free_percent, t.free_bytes));
    assert_eq!(t, Some((50, 100 << 20)));
    assert_eq!(c.defrag.schedule, None);
    assert_eq!(c.defrag.quota, 2 << 30);
    let c = common(&[
        "--name",
        "etcd-0",
        "--replicas",
        "3",
        "--defrag-threshold",
        "0",
        "--defrag-schedule",
        "24h",
        "--quota-backend-bytes",
        "16MiB",
    ])
    .validate();
    let c = c.map_err(|e| e.to_string());
    assert!(
        matches!(&c, Ok(c) if c.defrag.threshold.is_none()
        && c.defrag.schedule == Some(Duration::from_secs(86_400))
        && c.defrag.quota == 16 << 20),
        "{c:?}"
    );
    let e = common(&[
        "--name",
        "etcd-0",
        "--replicas",
        "3",
        "--defrag-threshold",
        "half",
        "--defrag-schedule",
        "1s",
        "--quota-backend-bytes",
        "lots",
    ])
    .validate();
    let text = e
        .map(|_| ())
        .map_err(|e| e.to_string())
        .err()
        .unwrap_or_default();
    assert!(text.contains("--defrag-threshold"), "{text}");
    assert!(
        text.contains("--defrag-schedule must be a duration of at least 1m"),
        "{text}"
    );
    assert!(text.contains("--quota-backend-bytes"), "{text}");
}

#[test]
fn a_tool_that_cannot_jump_the_revision_is_refused_unless_the_jump_is_off() {
    use crate::backup::EtcdTool;
    let mut tool = EtcdTool::from_bin("/usr/bin/etcdctl");
    tool.bump_revision = 1_000_000_000;
    tool.can_bump = false;
    let problem = jump_refused(&tool).unwrap_or_default();
    assert!(problem.contains("/usr/bin/etcdctl"), "{problem}");
    assert!(problem.contains("--restore-bump-revision 0"), "{problem}");
    tool.bump_revision = 0;
    assert_eq!(jump_refused(&tool), None);
    tool.bump_revision = 5;
    tool.can_bump = true;
    assert_eq!(jump_refused(&tool), None);
}

#[test]
#[allow(clippy::unwrap_used)]
fn restore_takes_a_revision_to_go_back_to() {
    let with = |restore: &str| {
        common(&[
            "--name",
            "etcd-0",
            "--replicas",
            "1",
            "--backup-url",
            "file:///b",
            "--restore",
            restore,
            "--etcdutl-bin",
            "/usr/bin/etcdctl",
        ])
        .validate()
    };
    let b = with("revision:4211").unwrap().backup.unwrap();
    assert_eq!(b.restore, crate::backup::RestoreChoice::Revision(4211));
    let e = with("revision:soon").unwrap_err();
    assert!(e.problems[0].contains("revision:N"), "{e}");
}

#[test]
#[allow(clippy::unwrap_used)]
fn restore_to_a_time_is_the_moment_in_unix_milliseconds_and_a_time_without_zone_is_refused() {
    let with = |restore: &str| {
        common(&[
            "--name",
            "etcd-0",
            "--replicas",
            "1",
            "--backup-url",
            "file:///b",
            "--restore",
            restore,
            "--etcdutl-bin",
            "/usr/bin/etcdctl",
        ])
        .validate()
    };
    let b = with("time:2026-11-27T10:01:59Z").unwrap().backup.unwrap();
    assert_eq!(
        b.restore,
        crate::backup::RestoreChoice::Time(1_795_773_719_000)
    );
    let b = with("time:2026-11-27T10:01:59.250Z")
        .unwrap()
        .backup
        .unwrap();
    assert_eq!(
        b.restore,
        crate::backup::RestoreChoice::Time(1_795_773_719_250)
    );
    // The same moment with the offset `date -Iseconds` prints in another zone.
    let b = with("time:2026-11-27T11:01:59+01:00")
        .unwrap()
        .backup
        .unwrap();
    assert_eq!(
        b.restore,
        crate::backup::RestoreChoice::Time(1_795_773_719_000)
    );
    for bad in ["time:yesterday", "time:2026-11-27 10:01:59", "time:"] {
        let e = with(bad).unwrap_err();
        assert!(
            e.problems[0].starts_with("--restore time:T needs an RFC 3339 time with its offset")
                && e.problems[0].contains("2026-11-27T10:01:59Z"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn corruption_check_interval_zero_turns_the_check_off_and_a_bad_one_is_named() {
    let with = |value: &str| {
        common(&[
            "--name",
            "etcd-0",
            "--replicas",
            "3",
            "--corruption-check-interval",
            value,
        ])
        .validate()
    };
    assert_eq!(with("0").map(|c| c.corruption_check), Ok(None));
    assert_eq!(
        with("2s").map(|c| c.corruption_check),
        Ok(Some(Duration::from_secs(2)))
    );
    for bad in ["often", "100ms"] {
        let Err(e) = with(bad) else {
            panic!("{bad} accepted")
        };
        assert!(
            e.problems
                .iter()
                .any(|p| p.contains("--corruption-check-interval")),
            "{bad}: {e}"
        );
    }
}

#[test]
fn issued_certificates_exclude_given_tls_files_and_a_pinned_peer_name_needs_peer_tls() {
    let problems = |args: &[&str]| {
        let mut full = vec!["--name", "etcd-0", "--replicas", "3"];
        full.extend_from_slice(args);
        match common(&full).validate() {
            Ok(_) => panic!("accepted {args:?}"),
            Err(e) => e.problems.join("; "),
        }
    };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let issuer = format!("--tls-issuer-dir={}", dir.path().display());
    let p = problems(&[issuer.as_str(), "--peer-cert-file=/x"]);
    assert!(p.contains("exclude each other"), "{p}");
    // A CA that is not there is named, not issued from.
    assert!(
        p.contains("peer-ca.crt") || p.contains("peer-ca.key"),
        "{p}"
    );
    let p = problems(&["--peer-cert-allowed-cn=etcd-peer"]);
    assert!(p.contains("--peer-cert-allowed-cn needs peer TLS"), "{p}");
}
