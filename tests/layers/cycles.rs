//! Rule 1: import cycles, and the chains of modules that show them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::*;

/// The folder family of `a`: `a` and the modules of the files directly inside its folder
/// (for the crate root `[]`: the top-level modules).
pub(crate) fn in_family(a: &[String], n: &[String]) -> bool {
    n == a || (n.len() == a.len() + 1 && n.starts_with(a))
}

pub(crate) fn parent(n: &[String]) -> &[String] {
    &n[..n.len().saturating_sub(1)]
}

/// Rule 1. A folder's module and its own files may refer to each other in any way, so a
/// cycle is allowed when all its modules are in one folder family and it passes through
/// the folder's module. Two kinds of cycle are reported:
/// - siblings (files of one folder, or top-level modules) importing each other without
///   the folder's module;
/// - cycles that leave a folder family (a strongly connected set of modules not all in
///   one family).
///
/// Each is shown as chains of modules, each link with the names taken and where.
pub(crate) fn cycle_violations(refs: &[Ref], nodes: &BTreeSet<Node>) -> Vec<Violation> {
    let mut edges: BTreeMap<(Node, Node), Vec<&Ref>> = BTreeMap::new();
    for r in refs {
        edges
            .entry((r.from.clone(), r.to.clone()))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();

    // Siblings: one graph per folder, its files' modules only.
    let folders: BTreeSet<Node> = nodes.iter().map(|n| parent(n).to_vec()).collect();
    for folder in &folders {
        let siblings: BTreeSet<Node> = nodes
            .iter()
            .filter(|n| n.len() == folder.len() + 1 && n.starts_with(folder))
            .cloned()
            .collect();
        let mut next: BTreeMap<&Node, BTreeSet<&Node>> = BTreeMap::new();
        for (a, b) in edges.keys() {
            if siblings.contains(a) && siblings.contains(b) {
                next.entry(a).or_default().insert(b);
            }
        }
        for scc in strongly_connected(&siblings, &next) {
            let chains = chains_through(&scc, &next, |_, _| 0, 0);
            out.push(cycle_violation(
                format!(
                    "{} modules of `{}` import each other without their folder's module: {}",
                    scc.len(),
                    show(folder),
                    scc.iter().map(|n| show(n)).collect::<Vec<_>>().join(", ")
                ),
                &chains,
                &edges,
            ));
        }
    }

    // Cycles that leave a folder family.
    let mut next: BTreeMap<&Node, BTreeSet<&Node>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().insert(b);
    }
    for scc in strongly_connected(nodes, &next) {
        let one_family = scc.iter().any(|a| scc.iter().all(|n| in_family(a, n)))
            || scc
                .iter()
                .any(|a| scc.iter().all(|n| in_family(parent(a), n)));
        if one_family {
            continue;
        }
        // A file that only its folder's module imports and that imports only its folder's
        // module is in this set through that module alone: on no cycle of its own.
        let pendant = |n: &Node| {
            edges
                .keys()
                .filter(|(a, b)| scc.contains(a) && scc.contains(b) && (a == n || b == n))
                .all(|(a, b)| {
                    let other = if a == n { b } else { a };
                    other.as_slice() == parent(n)
                })
        };
        let scc: BTreeSet<&Node> = scc.iter().copied().filter(|n| !pendant(n)).collect();
        // A chain through `start` must leave both families `start` is in.
        let left = |start: &Node, walk: &[&Node]| {
            u8::from(walk.iter().any(|n| !in_family(start, n)))
                | (u8::from(walk.iter().any(|n| !in_family(parent(start), n))) << 1)
        };
        let chains = chains_through(&scc, &next, left, 3);
        out.push(cycle_violation(
            format!(
                "{} modules import each other in a cycle: {}",
                scc.len(),
                scc.iter().map(|n| show(n)).collect::<Vec<_>>().join(", ")
            ),
            &chains,
            &edges,
        ));
    }
    out
}

