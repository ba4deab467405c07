//! The shape of `src/`: which module may import which (docs/ARCHITECTURE.md, issue 25).
//!
//! Reads every `src/**/*.rs` at run time (except `main.rs`, the binary, and `lib.rs`, the
//! list of modules), finds each `crate::…`, `super::…` and `self::…` path outside comments,
//! string literals and test-only code (`#[cfg(test)]`, `#[cfg(any(test, feature =
//! "testing"))]`), resolves it to the longest module that exists, and checks the rules
//! below. A file is a module: `src/a.rs` and `src/a/mod.rs` are `a`, `src/a/b.rs` is `a::b`.
//! Every violation is listed in one run, each with its rule, place, path and fix.
#![allow(clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

// The checker's parts live in `tests/layers/` (one test binary).
#[path = "layers/cycles.rs"]
mod cycles;
#[path = "layers/rules.rs"]
mod rules;
#[path = "layers/scan.rs"]
mod scan;
#[cfg(test)]
#[path = "layers/synthetic.rs"]
mod synthetic;

use cycles::*;
use rules::*;
use scan::*;

// ----------------------------------------------------------------------------------------
// The rules, as data.
// ----------------------------------------------------------------------------------------

/// The layers, highest first. A module may import a module of a lower layer; of its own
/// layer only inside its own top-level module (its subtree), or as listed in
/// [`SAME_LAYER_ALLOWED`] / [`ROLE_EXCEPTIONS`]; of a higher layer never. Every top-level
/// module of `src/` must be in exactly one layer. Names that do not exist (yet, or any
/// more) are allowed, so the table holds through renames.
const LAYERS: &[Layer] = &[
    Layer {
        level: 5,
        name: "roles",
        // What a command or a container does from start to end: orchestrates the layers
        // below. The incident commands live in `recover` today (may become `commands`,
        // or `restore` for the restore command).
        modules: &[
            "init", "sidecar", "recover", "commands", "restore", "status", "leave",
        ],
    },
    Layer {
        level: 4,
        name: "config",
        // Built from the command-line options; hands each module its own settings. Imports
        // leaves and the settings types of the outside world, never a role.
        modules: &["config"],
    },
    Layer {
        level: 4,
        name: "test fakes",
        // Stand-ins for the outside world and the observers (`fake`): they import what they
        // imitate (the `Etcd`, `Dns`, `PeerReports` traits…), and only test code imports
        // them (rule 4). At this level so that they may import layers 1-3 but not config
        // or a role.
        modules: &["fake"],
    },
    Layer {
        level: 3,
        name: "shared observation and plans",
        // What more than one role observes and plans: the observer (today
        // `init::observe`), the recovery plan (today `recover::plan`) and init's pure
        // decision if it leaves `init/` (today `init::decide`; `sidecar` reads its `Why`).
        modules: &["observe", "recovery", "decision"],
    },
    Layer {
        level: 2,
        name: "outside world",
        // I/O with one outside system each, taking narrow settings: never `config`, an
        // observer or a role.
        modules: &[
            "etcd",
            "dns",
            "http_client",
            "http_get",
            "kube_api",
            "volume",
            "backup",
            "control",
            "report",
        ],
    },
    Layer {
        level: 1,
        name: "leaves",
        // Plain data, pure helpers and process plumbing; import nothing of the crate but
        // each other (as listed in SAME_LAYER_ALLOWED).
        modules: &[
            "facts", "identity", "tls", "clock", "units", "policy", "logs", "exec",
        ],
    },
];

/// Imports between two different top-level modules of the same layer (below the roles)
/// that are allowed: (from, to, why).
const SAME_LAYER_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "policy",
        "units",
        "a defragmentation threshold is a size, parsed and shown as every size is",
    ),
    (
        "decision",
        "recovery",
        "the pure decision asks the pure recovery plan when quorum is lost",
    ),
    (
        "backup",
        "etcd",
        "a snapshot is streamed from etcd, with etcd's credentials (`Auth`)",
    ),
    (
        "backup",
        "volume",
        "a restore writes its marker in the data directory as every marker there is written, durably (`write_atomically`)",
    ),
];

/// Roles importing another role: (from, to, why). Empty by design: what two roles share
/// belongs to a lower layer.
const ROLE_EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// The closed planners: pure functions of plain data. (which modules, what they may import).
/// A module is a planner if its path starts with one of `planner`'s prefixes; a segment
/// ending in `*` matches any name it starts.
const PLANNERS: &[Planner] = &[
    Planner {
        // The sidecar's jobs; the data they read lives in `sidecar/plan/observation.rs`.
        planner: &["sidecar::plan"],
        may_import: &["sidecar::plan"],
    },
    Planner {
        // init's pure decision (may be split into its types and its logic, and may move
        // to a top-level `decision`).
        planner: &["init::decide*", "init::decision*", "decision"],
        may_import: &[
            "init::decide*",
            "init::decision*",
            "init::upgrade",
            "decision",
            "recovery",
        ],
    },
];

/// What no planner may name (outside its tests): clocks, files, the network.
/// A segment ending in `*` matches any name it starts.
const PLANNER_BANNED: &[&str] = &[
    "std::time::Instant",
    "Instant::now",
    "SystemTime::now",
    "std::fs",
    "tokio::fs",
    "etcd_client",
    "hickory*",
    "reqwest",
    "hyper*",
];

/// The test fakes: reachable from test code only (rule 4).
const FAKE: &str = "fake";

/// No file in `src/` longer than this (rule 5).
const MAX_LINES: usize = 700;

struct Layer {
    level: u8,
    name: &'static str,
    modules: &'static [&'static str],
}

struct Planner {
    planner: &'static [&'static str],
    may_import: &'static [&'static str],
}

// ----------------------------------------------------------------------------------------
// The real tree.
// ----------------------------------------------------------------------------------------

#[test]
fn src_follows_the_layer_rules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let violations = check(&src);
    assert!(
        violations.is_empty(),
        "{} violation(s) of the layer rules in src/ (tests/layers.rs says why each rule \
         exists):\n\n{}",
        violations.len(),
        violations
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_layer_table_is_well_formed() {
    let mut seen = BTreeMap::new();
    for layer in LAYERS {
        for m in layer.modules {
            assert!(
                seen.insert(*m, layer.level).is_none(),
                "{m} is in two layers"
            );
        }
    }
    for (from, to, _) in SAME_LAYER_ALLOWED.iter().chain(ROLE_EXCEPTIONS) {
        let (f, t) = (layer_of(from), layer_of(to));
        assert!(
            f.is_some() && f == t,
            "{from} → {to}: not two modules of one layer"
        );
    }
    for (from, _, _) in ROLE_EXCEPTIONS {
        assert_eq!(
            layer_of(from),
            Some(5),
            "{from}: ROLE_EXCEPTIONS lists roles only"
        );
    }
    for (from, _, _) in SAME_LAYER_ALLOWED {
        assert_ne!(
            layer_of(from),
            Some(5),
            "{from}: roles go in ROLE_EXCEPTIONS"
        );
    }
}
