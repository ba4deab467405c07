//! Which etcd flags each release accepts: every flag `init` may pass
//! ([`super::etcd_args::etcd_argv`], [`super::etcd_args::corruption_checks`]), with the
//! release that added it and the one that removed it. A flag a release does not know stops
//! that etcd at start, so `init` passes only flags its running release accepts (tested
//! against this table for every release in [`RELEASES_CHECKED`], and the table against the
//! real `etcd --help` of 3.4.23, 3.5.1 and 3.5.30 in `tests/upgrade.rs`).
//!
//! Sources: etcd's CHANGELOG-3.5, CHANGELOG-3.6 and the upgrade guides (etcd.io/docs/v3.6/
//! upgrades/upgrade_3_6 "Flags added / removed"; v3.7 removes every `--experimental-*` flag
//! deprecated in 3.6 and names them as feature gates or plain flags); 3.6 and 3.7 were not run
//! here (no binary reachable).

use crate::facts::EtcdVersion;

/// One flag: accepted from `since`, removed in `removed` (exclusive).
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    pub name: &'static str,
    pub since: (u32, u32, u32),
    pub removed: Option<(u32, u32, u32)>,
}

const fn flag(
    name: &'static str,
    since: (u32, u32, u32),
    removed: Option<(u32, u32, u32)>,
) -> Flag {
    Flag {
        name,
        since,
        removed,
    }
}

const ANY: (u32, u32, u32) = (3, 4, 0);

/// Every flag `init` may pass.
pub const FLAGS: &[Flag] = &[
    flag("name", ANY, None),
    flag("data-dir", ANY, None),
    flag("listen-peer-urls", ANY, None),
    flag("listen-client-urls", ANY, None),
    flag("initial-advertise-peer-urls", ANY, None),
    flag("advertise-client-urls", ANY, None),
    flag("cert-file", ANY, None),
    flag("key-file", ANY, None),
    flag("trusted-ca-file", ANY, None),
    flag("client-cert-auth", ANY, None),
    flag("peer-cert-file", ANY, None),
    flag("peer-key-file", ANY, None),
    flag("peer-trusted-ca-file", ANY, None),
    flag("peer-client-cert-auth", ANY, None),
    flag("peer-cert-allowed-cn", ANY, None),
    flag("force-new-cluster", ANY, None),
    flag("initial-cluster", ANY, None),
    flag("initial-cluster-state", ANY, None),
    flag("initial-cluster-token", ANY, None),
    // The corruption checks: experimental in 3.4 and 3.5, gates and a plain flag in 3.6,
    // the experimental names gone in 3.7.
    flag("experimental-initial-corrupt-check", ANY, Some((3, 7, 0))),
    flag("experimental-corrupt-check-time", ANY, Some((3, 7, 0))),
    flag(
        "experimental-compact-hash-check-enabled",
        (3, 5, 5),
        Some((3, 7, 0)),
    ),
    flag("corrupt-check-time", (3, 6, 0), None),
    flag("feature-gates", (3, 6, 0), None),
];

/// The releases the table is checked for: each one `init` supports, and the edges.
pub const RELEASES_CHECKED: &[&str] = &[
    "3.4.23", "3.4.29", "3.5.1", "3.5.4", "3.5.5", "3.5.30", "3.6.0", "3.6.5", "3.7.0",
];

/// Whether `release` accepts `--name` (the flag's name without dashes or value); `None`
/// when the table does not know the flag.
pub fn accepts(release: EtcdVersion, name: &str) -> Option<bool> {
    let f = FLAGS.iter().find(|f| f.name == name)?;
    let v = (release.major, release.minor, release.patch);
    Some(v >= f.since && f.removed.is_none_or(|r| v < r))
}

/// The flag's name in `--name=value` (or `--name`).
pub fn name_of(arg: &str) -> &str {
    let a = arg.trim_start_matches('-');
    a.split_once('=').map_or(a, |(n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::etcd_args::corruption_checks;

    #[test]
    fn every_flag_init_passes_is_one_its_release_accepts() {
        for r in RELEASES_CHECKED {
            let release = EtcdVersion::parse(r).unwrap_or_else(|| panic!("{r}"));
            for arg in corruption_checks(Some(release), &[], &[]) {
                assert_eq!(
                    accepts(release, name_of(&arg)),
                    Some(true),
                    "init passes {arg} to etcd {r}, which does not accept it"
                );
            }
        }
    }

    #[test]
    fn the_table_knows_that_3_7_dropped_the_experimental_flags() {
        let v37 = EtcdVersion::parse("3.7.0").unwrap_or_else(|| panic!("3.7.0"));
        for f in FLAGS.iter().filter(|f| f.name.starts_with("experimental-")) {
            assert_eq!(accepts(v37, f.name), Some(false), "{}", f.name);
        }
        let v351 = EtcdVersion::parse("3.5.1").unwrap_or_else(|| panic!("3.5.1"));
        assert_eq!(
            accepts(v351, "experimental-compact-hash-check-enabled"),
            Some(false)
        );
        assert_eq!(accepts(v351, "feature-gates"), Some(false));
    }
}
