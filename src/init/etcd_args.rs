//! Pure: how etcd is started for a decision. etcd listens on the pod's IP (it refuses
//! host names in listen URLs) and advertises the stable DNS names.

use crate::config::Config;
use crate::facts::{EtcdVersion, MemberInfo};
use crate::identity::Identity;

/// How etcd joins the cluster when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartMode {
    /// The data directory holds this member's WAL: etcd ignores `--initial-cluster*`.
    Restart,
    /// As `Restart`, right after this member was restored: every initial member restored
    /// the same file, so etcd's check at start (each member hashing the whole database,
    /// and asking its peers for theirs, before it serves) has nothing to find.
    Restored,
    /// As `Restart`, forced to a one-member cluster (`--force-new-cluster`): a recovery.
    ForceNewCluster,
    /// A new cluster formed by all initial members with a fresh token.
    New {
        initial_cluster: String,
        token: String,
    },
    /// A member already added to a running cluster (learner or never-started entry),
    /// started with every member the cluster lists.
    Existing { members: Vec<MemberInfo> },
}

/// `--initial-cluster` for joining a running cluster: every listed member, named by its
/// published name, or (not started yet) by the pod its peer URL names, and this pod.
pub fn existing_initial_cluster(identity: &Identity, members: &[MemberInfo]) -> String {
    let me = identity.peer_url(identity.ordinal);
    let mut entries = Vec::new();
    for m in members {
        let name = if m.peer_urls.contains(&me) {
            identity.name()
        } else if !m.name.is_empty() {
            m.name.clone()
        } else {
            identity
                .ordinal_of_peer_urls(&m.peer_urls)
                .map(|o| identity.pod_name(o))
                .unwrap_or_else(|| format!("member-{:x}", m.id))
        };
        for url in &m.peer_urls {
            entries.push(format!("{name}={url}"));
        }
    }
    if !members.iter().any(|m| m.peer_urls.contains(&me)) {
        entries.push(format!("{}={me}", identity.name()));
    }
    entries.join(",")
}

/// How often etcd's own leader compares its followers' hashes (etcd's default is never):
/// the same as the sidecars' `--corruption-check-interval` default.
pub const ETCD_CORRUPT_CHECK_TIME: &str = "10m";

/// etcd's own corruption checks (issue 27), where the release `release` has them: the
/// check at start against the peers' hashes (a member whose data differs refuses to
/// start), the leader's periodic check, and (3.5.5+) the check after each compaction.
/// 3.6 names them as feature gates. Nothing for an unknown or older release (a flag it
/// does not know would stop it), and nothing a user set: a flag in `user_args` or its
/// `ETCD_…` variable in `user_env` (etcd reads both) keeps the user's value.
pub fn corruption_checks(
    release: Option<EtcdVersion>,
    user_args: &[String],
    user_env: &[String],
) -> Vec<String> {
    let given = |flag: &str| {
        let env = format!("ETCD_{}", flag.to_uppercase().replace('-', "_"));
        user_env.contains(&env)
            || user_args.iter().any(|a| {
                let a = a.trim_start_matches('-');
                a == flag || a.strip_prefix(flag).is_some_and(|r| r.starts_with('='))
            })
    };
    let mut out = Vec::new();
    let mut push = |flag: &str, value: &str| {
        if !given(flag) {
            out.push(format!("--{flag}={value}"));
        }
    };
    let Some(v) = release else {
        return out;
    };
    match (v.major, v.minor) {
        (3, 4) | (3, 5) => {
            push("experimental-initial-corrupt-check", "true");
            push("experimental-corrupt-check-time", ETCD_CORRUPT_CHECK_TIME);
            // Not in 3.5.1; in 3.5.30 (both checked with `etcd --help`).
            if v.minor == 5 && v.patch >= 5 {
                push("experimental-compact-hash-check-enabled", "true");
            }
        }
        (3, m) if m >= 6 => {
            push("corrupt-check-time", ETCD_CORRUPT_CHECK_TIME);
            // A user's own gates, or the deprecated flag of one, keep theirs.
            let mut gates = Vec::new();
            if !given("experimental-initial-corrupt-check") {
                gates.push("InitialCorruptCheck=true");
            }
            if !given("experimental-compact-hash-check-enabled") {
                gates.push("CompactHashCheck=true");
            }
            if !gates.is_empty() {
                push("feature-gates", &gates.join(","));
            }
        }
        _ => {}
    }
    out
}

