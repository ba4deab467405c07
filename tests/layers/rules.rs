//! The rules applied to a tree: what each module references, and each rule's violations.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use super::*;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Violation {
    pub(crate) rule: &'static str,
    pub(crate) file: String,
    pub(crate) line: usize,
    /// The offending path, or what the rule found.
    pub(crate) what: String,
    /// Why it breaks the rule and how to fix it.
    pub(crate) fix: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "[{}] {}:{}: {}",
            self.rule, self.file, self.line, self.what
        )?;
        writeln!(f, "    {}", self.fix)
    }
}

pub(crate) const R1: &str = "rule 1: no import cycle";
pub(crate) const R2: &str = "rule 2: layers";
pub(crate) const R3: &str = "rule 3: closed planners";
pub(crate) const R4: &str = "rule 4: fakes are test-only";
pub(crate) const R5: &str = "rule 5: files of at most 700 lines";

pub(crate) type Node = Vec<String>;

pub(crate) fn show(node: &[String]) -> String {
    if node.is_empty() {
        "crate".to_string()
    } else {
        node.join("::")
    }
}

/// One reference from a module's non-test code to another module.
#[derive(Debug, Clone)]
pub(crate) struct Ref {
    pub(crate) from: Node,
    pub(crate) to: Node,
    pub(crate) file: String,
    pub(crate) line: usize,
    /// The path as written, e.g. `crate::sidecar::plan::defrag::DefragPolicy`.
    pub(crate) path: String,
    /// What it takes from `to`, e.g. `DefragPolicy` (or `*`, or the module itself).
    pub(crate) name: String,
}

pub(crate) struct SrcFile {
    pub(crate) rel: String,
    pub(crate) node: Node,
    /// Non-test code, comments and string literals blanked (same lines as the file).
    pub(crate) code: Vec<char>,
}

/// All the rules on the tree under `src`.
pub(crate) fn check(src: &Path) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut files = Vec::new();
    for path in rs_files(src) {
        let rel = path
            .strip_prefix(src)
            .unwrap_or(&path)
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let lines = text.lines().count();
        if lines > MAX_LINES {
            out.push(Violation {
                rule: R5,
                file: format!("src/{rel}"),
                line: 1,
                what: format!("{lines} lines"),
                fix: format!(
                    "Split it by job (at most {MAX_LINES} lines each), e.g. types apart \
                     from logic, each concern in a file of its own."
                ),
            });
        }
        if rel == "main.rs" || rel == "lib.rs" {
            continue;
        }
        files.push(SrcFile {
            node: node_of(&rel),
            rel: format!("src/{rel}"),
            code: non_test_code(&text),
        });
    }
    let nodes: BTreeSet<Node> = files.iter().map(|f| f.node.clone()).collect();

    // Every top-level module is placed in a layer.
    let mut unplaced = BTreeSet::new();
    for f in &files {
        let top = &f.node[0];
        if layer_of(top).is_none() && unplaced.insert(top.clone()) {
            out.push(Violation {
                rule: R2,
                file: f.rel.clone(),
                line: 1,
                what: format!("top-level module `{top}` is in no layer"),
                fix: "Add it to LAYERS in tests/layers.rs, in the layer whose comment \
                      describes it (and keep its imports pointing down)."
                    .to_string(),
            });
        }
    }

    let mut refs = Vec::new();
    for f in &files {
        refs.extend(references(f, &nodes));
    }
    out.extend(layer_violations(&refs));
    out.extend(cycle_violations(&refs, &nodes));
    for f in &files {
        out.extend(planner_violations(f, &refs));
    }
    out.extend(fake_violations(src, &nodes, &refs));
    out.sort();
    out.dedup();
    out
}