pub(crate) fn cycle_violation(
    what: String,
    chains: &[Vec<&Node>],
    edges: &BTreeMap<(Node, Node), Vec<&Ref>>,
) -> Violation {
    let mut text = what;
    let mut first = None;
    for (i, chain) in chains.iter().enumerate() {
        text.push_str(&format!(
            "\n    cycle {}: {}",
            i + 1,
            chain
                .iter()
                .chain(chain.first())
                .map(|n| show(n))
                .collect::<Vec<_>>()
                .join(" → ")
        ));
        for w in 0..chain.len() {
            let (a, b) = (chain[w], chain[(w + 1) % chain.len()]);
            let rs = &edges[&(a.clone(), b.clone())];
            let mut names: Vec<&str> = rs.iter().map(|r| r.name.as_str()).collect();
            names.sort();
            names.dedup();
            first.get_or_insert((rs[0].file.clone(), rs[0].line));
            text.push_str(&format!(
                "\n        {} takes {} from {} ({}:{})",
                show(a),
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                show(b),
                rs[0].file,
                rs[0].line
            ));
        }
    }
    let (file, line) = first.unwrap_or_default();
    Violation {
        rule: R1,
        file,
        line,
        what: text,
        fix: "Fix: break each chain at its link against the layers (or a sibling taking back \
              from a sibling): move the shared type down, or pass the narrow value in \
              instead of the whole type of a higher module."
            .to_string(),
    }
}

/// Shortest closed walks inside `scc` until every module is on one: each through the first
/// module not yet shown, accepted only if `progress(start, modules on the walk) == done`
/// (`progress` only grows as a walk gets longer).
pub(crate) fn chains_through<'a>(
    scc: &BTreeSet<&'a Node>,
    next: &BTreeMap<&'a Node, BTreeSet<&'a Node>>,
    progress: impl Fn(&Node, &[&Node]) -> u8,
    done: u8,
) -> Vec<Vec<&'a Node>> {
    let mut shown: BTreeSet<&Node> = BTreeSet::new();
    let mut chains = Vec::new();
    for &start in scc {
        if shown.contains(start) {
            continue;
        }
        if let Some(walk) = shortest_closed_walk(start, scc, next, |w| progress(start, w), done) {
            shown.extend(walk.iter().copied());
            chains.push(walk);
        }
    }
    chains
}

/// Breadth-first over (module, progress): the shortest walk from `start` back to it with
/// `progress == done`.
pub(crate) fn shortest_closed_walk<'a>(
    start: &'a Node,
    scc: &BTreeSet<&'a Node>,
    next: &BTreeMap<&'a Node, BTreeSet<&'a Node>>,
    progress: impl Fn(&[&Node]) -> u8,
    done: u8,
) -> Option<Vec<&'a Node>> {
    let mut q: VecDeque<Vec<&Node>> = VecDeque::from([vec![start]]);
    let mut seen: BTreeSet<(&Node, u8)> = BTreeSet::new();
    while let Some(walk) = q.pop_front() {
        let at = *walk.last().expect("non-empty");
        for &w in next
            .get(at)
            .into_iter()
            .flatten()
            .filter(|n| scc.contains(*n))
        {
            if w == start {
                if progress(&walk) == done {
                    return Some(walk);
                }
                continue;
            }
            let mut longer = walk.clone();
            longer.push(w);
            if seen.insert((w, progress(&longer))) {
                q.push_back(longer);
            }
        }
    }
    None
}

/// Tarjan's strongly connected components of more than one module.
pub(crate) fn strongly_connected<'a>(
    nodes: &'a BTreeSet<Node>,
    next: &BTreeMap<&'a Node, BTreeSet<&'a Node>>,
) -> Vec<BTreeSet<&'a Node>> {
    struct St<'a> {
        index: BTreeMap<&'a Node, usize>,
        low: BTreeMap<&'a Node, usize>,
        stack: Vec<&'a Node>,
        on: BTreeSet<&'a Node>,
        out: Vec<BTreeSet<&'a Node>>,
    }
    fn visit<'a>(v: &'a Node, next: &BTreeMap<&'a Node, BTreeSet<&'a Node>>, s: &mut St<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for &w in next.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, next, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                scc.insert(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                s.out.push(scc);
            }
        }
    }
    let mut s = St {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: vec![],
        on: BTreeSet::new(),
        out: vec![],
    };
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(v, next, &mut s);
        }
    }
    s.out
}
