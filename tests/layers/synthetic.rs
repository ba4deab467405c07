//! The checker on small trees written into a temporary directory.

use std::collections::BTreeSet;

use super::*;

/// A `src/` with the given files (path → text) and a `lib.rs`.
fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    if !files.iter().any(|(p, _)| *p == "lib.rs") {
        std::fs::write(src.join("lib.rs"), "").expect("write lib.rs");
    }
    for (path, text) in files {
        let p = src.join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }
    dir
}

fn refs_of(files: &[(&str, &str)]) -> Vec<(String, String, String, usize)> {
    let dir = tree(files);
    let mut all = Vec::new();
    let mut nodes = BTreeSet::new();
    let mut loaded = Vec::new();
    for p in rs_files(dir.path()) {
        let rel = p
            .strip_prefix(dir.path())
            .expect("inside")
            .to_string_lossy()
            .into_owned();
        if rel == "lib.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("read");
        nodes.insert(node_of(&rel));
        loaded.push(SrcFile {
            node: node_of(&rel),
            rel,
            code: non_test_code(&text),
        });
    }
    for f in &loaded {
        for r in references(f, &nodes) {
            all.push((show(&r.from), show(&r.to), r.name, r.line));
        }
    }
    all
}

fn rules(v: &[Violation]) -> Vec<&'static str> {
    v.iter().map(|v| v.rule).collect()
}

fn edge(from: &str, to: &str, name: &str, line: usize) -> (String, String, String, usize) {
    (from.to_string(), to.to_string(), name.to_string(), line)
}

#[test]
fn grouped_use_gives_each_leaf() {
    let r = refs_of(&[
        (
            "etcd.rs",
            "use crate::{facts::Facts, volume::{self, marker::{Marker, Kind}}};\n",
        ),
        ("facts.rs", ""),
        ("volume/mod.rs", ""),
        ("volume/marker.rs", ""),
    ]);
    assert_eq!(
        r,
        vec![
            edge("etcd", "facts", "Facts", 1),
            edge("etcd", "volume", "volume", 1),
            edge("etcd", "volume::marker", "Marker", 1),
            edge("etcd", "volume::marker", "Kind", 1),
        ]
    );
}

#[test]
fn multi_line_groups_and_inline_paths_have_their_lines() {
    let r = refs_of(&[
        ("etcd.rs", "use crate::{\n    facts::Facts,\n    tls as t,\n};\nfn f() { crate::tls::load::<u8>(); }\n"),
        ("facts.rs", ""),
        ("tls.rs", ""),
    ]);
    assert_eq!(
        r,
        vec![
            edge("etcd", "facts", "Facts", 2),
            edge("etcd", "tls", "tls", 3),
            edge("etcd", "tls", "load", 5)
        ]
    );
}

#[test]
fn super_in_mod_rs_is_the_crate_root_and_in_a_file_its_folder() {
    let r = refs_of(&[
        (
            "a/mod.rs",
            "use super::facts::Facts;\nuse self::b::B;\nfn f() { b::go() }\n",
        ),
        (
            "a/b.rs",
            "use super::A;\nuse super::super::facts::F2;\nuse super::c::*;\n",
        ),
        ("a/c.rs", ""),
        ("facts.rs", ""),
    ]);
    assert_eq!(
        r,
        vec![
            edge("a::b", "a", "A", 1),
            edge("a::b", "facts", "F2", 2),
            edge("a::b", "a::c", "*", 3),
            edge("a", "facts", "Facts", 1),
            edge("a", "a::b", "B", 2),
            edge("a", "a::b", "go", 3),
        ]
    );
}

#[test]
fn super_inside_an_inline_module_is_the_file() {
    let r = refs_of(&[
        (
            "facts.rs",
            "pub mod hex { use super::Id; }\nuse crate::tls::X;\n",
        ),
        ("tls.rs", ""),
    ]);
    assert_eq!(r, vec![edge("facts", "tls", "X", 2)]);
}

#[test]
fn test_code_is_skipped() {
    let r = refs_of(&[
        (
            "etcd.rs",
            "use crate::facts::F;\n\
             #[cfg(test)]\n#[allow(clippy::unwrap_used)]\nmod tests {\n    use crate::fake::Fake;\n    fn f() { if true { crate::init::x(); } }\n}\n\
             #[cfg(any(test, feature = \"testing\"))]\npub fn helper() { crate::fake::y() }\n\
             #[cfg(test)]\nmod more;\n\
             #[cfg(not(test))]\nfn real() { crate::tls::z() }\n",
        ),
        ("facts.rs", ""),
        ("fake.rs", ""),
        ("init.rs", ""),
        ("tls.rs", ""),
    ]);
    assert_eq!(
        r,
        vec![edge("etcd", "facts", "F", 1), edge("etcd", "tls", "z", 13)]
    );
}

