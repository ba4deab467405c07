//! Which etcd a pod runs, and where its binary is on this machine.

use std::path::PathBuf;

/// Which etcd a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Etcd {
    /// etcd 3.5.1 (`ETCD_3_5_BIN`, or `.tools/etcd-v3.5.1/etcd` of the repository; in
    /// Docker, the image's own: a current 3.5, 3.5.30 by default).
    V3_5,
    /// Debian's etcd 3.4.23 (`ETCD_3_4_BIN`, or /usr/bin/etcd).
    V3_4,
    /// etcd 3.5.1 with TLS for clients and peers (loopback only).
    V3_5Tls,
    /// A current etcd 3.5: Debian unstable's 3.5.30 (`ETCD_3_5_CURRENT_BIN`, or
    /// `.tools/etcd-v3.5.30/etcd`; loopback only). 3.5.0–3.5.2 have a known data-inconsistency
    /// bug, so the scenarios also run against a current release.
    V3_5Current,
}

impl Etcd {
    /// etcd's offline tool for this release, beside its binary: etcdutl (3.5), etcdctl
    /// (3.4, which the agent runs as `ETCDCTL_API=3 etcdctl`).
    pub fn offline_tool(self) -> PathBuf {
        let tool = match self {
            Etcd::V3_4 => "etcdctl",
            _ => "etcdutl",
        };
        self.bin().with_file_name(tool)
    }

    /// Whether clients and peers talk TLS.
    pub fn tls(self) -> bool {
        self == Etcd::V3_5Tls
    }

    /// The binary on this machine; panics naming how to install it when it is missing
    /// (CI installs both with `scripts/install-test-deps.sh`).
    pub fn bin(self) -> PathBuf {
        let (var, default) = match self {
            Etcd::V3_5 | Etcd::V3_5Tls => (
                "ETCD_3_5_BIN",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../.tools/etcd-v3.5.1/etcd"),
            ),
            Etcd::V3_4 => ("ETCD_3_4_BIN", "/usr/bin/etcd"),
            Etcd::V3_5Current => (
                "ETCD_3_5_CURRENT_BIN",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../.tools/etcd-v3.5.30/etcd"),
            ),
        };
        let path = std::env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(default));
        assert!(
            path.exists(),
            "etcd for {self:?} not found at {path:?}: run .ci/run (or scripts/install-test-deps.sh) or set {var}"
        );
        path
    }
}

/// One `#[tokio::test]` per etcd release for each scenario `async fn scenario(etcd: Etcd)` of
/// an integration test file: the releases by their [`Etcd`] variants, in brackets.
///
/// A module per release, holding a test per scenario (`etcd_3_5::scenario`,
/// `etcd_3_4::scenario`, `etcd_3_5_current::scenario`, `etcd_3_5_tls::scenario`):
///
/// ```ignore
/// harness::per_etcd_version!([V3_5, V3_4]: a_scenario, another_scenario);
/// ```
///
/// Or a module per scenario, named apart from its function, holding a test per release
/// (`short::etcd_3_5`, …):
///
/// ```ignore
/// harness::per_etcd_version!([V3_5, V3_4] by scenario: short => a_scenario_with_a_long_name);
/// ```
#[macro_export]
macro_rules! per_etcd_version {
    // A module per release.
    ([$($etcd:ident),+ $(,)?]: $($scenario:ident),* $(,)?) => {
        $crate::per_etcd_version!(@modules [$($etcd),+] [$($scenario),*]);
    };
    // A module per scenario.
    ($releases:tt by scenario: $($module:ident => $scenario:ident),* $(,)?) => {$(
        mod $module {
            $crate::per_etcd_version!(@releases $releases super::$scenario);
        }
    )*};

    (@modules [$($etcd:ident),+] $scenarios:tt) => {
        $($crate::per_etcd_version!(@release $etcd module $scenarios);)+
    };
    (@releases [$($etcd:ident),+ $(,)?] $scenario:path) => {
        $($crate::per_etcd_version!(@release $etcd test $scenario);)+
    };
    // A release's name in a test's path.
    (@release V3_5 $($what:tt)+) => { $crate::per_etcd_version!(@named etcd_3_5 V3_5 $($what)+); };
    (@release V3_4 $($what:tt)+) => { $crate::per_etcd_version!(@named etcd_3_4 V3_4 $($what)+); };
    (@release V3_5Current $($what:tt)+) => {
        $crate::per_etcd_version!(@named etcd_3_5_current V3_5Current $($what)+);
    };
    (@release V3_5Tls $($what:tt)+) => {
        $crate::per_etcd_version!(@named etcd_3_5_tls V3_5Tls $($what)+);
    };
    (@named $name:ident $etcd:ident module [$($scenario:ident),*]) => {
        #[doc = concat!("The scenarios against `Etcd::", stringify!($etcd), "`.")]
        mod $name {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario($crate::Etcd::$etcd).await;
                }
            )*
        }
    };
    (@named $name:ident $etcd:ident test $scenario:path) => {
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $scenario($crate::Etcd::$etcd).await
        }
    };
}

/// The release an etcd binary is, from the first line of its `etcd --version`
/// (`etcd Version: 3.5.30`): major, minor, patch. Panics naming the binary when it says
/// none: what a check holds a run to must never turn itself off on an answer it cannot read.
pub fn release(bin: &std::path::Path) -> (u32, u32, u32) {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("running {} --version: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("etcd Version:"))
        .and_then(|v| {
            let mut parts = v.trim().trim_start_matches('v').split('.');
            let mut next = || parts.next()?.parse::<u32>().ok();
            Some((next()?, next()?, next()?))
        });
    parsed.unwrap_or_else(|| panic!("{} --version names no release: {text:?}", bin.display()))
}

/// Whether etcd release `(major, minor, patch)`'s offline tool restores a snapshot with the
/// revision moved forward (`snapshot restore --bump-revision N --mark-compacted`): etcdutl
/// from 3.5.10 (etcd pull request 16165), etcdctl 3.4 from 3.4.27 (pull request 16193),
/// every release after 3.5. Here: 3.5.30 can, 3.5.1 and 3.4.23 cannot. Decided from the
/// release under test, never from a `--help` text, so that a restore whose revision does not
/// jump where it must is caught rather than left unchecked.
pub fn release_can_jump((major, minor, patch): (u32, u32, u32)) -> bool {
    match (major, minor) {
        (3, 4) => patch >= 27,
        (3, 5) => patch >= 10,
        (3, m) => m > 5,
        (m, _) => m > 3,
    }
}

/// Whether `tool`'s `snapshot restore` can move the revision forward (`--bump-revision`):
/// only a recent etcdutl 3.5 (here 3.5.30's).
pub fn tool_can_jump(tool: &std::path::Path) -> bool {
    std::process::Command::new(tool)
        .args(["snapshot", "restore", "--help"])
        .env("ETCDCTL_API", "3")
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout).contains("--bump-revision")
                || String::from_utf8_lossy(&o.stderr).contains("--bump-revision")
        })
}

/// What a pod restoring with `tool` needs besides `--etcdutl-bin`: with a tool that cannot
/// move the revision forward (etcd 3.4's etcdctl, etcdutl 3.5.1), `init` and the sidecar
/// refuse to start unless the jump is turned off, so these scenarios say so
/// (`--restore-bump-revision=0`); with one that can, nothing.
pub fn jump_args(tool: &std::path::Path) -> Vec<String> {
    if tool_can_jump(tool) {
        Vec::new()
    } else {
        vec!["--restore-bump-revision=0".into()]
    }
}