/// The corruption checks ([`corruption_checks`]) etcd starts with for `mode`: all of them,
/// except the check at start for the members of a new cluster, which all start from the
/// same data (empty, or the same restored file).
pub fn checks_for(mode: &StartMode, checks: Vec<String>) -> Vec<String> {
    match mode {
        StartMode::New { .. } | StartMode::Restored => checks
            .into_iter()
            .filter(|c| !c.starts_with("--experimental-initial-corrupt-check="))
            .collect(),
        _ => checks,
    }
}

/// The full etcd command line (without the binary) for `mode`, then `checks` (see
/// [`corruption_checks`]), then the user's extras.
pub fn etcd_argv(
    cfg: &Config,
    mode: &StartMode,
    checks: &[String],
    extra: &[String],
) -> Vec<String> {
    let id = &cfg.identity;
    let listen = match cfg.listen_ip {
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    let mut argv = vec![
        format!("--name={}", id.name()),
        format!("--data-dir={}", cfg.data_dir.display()),
        format!(
            "--listen-peer-urls={}://{listen}:{}",
            id.peer_scheme, id.peer_port
        ),
        format!(
            "--listen-client-urls={}://{listen}:{}",
            id.client_scheme, id.client_port
        ),
        format!("--initial-advertise-peer-urls={}", id.peer_url(id.ordinal)),
        format!("--advertise-client-urls={}", id.client_url(id.ordinal)),
    ];
    if let Some(t) = &cfg.etcd.tls {
        argv.push(format!("--cert-file={}", t.files.cert.display()));
        argv.push(format!("--key-file={}", t.files.key.display()));
        argv.push(format!("--trusted-ca-file={}", t.files.ca.display()));
        argv.push("--client-cert-auth=true".into());
    }
    if let Some(t) = &cfg.peer_tls {
        argv.push(format!("--peer-cert-file={}", t.files.cert.display()));
        argv.push(format!("--peer-key-file={}", t.files.key.display()));
        argv.push(format!("--peer-trusted-ca-file={}", t.files.ca.display()));
        argv.push("--peer-client-cert-auth=true".into());
        if let Some(cn) = &cfg.peer_cert_allowed_cn {
            argv.push(format!("--peer-cert-allowed-cn={cn}"));
        }
    }
    match mode {
        StartMode::Restart | StartMode::Restored => {}
        StartMode::ForceNewCluster => argv.push("--force-new-cluster".into()),
        StartMode::New {
            initial_cluster,
            token,
        } => {
            argv.push(format!("--initial-cluster={initial_cluster}"));
            argv.push("--initial-cluster-state=new".into());
            argv.push(format!("--initial-cluster-token={token}"));
        }
        StartMode::Existing { members } => {
            let initial_cluster = existing_initial_cluster(id, members);
            argv.push(format!("--initial-cluster={initial_cluster}"));
            argv.push("--initial-cluster-state=existing".into());
        }
    }
    argv.extend(checks.iter().cloned());
    argv.extend(extra.iter().cloned());
    argv
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::{Cli, Command};

    fn config(listen_ip: &str) -> Config {
        let listen = format!("--listen-ip={listen_ip}");
        let argv = vec![
            "etcd-steward",
            "sidecar",
            "--name=etcd-1",
            "--replicas=3",
            &listen,
            "--data-dir=/var/lib/etcd",
        ];
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Sidecar(args)) => args.common.validate().unwrap_or_else(|e| panic!("{e}")),
            other => panic!("{other:?}"),
        }
    }

    fn member(id: u64, name: &str, o: u32) -> MemberInfo {
        MemberInfo {
            id,
            name: name.into(),
            peer_urls: vec![format!(
                "http://etcd-{o}.etcd.default.svc.cluster.local:2380"
            )],
            client_urls: vec![],
            is_learner: false,
        }
    }

    fn flags_after_common(argv: &[String]) -> Vec<&str> {
        argv.iter().skip(6).map(String::as_str).collect()
    }

    #[test]
    fn every_start_mode_has_its_own_flags() {
        let cfg = config("10.0.0.11");
        let common = etcd_argv(&cfg, &StartMode::Restart, &[], &[]);
        assert_eq!(
            common,
            [
                "--name=etcd-1",
                "--data-dir=/var/lib/etcd",
                "--listen-peer-urls=http://10.0.0.11:2380",
                "--listen-client-urls=http://10.0.0.11:2379",
                "--initial-advertise-peer-urls=http://etcd-1.etcd.default.svc.cluster.local:2380",
                "--advertise-client-urls=http://etcd-1.etcd.default.svc.cluster.local:2379",
            ]
        );
        let table: Vec<(StartMode, Vec<&str>)> = vec![
            (StartMode::Restart, vec![]),
            (
                StartMode::New {
                    initial_cluster: "etcd-0=a,etcd-1=b".into(),
                    token: "n0.n1".into(),
                },
                vec![
                    "--initial-cluster=etcd-0=a,etcd-1=b",
                    "--initial-cluster-state=new",
                    "--initial-cluster-token=n0.n1",
                ],
            ),
            (
                StartMode::Existing {
                    members: vec![member(0xa0, "etcd-0", 0), member(0xa1, "", 1), member(0xa2, "", 2)],
                },
                vec![
                    "--initial-cluster=etcd-0=http://etcd-0.etcd.default.svc.cluster.local:2380,etcd-1=http://etcd-1.etcd.default.svc.cluster.local:2380,etcd-2=http://etcd-2.etcd.default.svc.cluster.local:2380",
                    "--initial-cluster-state=existing",
                ],
            ),
        ];
        for (mode, want) in table {
            let argv = etcd_argv(&cfg, &mode, &[], &[]);
            assert_eq!(argv[..6], common[..], "{mode:?}");
            assert_eq!(flags_after_common(&argv), want, "{mode:?}");
        }
    }

    #[test]
    fn this_pod_is_added_to_an_existing_cluster_that_does_not_list_it_yet() {
        let id = config("10.0.0.11").identity;
        let ic = existing_initial_cluster(&id, &[member(0xa0, "etcd-0", 0), member(0xa9, "", 9)]);
        assert_eq!(
            ic,
            "etcd-0=http://etcd-0.etcd.default.svc.cluster.local:2380,etcd-9=http://etcd-9.etcd.default.svc.cluster.local:2380,etcd-1=http://etcd-1.etcd.default.svc.cluster.local:2380"
        );
    }

    #[test]
    fn ipv6_listen_addresses_are_bracketed_and_user_flags_come_last() {
        let cfg = config("fd00::11");
        let argv = etcd_argv(
            &cfg,
            &StartMode::Restart,
            &["--experimental-initial-corrupt-check=true".into()],
            &["--quota-backend-bytes=1".into()],
        );
        assert_eq!(
            argv[argv.len() - 2],
            "--experimental-initial-corrupt-check=true",
            "the checks come before the user's flags"
        );
        assert!(argv.contains(&"--listen-client-urls=http://[fd00::11]:2379".to_string()));
        assert_eq!(
            argv.last().map(String::as_str),
            Some("--quota-backend-bytes=1")
        );
    }

    fn v(text: &str) -> Option<EtcdVersion> {
        EtcdVersion::parse(text)
    }

    #[test]
    fn etcd_starts_with_the_corruption_checks_its_release_has() {
        let none: &[String] = &[];
        assert_eq!(
            corruption_checks(v("3.4.23"), none, none),
            [
                "--experimental-initial-corrupt-check=true",
                "--experimental-corrupt-check-time=10m"
            ]
        );
        assert_eq!(
            corruption_checks(v("3.5.1"), none, none),
            [
                "--experimental-initial-corrupt-check=true",
                "--experimental-corrupt-check-time=10m"
            ]
        );
        assert_eq!(
            corruption_checks(v("3.5.30"), none, none),
            [
                "--experimental-initial-corrupt-check=true",
                "--experimental-corrupt-check-time=10m",
                "--experimental-compact-hash-check-enabled=true"
            ]
        );
        assert_eq!(
            corruption_checks(v("3.6.6"), none, none),
            [
                "--corrupt-check-time=10m",
                "--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true"
            ]
        );
        // A release whose flags are not known: none (an unknown flag stops etcd).
        assert!(corruption_checks(None, none, none).is_empty());
        assert!(corruption_checks(v("3.3.27"), none, none).is_empty());
    }

    #[test]
    fn a_check_the_user_set_by_flag_or_variable_keeps_the_users_value() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let user = args(&["--experimental-initial-corrupt-check=false"]);
        assert_eq!(
            corruption_checks(v("3.5.30"), &user, &[]),
            [
                "--experimental-corrupt-check-time=10m",
                "--experimental-compact-hash-check-enabled=true"
            ]
        );
        // Single dash, bare boolean, and etcd's environment variable.
        let user = args(&["-experimental-compact-hash-check-enabled"]);
        let env = args(&["ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME"]);
        assert_eq!(
            corruption_checks(v("3.5.30"), &user, &env),
            ["--experimental-initial-corrupt-check=true"]
        );
        // A prefix of another flag is not that flag.
        let user = args(&["--experimental-corrupt-check-time-extra=1"]);
        assert_eq!(corruption_checks(v("3.4.23"), &user, &[]).len(), 2);
        // 3.6: the user's own gates keep theirs; a deprecated flag keeps its gate out.
        let user = args(&["--feature-gates=StopGRPCServiceOnDefrag=true"]);
        assert_eq!(
            corruption_checks(v("3.6.0"), &user, &[]),
            ["--corrupt-check-time=10m"]
        );
        let user = args(&["--experimental-initial-corrupt-check=false"]);
        assert_eq!(
            corruption_checks(v("3.6.0"), &user, &[]),
            [
                "--corrupt-check-time=10m",
                "--feature-gates=CompactHashCheck=true"
            ]
        );
    }

    #[test]
    fn a_new_or_just_restored_member_starts_without_the_check_at_start_and_keeps_the_others() {
        let all = corruption_checks(v("3.5.30"), &[], &[]);
        assert!(all
            .iter()
            .any(|c| c.starts_with("--experimental-initial-corrupt-check=")));
        for mode in [
            StartMode::Restored,
            StartMode::New {
                initial_cluster: "etcd-0=http://a:2380".into(),
                token: "t".into(),
            },
        ] {
            let kept = checks_for(&mode, all.clone());
            assert_eq!(kept.len(), all.len() - 1, "{mode:?}: {kept:?}");
            assert!(kept.iter().all(|c| !c.contains("initial-corrupt-check")));
            assert!(kept
                .iter()
                .any(|c| c.starts_with("--experimental-corrupt-check-time=")));
        }
        assert_eq!(
            checks_for(&StartMode::Restart, all.clone()),
            all,
            "a restart checks"
        );
    }

    #[test]
    fn every_flag_of_every_start_is_one_each_release_accepts() {
        use crate::init::releases::{accepts, name_of, RELEASES_CHECKED};
        let cfg = config("10.0.0.1");
        let modes = [
            StartMode::Restart,
            StartMode::Restored,
            StartMode::ForceNewCluster,
            StartMode::New {
                initial_cluster: "etcd-0=a".into(),
                token: "t".into(),
            },
            StartMode::Existing {
                members: vec![member(1, "etcd-0", 0)],
            },
        ];
        for r in RELEASES_CHECKED {
            let release = EtcdVersion::parse(r).unwrap_or_else(|| panic!("{r}"));
            let checks = corruption_checks(Some(release), &[], &[]);
            for mode in &modes {
                for arg in etcd_argv(&cfg, mode, &checks_for(mode, checks.clone()), &[]) {
                    assert_eq!(
                        accepts(release, name_of(&arg)),
                        Some(true),
                        "init would start etcd {r} ({mode:?}) with {arg}: not a flag of that release in init::releases::FLAGS"
                    );
                }
            }
        }
    }
}
