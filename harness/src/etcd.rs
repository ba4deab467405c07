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
