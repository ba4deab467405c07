//! Reading Rust text: comments, string literals and test-only code blanked, then every
//! path written (use trees expanded).

/// The text with comments and the insides of string and char literals turned into spaces
/// (newlines kept, so lines and positions stay those of the file).
pub(crate) fn blank_comments_and_strings(b: &[char]) -> Vec<char> {
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let at = |j: usize| b.get(j).copied().unwrap_or('\0');
    while i < b.len() {
        let c = b[i];
        let ident_before = i > 0 && is_ident(b[i - 1]);
        if c == '/' && at(i + 1) == '/' {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    out.extend([' ', ' ']);
                    i += 2;
                } else if b[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    out.extend([' ', ' ']);
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if !ident_before && (c == 'r' || (c == 'b' && at(i + 1) == 'r')) && {
            let mut j = i + if c == 'b' { 2 } else { 1 };
            while at(j) == '#' {
                j += 1;
            }
            at(j) == '"'
        } {
            // Raw string: r"…", r#"…"#, br"…".
            let mut j = i + if c == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            out.extend(std::iter::repeat_n(' ', j - i));
            out.push('"');
            i = j + 1;
            while i < b.len() {
                if b[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                    out.push('"');
                    out.extend(std::iter::repeat_n(' ', hashes));
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(b[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            if i < b.len() {
                out.push('"');
                i += 1;
            }
        } else if c == '\'' && at(i + 1) == '\\' {
            // '\n', '\'', '\u{…}'
            out.extend([' ', ' ', ' ']);
            i += 3;
            while i < b.len() && b[i] != '\'' {
                out.push(blank(b[i]));
                i += 1;
            }
            if i < b.len() {
                out.push(' ');
                i += 1;
            }
        } else if c == '\'' && at(i + 2) == '\'' {
            out.extend([' ', blank(at(i + 1)), ' ']);
            i += 3;
        } else {
            // Code, or a lifetime.
            out.push(c);
            i += 1;
        }
    }
    out
}

pub(crate) fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The end (exclusive) of the attribute `#[…]` or `#![…]` starting at `i`.
pub(crate) fn attribute_end(code: &[char], i: usize) -> Option<usize> {
    let mut j = i + 1;
    if code.get(j) == Some(&'!') {
        j += 1;
    }
    if code.get(j) != Some(&'[') {
        return None;
    }
    let mut depth = 0;
    while j < code.len() {
        match code[j] {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    None
}

/// The end (exclusive) of the item or statement starting at `i`: its first `;` outside
/// brackets, or its first `{ … }` block.
pub(crate) fn item_end(code: &[char], i: usize) -> usize {
    let mut depth = 0i32;
    let mut j = i;
    while j < code.len() {
        match code[j] {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ';' if depth <= 0 => return j + 1,
            '{' if depth <= 0 => {
                let mut braces = 0;
                while j < code.len() {
                    match code[j] {
                        '{' => braces += 1,
                        '}' => {
                            braces -= 1;
                            if braces == 0 {
                                return j + 1;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                return j;
            }
            _ => {}
        }
        j += 1;
    }
    j
}

/// `#[cfg(pred)]` → `pred` without whitespace; `None` for another attribute.
pub(crate) fn cfg_predicate(attr: &str) -> Option<String> {
    let s: String = attr.chars().filter(|c| !c.is_whitespace()).collect();
    let s = s.strip_prefix("#!").or_else(|| s.strip_prefix('#'))?;
    s.strip_prefix("[cfg(")?
        .strip_suffix(")]")
        .map(String::from)
}

/// A cfg that holds only in tests: `test`, `feature = "testing"`, or `any(…)` of such, or
/// `all(…)` with one of them.
pub(crate) fn is_test_cfg(pred: String) -> bool {
    fn test_only(p: &str) -> bool {
        let list = |inner: &str| -> Vec<String> {
            let mut parts = vec![String::new()];
            let mut depth = 0;
            for c in inner.chars() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(String::new());
                        continue;
                    }
                    _ => {}
                }
                parts.last_mut().expect("one part").push(c);
            }
            parts.into_iter().filter(|p| !p.is_empty()).collect()
        };
        if p == "test" || p == "feature=\"testing\"" {
            true
        } else if let Some(inner) = p.strip_prefix("any(").and_then(|s| s.strip_suffix(')')) {
            let parts = list(inner);
            !parts.is_empty() && parts.iter().all(|e| test_only(e))
        } else if let Some(inner) = p.strip_prefix("all(").and_then(|s| s.strip_suffix(')')) {
            list(inner).iter().any(|e| test_only(e))
        } else {
            false
        }
    }
    test_only(&pred)
}

/// The file's code that is compiled outside tests, with comments, string literals and
/// test-only items (`#[cfg(test)] mod tests { … }`, …) blanked.
pub(crate) fn non_test_code(text: &str) -> Vec<char> {
    let orig: Vec<char> = text.chars().collect();
    let mut code = blank_comments_and_strings(&orig);
    let mut i = 0;
    while i < code.len() {
        if code[i] == '#' {
            if let Some(end) = attribute_end(&code, i) {
                let attr: String = orig[i..end].iter().collect();
                if cfg_predicate(&attr).is_some_and(is_test_cfg) {
                    let blank_to = if code[i + 1] == '!' {
                        // `#![cfg(test)]`: the whole enclosing module (here: the file).
                        code.len()
                    } else {
                        // This attribute, the next ones, and the item they apply to.
                        let mut j = end;
                        loop {
                            while j < code.len() && code[j].is_whitespace() {
                                j += 1;
                            }
                            match (code.get(j), attribute_end(&code, j)) {
                                (Some('#'), Some(e)) => j = e,
                                _ => break,
                            }
                        }
                        item_end(&code, j)
                    };
                    for c in &mut code[i..blank_to] {
                        if *c != '\n' {
                            *c = ' ';
                        }
                    }
                    i = blank_to;
                    continue;
                }
                i = end;
                continue;
            }
        }
        i += 1;
    }
    code
}

pub(crate) fn line_of(code: &[char], i: usize) -> usize {
    1 + code[..i].iter().filter(|c| **c == '\n').count()
}

/// One path as written: `a::b::C`, or one leaf of a use tree (`use a::{b, c::d}` gives
/// `a::b` and `a::c::d`; `self` in a group is the group's prefix; a glob ends in `*`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PathRef {
    pub(crate) segs: Vec<String>,
    pub(crate) line: usize,
    /// Written `::a::b` (an outside crate).
    pub(crate) leading_colons: bool,
    /// Inline `mod m { … }` blocks around it, outermost first.
    pub(crate) inline_mods: Vec<String>,
}

/// Every path of two segments or more (or a glob) in blanked code.
pub(crate) fn paths(code: &[char]) -> Vec<PathRef> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut depth = 0usize;
    let mut mods: Vec<(String, usize)> = Vec::new();
    let mut pending_mod: Option<String> = None;
    let mut prev_word = String::new();
    while i < code.len() {
        let c = code[i];
        if c == '{' {
            depth += 1;
            if let Some(m) = pending_mod.take() {
                mods.push((m, depth));
            }
            i += 1;
        } else if c == '}' {
            if mods.last().is_some_and(|(_, d)| *d == depth) {
                mods.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
        } else if c == ';' {
            pending_mod = None;
            i += 1;
        } else if (c.is_alphabetic() || c == '_') && (i == 0 || !is_ident(code[i - 1])) {
            let leading_colons = {
                let mut j = i;
                while j > 0 && code[j - 1].is_whitespace() {
                    j -= 1;
                }
                j >= 2 && code[j - 1] == ':' && code[j - 2] == ':'
            };
            let (word, after) = ident(code, i);
            if prev_word == "mod" {
                pending_mod = Some(word.clone());
            }
            let mut leaves = Vec::new();
            let end = use_tree_rest(code, after, vec![word.clone()], &mut leaves);
            let inline_mods: Vec<String> = mods.iter().map(|(m, _)| m.clone()).collect();
            for (segs, at) in leaves {
                if segs.len() >= 2 {
                    out.push(PathRef {
                        segs,
                        line: line_of(code, at),
                        leading_colons,
                        inline_mods: inline_mods.clone(),
                    });
                }
            }
            prev_word = word;
            i = end;
        } else {
            if !c.is_whitespace() {
                prev_word.clear();
            }
            i += 1;
        }
    }
    out
}

pub(crate) fn ident(code: &[char], i: usize) -> (String, usize) {
    let mut j = i;
    while j < code.len() && is_ident(code[j]) {
        j += 1;
    }
    (code[i..j].iter().collect(), j)
}

pub(crate) fn skip_ws(code: &[char], mut i: usize) -> usize {
    while i < code.len() && code[i].is_whitespace() {
        i += 1;
    }
    i
}

/// Reads what follows `prefix` at `i` (`::b::c`, `::{…}`, `::*`, or nothing), pushing each
/// leaf with its position; returns the end.
pub(crate) fn use_tree_rest(
    code: &[char],
    i: usize,
    prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, usize)>,
) -> usize {
    let j = skip_ws(code, i);
    if !(code.get(j) == Some(&':') && code.get(j + 1) == Some(&':')) {
        leaves.push((prefix, i.saturating_sub(1)));
        return i;
    }
    let k = skip_ws(code, j + 2);
    match code.get(k) {
        Some('{') => use_group(code, k, &prefix, leaves),
        Some('*') => {
            let mut p = prefix;
            p.push("*".to_string());
            leaves.push((p, k));
            k + 1
        }
        Some(&c) if c.is_alphabetic() || c == '_' => {
            let (word, after) = ident(code, k);
            let mut p = prefix;
            p.push(word);
            use_tree_rest(code, after, p, leaves)
        }
        // `::<T>` (turbofish) or anything else: the path ends here.
        _ => {
            leaves.push((prefix, i.saturating_sub(1)));
            i
        }
    }
}

/// `{a, b::c, self, d::{e}, f as g}` after `prefix`.
pub(crate) fn use_group(
    code: &[char],
    open: usize,
    prefix: &[String],
    leaves: &mut Vec<(Vec<String>, usize)>,
) -> usize {
    let mut i = open + 1;
    loop {
        i = skip_ws(code, i);
        match code.get(i) {
            None => return i,
            Some('}') => return i + 1,
            Some(',') => i += 1,
            Some('{') => i = use_group(code, i, prefix, leaves),
            Some('*') => {
                let mut p = prefix.to_vec();
                p.push("*".to_string());
                leaves.push((p, i));
                i += 1;
            }
            Some(&c) if c.is_alphabetic() || c == '_' => {
                let (word, after) = ident(code, i);
                if word == "as" {
                    // `x as y`: skip the alias.
                    let k = skip_ws(code, after);
                    i = ident(code, k).1;
                    continue;
                }
                let mut p = prefix.to_vec();
                if word != "self" {
                    p.push(word);
                }
                i = use_tree_rest(code, after, p, leaves);
            }
            Some(_) => i += 1,
        }
    }
}