#[test]
fn comments_and_strings_are_ignored() {
    let r = refs_of(&[
        (
            "etcd.rs",
            "//! See [`crate::init::decide`].\n\
             /// Unlike `crate::sidecar::x`.\n\
             // use crate::sidecar::y;\n\
             /* use crate::sidecar::z; /* nested */ crate::init::w */\n\
             const A: &str = \"crate::init::a\";\n\
             const B: &str = r#\"use crate::init::b; \"quoted\" \"#;\n\
             const C: char = '\"'; const D: char = '\\'';\n\
             fn f<'a>(x: &'a str) { crate::facts::real(x) }\n",
        ),
        ("facts.rs", ""),
        ("init.rs", ""),
        ("sidecar.rs", ""),
    ]);
    assert_eq!(r, vec![edge("etcd", "facts", "real", 8)]);
}

#[test]
fn a_path_resolves_to_the_longest_existing_module() {
    let r = refs_of(&[
        (
            "config.rs",
            "use crate::sidecar::plan::defrag::DefragPolicy;\nuse crate::backup::BackupConfig;\n",
        ),
        ("sidecar/mod.rs", ""),
        ("sidecar/plan/mod.rs", ""),
        ("sidecar/plan/defrag.rs", ""),
        ("backup/mod.rs", ""),
        ("backup/store.rs", ""),
    ]);
    assert_eq!(
        r,
        vec![
            edge("config", "sidecar::plan::defrag", "DefragPolicy", 1),
            edge("config", "backup", "BackupConfig", 2)
        ]
    );
}

#[test]
fn a_sibling_cycle_is_found_and_named_link_by_link() {
    let dir = tree(&[
        ("backup/mod.rs", "pub mod a; pub mod b;\n"),
        ("backup/a.rs", "use super::b::Bee;\n"),
        ("backup/b.rs", "\nuse super::a::Ay;\n"),
    ]);
    let v = check(dir.path());
    assert_eq!(rules(&v), vec![R1], "{v:#?}");
    let text = v[0].to_string();
    assert!(
        text.contains("backup::a takes `Bee` from backup::b (src/backup/a.rs:1)"),
        "{text}"
    );
    assert!(
        text.contains("backup::b takes `Ay` from backup::a (src/backup/b.rs:2)"),
        "{text}"
    );
}

#[test]
fn a_folder_module_and_its_own_files_may_refer_to_each_other() {
    let dir = tree(&[
        (
            "backup/mod.rs",
            "use self::a::A; use self::b::B; pub struct Shared;\n",
        ),
        ("backup/a.rs", "use super::Shared;\n"),
        ("backup/b.rs", "use super::{Shared, a::A};\n"),
    ]);
    assert_eq!(check(dir.path()), vec![]);
}

#[test]
fn a_cycle_through_a_folder_module_and_an_outside_module_is_found() {
    let dir = tree(&[
        ("config.rs", "use crate::backup::Settings;\n"),
        (
            "backup/mod.rs",
            "pub use self::snapshot::Settings;\nuse self::other::X;\n",
        ),
        ("backup/snapshot.rs", "use crate::config::Config;\n"),
        // In the set only through its folder's module: not shown.
        ("backup/other.rs", "use super::Settings;\n"),
    ]);
    let v = check(dir.path());
    assert!(rules(&v).contains(&R1), "{v:#?}");
    assert!(
        v.iter()
            .any(|v| v.to_string().contains("3 modules import each other")),
        "{v:#?}"
    );
}

#[test]
fn an_upward_import_is_found() {
    let dir = tree(&[
        ("etcd.rs", "use crate::config::Config;\n"),
        ("config.rs", ""),
    ]);
    let v = check(dir.path());
    assert_eq!(rules(&v), vec![R2], "{v:#?}");
    assert_eq!(
        (v[0].file.as_str(), v[0].line, v[0].what.as_str()),
        ("src/etcd.rs", 1, "`crate::config::Config`")
    );
    assert!(v[0].fix.contains("imports point down only"), "{v:#?}");
}

#[test]
fn a_role_importing_a_role_is_found() {
    let dir = tree(&[
        (
            "sidecar/mod.rs",
            "fn f() { let o = crate::init::observe::observe(); }\n",
        ),
        ("init/mod.rs", "pub mod observe;\n"),
        ("init/observe.rs", ""),
    ]);
    let v = check(dir.path());
    assert_eq!(rules(&v), vec![R2], "{v:#?}");
    assert!(
        v[0].fix.contains("role `sidecar` imports role `init`"),
        "{v:#?}"
    );
}

#[test]
fn a_top_level_module_in_no_layer_is_found() {
    let dir = tree(&[("gadgets.rs", "")]);
    let v = check(dir.path());
    assert_eq!(rules(&v), vec![R2], "{v:#?}");
    assert!(v[0].what.contains("`gadgets` is in no layer"), "{v:#?}");
}