/// `src/**/*.rs`, sorted.
pub(crate) fn rs_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for e in entries {
            let p = e.expect("directory entry").path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `a.rs` → `a`, `a/mod.rs` → `a`, `a/b.rs` → `a::b`.
pub(crate) fn node_of(rel: &str) -> Node {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

pub(crate) fn layer_of(top: &str) -> Option<u8> {
    LAYERS
        .iter()
        .find(|l| l.modules.contains(&top))
        .map(|l| l.level)
}

pub(crate) fn layer_name(top: &str) -> String {
    LAYERS
        .iter()
        .find(|l| l.modules.contains(&top))
        .map_or("no layer".to_string(), |l| {
            format!("layer {} ({})", l.level, l.name)
        })
}

/// The references of one file to other modules of the crate.
pub(crate) fn references(f: &SrcFile, nodes: &BTreeSet<Node>) -> Vec<Ref> {
    let mut out = Vec::new();
    for p in paths(&f.code) {
        let here: Node = f
            .node
            .iter()
            .cloned()
            .chain(p.inline_mods.iter().cloned())
            .collect();
        let Some(full) = absolute(&here, &p, nodes) else {
            continue;
        };
        let Some(n) = (1..=full.len()).rev().find(|&n| nodes.contains(&full[..n])) else {
            continue;
        };
        let to = full[..n].to_vec();
        if to == f.node {
            continue;
        }
        let name = if p.segs.last().is_some_and(|s| s == "*") {
            "*".to_string()
        } else if n < full.len() {
            full[n..].join("::")
        } else {
            to.last().cloned().unwrap_or_default()
        };
        out.push(Ref {
            from: f.node.clone(),
            to,
            file: f.rel.clone(),
            line: p.line,
            path: p.segs.join("::"),
            name,
        });
    }
    out
}

/// The crate-absolute segments a path names, if it names something of the crate.
pub(crate) fn absolute(
    here: &[String],
    p: &PathRef,
    nodes: &BTreeSet<Node>,
) -> Option<Vec<String>> {
    let segs: Vec<&str> = p
        .segs
        .iter()
        .map(String::as_str)
        .filter(|s| *s != "*")
        .collect();
    let (mut base, rest): (Vec<String>, &[&str]) = match segs.first()? {
        &"crate" => (Vec::new(), &segs[1..]),
        &"self" => (here.to_vec(), &segs[1..]),
        &"super" => {
            let ups = segs.iter().take_while(|s| **s == "super").count();
            (
                here[..here.len().saturating_sub(ups)].to_vec(),
                &segs[ups..],
            )
        }
        first if !p.leading_colons => {
            // A child module named without `self::` (e.g. `plan::tick` in `sidecar/mod.rs`).
            let mut child = here.to_vec();
            child.push(first.to_string());
            if !nodes.contains(&child) {
                return None;
            }
            (here.to_vec(), &segs[..])
        }
        _ => return None,
    };
    base.extend(rest.iter().map(|s| s.to_string()));
    Some(base)
}

pub(crate) fn layer_violations(refs: &[Ref]) -> Vec<Violation> {
    let mut out = Vec::new();
    for r in first_per_path(refs) {
        let (a, b) = (r.from[0].as_str(), r.to[0].as_str());
        // Within one subtree: rule 1 only. Into the fakes: rule 4 says it.
        if a == b || b == FAKE {
            continue;
        }
        let (Some(la), Some(lb)) = (layer_of(a), layer_of(b)) else {
            continue;
        };
        let why = if la < lb {
            format!(
                "`{a}` ({}) imports `{b}` ({}): imports point down only. Fix: move what \
                 `{a}` needs from `{b}` down to `{a}`'s layer or lower, or pass it in as a \
                 parameter.",
                layer_name(a),
                layer_name(b)
            )
        } else if la == lb && la == 5 {
            if ROLE_EXCEPTIONS.iter().any(|(f, t, _)| *f == a && *t == b) {
                continue;
            }
            format!(
                "role `{a}` imports role `{b}`: roles never import each other. Fix: move \
                 the shared code to a lower layer (e.g. `observe` or `recovery`)."
            )
        } else if la == lb {
            if SAME_LAYER_ALLOWED
                .iter()
                .any(|(f, t, _)| *f == a && *t == b)
            {
                continue;
            }
            format!(
                "`{a}` imports `{b}`, both {}: same-layer imports are allowed only inside \
                 one module's subtree or as listed in SAME_LAYER_ALLOWED. Fix: move the \
                 shared part to a lower layer, or list the pair with its reason.",
                layer_name(a)
            )
        } else {
            continue;
        };
        out.push(Violation {
            rule: R2,
            file: r.file.clone(),
            line: r.line,
            what: format!("`{}`", r.path),
            fix: why,
        });
    }
    out
}

/// One reference per (file, path), the first.
pub(crate) fn first_per_path(refs: &[Ref]) -> Vec<&Ref> {
    let mut seen = BTreeSet::new();
    refs.iter()
        .filter(|r| seen.insert((r.file.clone(), r.path.clone())))
        .collect()
}

pub(crate) fn matches_pattern(pattern: &str, node: &[String]) -> bool {
    let pat: Vec<&str> = pattern.split("::").collect();
    contains_at(&pat, node, 0)
}

/// `pat` matches `segs` from index `at` (a trailing `*` in a segment is a prefix match).
pub(crate) fn contains_at(pat: &[&str], segs: &[String], at: usize) -> bool {
    pat.len() + at <= segs.len()
        && pat
            .iter()
            .zip(&segs[at..])
            .all(|(p, s)| match p.strip_suffix('*') {
                Some(prefix) => s.starts_with(prefix),
                None => p == s,
            })
}

/// Rule 3 for one file.
pub(crate) fn planner_violations(f: &SrcFile, refs: &[Ref]) -> Vec<Violation> {
    let Some(planner) = PLANNERS
        .iter()
        .find(|p| p.planner.iter().any(|pat| matches_pattern(pat, &f.node)))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for r in first_per_path(refs).into_iter().filter(|r| r.file == f.rel) {
        let leaf = layer_of(&r.to[0]) == Some(1);
        let own = planner
            .may_import
            .iter()
            .chain(planner.planner)
            .any(|pat| matches_pattern(pat, &r.to));
        if !leaf && !own {
            out.push(Violation {
                rule: R3,
                file: f.rel.clone(),
                line: r.line,
                what: format!("`{}`", r.path),
                fix: format!(
                    "planner `{}` may import only leaves and {}; `{}` is neither. Fix: have \
                     the caller put what is needed into the planner's plain input data.",
                    show(&f.node),
                    planner
                        .may_import
                        .iter()
                        .map(|p| format!("`{p}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    show(&r.to)
                ),
            });
        }
    }
    let mut seen = BTreeSet::new();
    for p in paths(&f.code) {
        for banned in PLANNER_BANNED {
            let pat: Vec<&str> = banned.split("::").collect();
            if (0..p.segs.len()).any(|at| contains_at(&pat, &p.segs, at))
                && seen.insert(p.segs.join("::"))
            {
                out.push(Violation {
                    rule: R3,
                    file: f.rel.clone(),
                    line: p.line,
                    what: format!("`{}` (names `{banned}`)", p.segs.join("::")),
                    fix: format!(
                        "planner `{}` reads no clock, file or network. Fix: take the time or \
                         the fact as a field of the observation it is given.",
                        show(&f.node)
                    ),
                });
            }
        }
    }
    out
}

/// Rule 4: `lib.rs` declares `fake` under a test-only cfg, and no other module's non-test
/// code names it.
pub(crate) fn fake_violations(src: &Path, nodes: &BTreeSet<Node>, refs: &[Ref]) -> Vec<Violation> {
    let mut out = Vec::new();
    let fake = vec![FAKE.to_string()];
    if nodes.contains(&fake) {
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
        let declared = module_declaration(&lib, FAKE);
        if let Some((line, attrs)) = declared {
            let gated = attrs
                .iter()
                .any(|a| cfg_predicate(a).is_some_and(is_test_cfg));
            if !gated {
                out.push(Violation {
                    rule: R4,
                    file: "src/lib.rs".to_string(),
                    line,
                    what: format!("`mod {FAKE}` is compiled into the release library"),
                    fix: format!(
                        "Fix: declare it as `#[cfg(any(test, feature = \"testing\"))] pub \
                         mod {FAKE};` and enable the `testing` feature from the test crates."
                    ),
                });
            }
        }
    }
    for r in first_per_path(refs) {
        if r.to.first() == Some(&fake[0]) && r.from.first() != Some(&fake[0]) {
            out.push(Violation {
                rule: R4,
                file: r.file.clone(),
                line: r.line,
                what: format!("`{}`", r.path),
                fix: "release code names the test fakes. Fix: move this use under \
                      `#[cfg(test)]`, or take a trait the fake implements."
                    .to_string(),
            });
        }
    }
    out
}

/// The line of `mod <name>` in `lib` and the attributes written before it.
pub(crate) fn module_declaration(lib: &str, name: &str) -> Option<(usize, Vec<String>)> {
    let orig: Vec<char> = lib.chars().collect();
    let code = blank_comments_and_strings(&orig);
    let mut attrs = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if code[i].is_whitespace() {
            i += 1;
        } else if code[i] == '#' {
            let end = attribute_end(&code, i)?;
            attrs.push(orig[i..end].iter().collect::<String>());
            i = end;
        } else {
            let end = item_end(&code, i);
            let item: String = code[i..end].iter().collect();
            let words: Vec<&str> = item
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .collect();
            if words.windows(2).any(|w| w == ["mod", name]) {
                return Some((line_of(&code, i), attrs));
            }
            attrs.clear();
            i = end;
        }
    }
    None
}