#[test]
fn a_planner_using_the_clock_or_a_non_leaf_is_found() {
    let dir = tree(&[
        (
            "sidecar/plan/defrag.rs",
            "use tokio::time::{Duration, Instant};\nuse super::observation::Observation;\n\
             use crate::sidecar::observe::Seen;\nfn f() { let t = Instant::now(); }\n\
             #[cfg(test)]\nmod tests { fn g() { std::fs::read(\"x\"); crate::etcd::go(); } }\n",
        ),
        (
            "sidecar/plan/observation.rs",
            "use crate::facts::Facts;\nuse std::time::Instant;\n",
        ),
        ("sidecar/plan/mod.rs", ""),
        ("sidecar/observe.rs", "use super::plan::Outcome;\n"),
        ("sidecar/mod.rs", ""),
        ("facts.rs", ""),
        ("etcd.rs", ""),
    ]);
    let v = check(dir.path());
    let found: Vec<(&str, &str, usize, &str)> = v
        .iter()
        .map(|v| (v.rule, v.file.as_str(), v.line, v.what.as_str()))
        .collect();
    assert_eq!(
        found,
        vec![
            (
                R3,
                "src/sidecar/plan/defrag.rs",
                3,
                "`crate::sidecar::observe::Seen`"
            ),
            (
                R3,
                "src/sidecar/plan/defrag.rs",
                4,
                "`Instant::now` (names `Instant::now`)"
            ),
            (
                R3,
                "src/sidecar/plan/observation.rs",
                2,
                "`std::time::Instant` (names `std::time::Instant`)"
            ),
        ],
        "{v:#?}"
    );
}

#[test]
fn the_decision_may_import_upgrade_and_recovery_only() {
    let dir = tree(&[
        ("init/decide/types.rs", "use crate::facts::F;\n"),
        ("init/decide/mod.rs", "use crate::init::upgrade::gate;\nuse crate::recovery::plan;\nuse crate::init::observe::O;\n"),
        ("init/upgrade.rs", "use crate::init::decide::types::Action;\n"),
        ("init/observe.rs", ""),
        ("init/mod.rs", ""),
        ("recovery.rs", ""),
        ("facts.rs", ""),
    ]);
    let v = check(dir.path());
    let found: Vec<(&str, usize, &str)> = v
        .iter()
        .map(|v| (v.rule, v.line, v.what.as_str()))
        .collect();
    assert_eq!(found, vec![(R3, 3, "`crate::init::observe::O`")], "{v:#?}");
}

#[test]
fn fakes_must_be_gated_and_unused_by_release_code() {
    let ungated = tree(&[
        (
            "lib.rs",
            "//! The crate.\npub mod etcd;\n/// Fakes.\npub mod fake;\n",
        ),
        ("fake.rs", "use crate::facts::F;\n"),
        ("facts.rs", ""),
        (
            "etcd.rs",
            "use crate::fake::FakeEtcd;\n#[cfg(test)]\nmod tests { use crate::fake::Fake2; }\n",
        ),
    ]);
    let v = check(ungated.path());
    let found: Vec<(&str, &str, usize)> = v
        .iter()
        .map(|v| (v.rule, v.file.as_str(), v.line))
        .collect();
    assert_eq!(
        found,
        vec![(R4, "src/etcd.rs", 1), (R4, "src/lib.rs", 4)],
        "{v:#?}"
    );

    let gated = tree(&[
        ("lib.rs", "pub mod etcd;\n#[cfg(any(test, feature = \"testing\"))]\n#[allow(missing_docs)]\npub mod fake;\n"),
        ("fake.rs", ""),
        ("etcd.rs", "#[cfg(test)]\nmod tests { use crate::fake::Fake2; }\n"),
    ]);
    assert_eq!(check(gated.path()), vec![]);
}

#[test]
fn long_files_are_found() {
    let long = "// x\n".repeat(MAX_LINES + 1);
    let ok = "// x\n".repeat(MAX_LINES);
    let dir = tree(&[("facts.rs", &long), ("tls.rs", &ok), ("main.rs", &long)]);
    let v = check(dir.path());
    let found: Vec<(&str, &str)> = v.iter().map(|v| (v.rule, v.file.as_str())).collect();
    assert_eq!(
        found,
        vec![(R5, "src/facts.rs"), (R5, "src/main.rs")],
        "{v:#?}"
    );
}

#[test]
fn the_test_cfgs() {
    for (attr, test_only) in [
        ("#[cfg(test)]", true),
        ("#[cfg(any(test, feature = \"testing\"))]", true),
        ("#[cfg(all(test, unix))]", true),
        ("#[cfg(not(test))]", false),
        ("#[cfg(any(test, unix))]", false),
        ("#[cfg(unix)]", false),
    ] {
        assert_eq!(
            cfg_predicate(attr).is_some_and(is_test_cfg),
            test_only,
            "{attr}"
        );
    }
}
