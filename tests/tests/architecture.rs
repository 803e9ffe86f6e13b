//! The codebase's shape, checked on every run (issue 9, docs/ARCHITECTURE.md):
//!
//! - no two source files of a crate import each other (a module and its
//!   own submodules excepted: a parent declares and re-exports its
//!   children, a child uses what its parent shares);
//! - no modules of a crate import each other through a cycle of any
//!   length (a strongly connected component of the import graph), with
//!   one such cycle printed;
//! - no function over 80 lines outside tests (`tests/` directories,
//!   `tests.rs` files, `#[cfg(test)] mod tests`) and the seccomp emitter
//!   with its syscall tables (`sandbox/src/layers/seccomp/`);
//! - every crate root whose crate has no `unsafe` says
//!   `#![forbid(unsafe_code)]`.
//!
//! Each failure says what to fix. The source is read as text, with the
//! same rules as `python3 /work/tools/longfns.py .` for function length.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a function may be, in lines from `fn` to its closing brace.
const MAX_FN_LINES: usize = 80;

/// Functions still over the limit in files other branches of this round
/// own (issue 9): the lead removes each line once its split is merged.
/// `(path from the workspace root, function name)`.
const LONG_FN_EXCEPTIONS: &[(&str, &str)] = &[];

/// Pairs of files that still import each other; the lead removes each
/// line once it is resolved (the test fails on a line that no longer
/// names a pair).
const IMPORT_PAIR_EXCEPTIONS: &[(&str, &str)] = &[];

/// Import cycles still present, as `(crate directory, a module of the
/// cycle)`: each line says why it stays and is removed once it is broken
/// (the test fails on a line whose module is in no cycle).
const CYCLE_EXCEPTIONS: &[(&str, &str)] = &[];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The workspace members' directories, from the root Cargo.toml.
fn members(root: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("the root Cargo.toml");
    let start = text.find("members = [").expect("a members list");
    let end = start
        + text[start..]
            .find(']')
            .expect("the end of the members list");
    text[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root.join(m))
        .collect()
}

/// Every `.rs` file under `dir`, skipping `target`, `node_modules`, `.git`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !matches!(name, "target" | "node_modules" | ".git") {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The text before a file's `#[cfg(test)] mod tests` (the tests follow it).
fn non_test_text(text: &str) -> &str {
    let mut offset = 0;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]")
            && lines
                .get(i + 1)
                .is_some_and(|next| next.trim_start().starts_with("mod tests"))
        {
            return &text[..offset];
        }
        offset += line.len();
    }
    text
}

/// Removes `//` comments (doc comments included) and the contents of
/// string literals, so that paths in prose are not read as imports.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut prev = ' ';
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !in_string && c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' {
                in_string = !in_string;
                out.push(c);
            } else if !in_string {
                out.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
            i += 1;
        }
        out.push('\n');
    }
    out
}

// ------------------------------------------------------------ import pairs

/// A crate's modules: module path (`["process", "driver"]`) → file.
fn module_map(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut map = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        // Binaries are crate roots of their own.
        if parts.first().is_some_and(|p| p == "bin") {
            continue;
        }
        if parts
            .last()
            .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
        {
            parts.pop();
        }
        map.entry(parts).or_insert(file);
    }
    map
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into full paths.
fn expand_use_tree(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let base = join_path(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use_tree(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand_use_tree(&inner[start..], &base, out);
    } else if !tree.is_empty() {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        out.push(join_path(prefix, path));
    }
}

fn join_path(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, _) => path.to_owned(),
        (_, true) => prefix.to_owned(),
        _ => format!("{prefix}::{path}"),
    }
}

/// Every `crate::`, `super::` and `self::` path a file's code names: its
/// `use` trees expanded, and the paths written inline.
fn referenced_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let boundary = at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if boundary {
            expand_use_tree(&after[..end], "", &mut paths);
        }
        rest = &after[end.min(after.len())..];
    }
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
        if starts_word && (bytes[i].is_alphabetic() || bytes[i] == '_') {
            let mut j = i;
            while j < bytes.len()
                && (bytes[j].is_alphanumeric() || bytes[j] == '_' || bytes[j] == ':')
            {
                j += 1;
            }
            let word: String = bytes[i..j].iter().collect();
            if ["crate::", "super::", "self::"]
                .iter()
                .any(|p| word.starts_with(p))
            {
                paths.push(word.trim_end_matches(':').to_owned());
            }
            i = j;
        } else {
            i += 1;
        }
    }
    paths
}

/// Each module's re-exports: the name it gives (`Name`, or the alias of
/// `as`) and the path it re-exports, as written (`pub use a::b::Name;`).
type Reexports = BTreeMap<Vec<String>, BTreeMap<String, String>>;

fn reexports_of(code: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for head in ["pub use ", "pub(crate) use ", "pub(super) use "] {
        let mut rest = code;
        while let Some(at) = rest.find(head) {
            let after = &rest[at + head.len()..];
            let end = after.find(';').unwrap_or(after.len());
            let mut with_alias = Vec::new();
            expand_use_tree_aliased(&after[..end], "", &mut with_alias);
            for (path, name) in with_alias {
                if name != "*" && name != "self" {
                    out.insert(name, path);
                }
            }
            rest = &after[end..];
        }
    }
    out
}

/// [`expand_use_tree`], keeping for each path the name it is known by.
fn expand_use_tree_aliased(tree: &str, prefix: &str, out: &mut Vec<(String, String)>) {
    let mut plain = Vec::new();
    expand_use_tree(tree, prefix, &mut plain);
    let mut aliases = BTreeMap::new();
    for piece in tree.split([',', '{', '}']) {
        if let Some((path, alias)) = piece.split_once(" as ") {
            let last = path.trim().rsplit("::").next().unwrap_or("").to_owned();
            aliases.insert(last, alias.trim().to_owned());
        }
    }
    for path in plain {
        let last = path.rsplit("::").next().unwrap_or("").to_owned();
        let name = aliases.get(&last).cloned().unwrap_or(last);
        out.push((path, name));
    }
}

/// The module a path names, as the longest known module prefix of it,
/// resolved from module `from` (`super` and `self` are relative to it; a
/// bare path is relative to `from`, as a re-export's is). A name that
/// module re-exports is followed to the module it comes from.
fn resolve(
    path: &str,
    from: &[String],
    modules: &BTreeMap<Vec<String>, PathBuf>,
    reexports: &Reexports,
) -> Option<Vec<String>> {
    resolve_within(path, from, modules, reexports, 4)
}

fn resolve_within(
    path: &str,
    from: &[String],
    modules: &BTreeMap<Vec<String>, PathBuf>,
    reexports: &Reexports,
    depth: usize,
) -> Option<Vec<String>> {
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<String> = match segments.first() {
        Some(&"crate") => Vec::new(),
        Some(&"self") | Some(&"super") => from.to_vec(),
        Some(_) if depth < 4 => {
            segments.insert(0, "self");
            from.to_vec()
        }
        _ => return None,
    };
    let skip_first = !matches!(segments.first(), Some(&"super"));
    if skip_first {
        segments.remove(0);
    }
    while segments.first() == Some(&"super") {
        base.pop()?;
        segments.remove(0);
    }
    let mut full = base;
    full.extend(segments.iter().map(|s| (*s).to_owned()));
    let found = (0..=full.len())
        .rev()
        .map(|n| full[..n].to_vec())
        .find(|m| modules.contains_key(m))?;
    let reexported = full
        .get(found.len())
        .and_then(|name| reexports.get(&found)?.get(name));
    match reexported {
        Some(target) if depth > 0 => {
            let mut path = target.clone();
            for rest in &full[found.len() + 1..] {
                path = format!("{path}::{rest}");
            }
            resolve_within(&path, &found, modules, reexports, depth - 1).or(Some(found))
        }
        _ => Some(found),
    }
}

/// The module import graph of the crate at `src`: each module and the
/// modules it names (a module's own parent and children left out: a
/// parent declares and re-exports its children, a child uses what its
/// parent shares).
type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

fn import_graph(src: &Path) -> (BTreeMap<Vec<String>, PathBuf>, Graph) {
    let modules = module_map(src);
    let code: BTreeMap<&Vec<String>, String> = modules
        .iter()
        .map(|(m, file)| {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            (m, code_only(non_test_text(&text)))
        })
        .collect();
    let reexports: Reexports = code
        .iter()
        .map(|(m, c)| ((*m).clone(), reexports_of(c)))
        .collect();
    let mut graph: Graph = BTreeMap::new();
    for (&module, code) in &code {
        let out = graph.entry((*module).clone()).or_default();
        for path in referenced_paths(code) {
            if let Some(target) = resolve(&path, module, &modules, &reexports)
                && &target != module
                && !target.starts_with(module)
                && !module.starts_with(&target)
            {
                out.insert(target);
            }
        }
    }
    (modules, graph)
}

/// The pairs of files of the crate at `src` that import each other.
fn import_pairs(root: &Path, src: &Path) -> Vec<(String, String)> {
    let (modules, graph) = import_graph(src);
    let mut pairs = Vec::new();
    for (a, targets) in &graph {
        for b in targets {
            if a < b && graph.get(b).is_some_and(|t| t.contains(a)) {
                pairs.push((relative(root, &modules[a]), relative(root, &modules[b])));
            }
        }
    }
    pairs
}

/// The strongly connected components of more than one module (Tarjan's
/// algorithm, iterative), each sorted.
fn cycles_in(graph: &Graph) -> Vec<Vec<Vec<String>>> {
    let nodes: Vec<&Vec<String>> = graph
        .keys()
        .chain(graph.values().flatten())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let index_of: BTreeMap<&Vec<String>, usize> =
        nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            graph
                .get(*n)
                .map(|t| t.iter().map(|m| index_of[m]).collect())
                .unwrap_or_default()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let (mut on_stack, mut stack, mut next) = (vec![false; n], Vec::new(), 0);
    let mut components = Vec::new();
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        // (node, how many of its successors were visited)
        let mut work = vec![(start, 0)];
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            if *i == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = succ[v].get(*i) {
                *i += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    components.push(component);
                }
            }
        }
    }
    components.sort();
    components
}

/// One cycle through a component, as `a -> b -> ... -> a` (a shortest
/// path back to its first module, found breadth first).
fn one_cycle(graph: &Graph, component: &[Vec<String>]) -> Vec<Vec<String>> {
    let Some(first) = component.first() else {
        return Vec::new();
    };
    let inside: BTreeSet<&Vec<String>> = component.iter().collect();
    let mut came_from: BTreeMap<&Vec<String>, &Vec<String>> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([first]);
    while let Some(v) = queue.pop_front() {
        for w in graph.get(v).into_iter().flatten() {
            if !inside.contains(w) {
                continue;
            }
            if w == first {
                let mut path = vec![first.clone()];
                let mut at = v;
                while at != first {
                    path.push(at.clone());
                    at = came_from[at];
                }
                path.push(first.clone());
                path.reverse();
                return path;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    Vec::new()
}

/// The import cycles of any length among the modules of the crate at
/// `src`: each component's modules, and one cycle through it, both as
/// module paths (`crate::a::b`).
fn module_cycles(src: &Path) -> Vec<(Vec<String>, String)> {
    let (_, graph) = import_graph(src);
    let name = |m: &Vec<String>| {
        std::iter::once("crate")
            .chain(m.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("::")
    };
    cycles_in(&graph)
        .into_iter()
        .map(|component| {
            let cycle = one_cycle(&graph, &component)
                .iter()
                .map(name)
                .collect::<Vec<_>>()
                .join(" -> ");
            (component.iter().map(name).collect(), cycle)
        })
        .collect()
}

// ------------------------------------------------------------ long functions

/// `(file, function, lines)` of every function over [`MAX_FN_LINES`].
fn long_functions(root: &Path) -> Vec<(String, String, usize)> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut long = Vec::new();
    for file in files {
        let rel = relative(root, &file);
        let skipped = rel
            .split('/')
            .any(|p| p == "tests" || p == "fuzz" || p == "target")
            || rel.ends_with("/tests.rs")
            || rel.starts_with("sandbox/src/layers/seccomp/")
            || rel.starts_with("bench/rmcp-echo/");
        if skipped {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<&str> = non_test_text(&text).lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some((indent, name)) = fn_header(line) else {
                continue;
            };
            if line.trim_end().ends_with(';') {
                continue;
            }
            let closing = format!("{indent}}}");
            let end = (i + 1..lines.len())
                .find(|&j| lines[j] == closing)
                .unwrap_or(lines.len().saturating_sub(1));
            let n = end - i + 1;
            if n > MAX_FN_LINES {
                long.push((rel.clone(), name, n));
            }
        }
    }
    long
}

/// The indentation and name of a line that starts a function.
fn fn_header(line: &str) -> Option<(String, String)> {
    let indent: String = line.chars().take_while(|c| c.is_whitespace()).collect();
    let mut rest = line[indent.len()..].trim_start();
    for word in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "unsafe ",
        "const ",
    ] {
        if let Some(r) = rest.strip_prefix(word) {
            rest = r;
        }
    }
    for word in ["async ", "unsafe ", "const "] {
        if let Some(r) = rest.strip_prefix(word) {
            rest = r;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some((indent, name))
}

// ------------------------------------------------------------ unsafe

/// Crate roots (`src/lib.rs`, `src/main.rs`) of crates with no `unsafe`
/// that lack `#![forbid(unsafe_code)]`.
fn roots_without_forbid(root: &Path) -> Vec<String> {
    let mut missing = Vec::new();
    for member in members(root) {
        let src = member.join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let files: Vec<_> = files
            .into_iter()
            .filter(|f| !f.starts_with(src.join("bin")))
            .collect();
        let has_unsafe = files.iter().any(|f| {
            let code = code_only(&std::fs::read_to_string(f).unwrap_or_default());
            [
                "unsafe {",
                "unsafe fn",
                "unsafe impl",
                "unsafe extern",
                "#[unsafe(",
            ]
            .iter()
            .any(|k| code.contains(k))
        });
        if has_unsafe {
            continue;
        }
        for name in ["lib.rs", "main.rs"] {
            let crate_root = src.join(name);
            let text = std::fs::read_to_string(&crate_root).unwrap_or_default();
            if crate_root.is_file() && !text.contains("#![forbid(unsafe_code)]") {
                missing.push(relative(root, &crate_root));
            }
        }
    }
    missing
}

// ------------------------------------------------------------ the tests

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let root = workspace_root();
    let mut found = Vec::new();
    for member in members(&root) {
        for (a, b) in import_pairs(&root, &member.join("src")) {
            let excepted = IMPORT_PAIR_EXCEPTIONS
                .iter()
                .any(|(x, y)| (*x == a && *y == b) || (*x == b && *y == a));
            if !excepted {
                found.push(format!("{a} <-> {b}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "these files import each other; move what both need into one of them, or into a \
         module of its own both import (docs/ARCHITECTURE.md):\n  {}",
        found.join("\n  ")
    );
}

/// The cycles of every member crate, as `(crate directory, modules, one
/// cycle)`.
fn workspace_cycles(root: &Path) -> Vec<(String, Vec<String>, String)> {
    let mut out = Vec::new();
    for member in members(root) {
        let dir = relative(root, &member);
        for (component, cycle) in module_cycles(&member.join("src")) {
            out.push((dir.clone(), component, cycle));
        }
    }
    out
}

#[test]
fn no_modules_of_a_crate_import_each_other_in_a_cycle() {
    let found: Vec<String> = workspace_cycles(&workspace_root())
        .into_iter()
        .filter(|(dir, component, _)| {
            !CYCLE_EXCEPTIONS
                .iter()
                .any(|(d, m)| d == dir && component.iter().any(|c| c == m))
        })
        .map(|(dir, component, cycle)| {
            format!(
                "{dir}: {} modules in a cycle ({}), e.g. {cycle}",
                component.len(),
                component.join(", ")
            )
        })
        .collect();
    assert!(
        found.is_empty(),
        "these modules import each other through a cycle; move what they share into a \
         module of its own that imports none of them (docs/ARCHITECTURE.md):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn no_function_outside_tests_is_over_80_lines() {
    let root = workspace_root();
    let found: Vec<String> = long_functions(&root)
        .into_iter()
        .filter(|(file, name, _)| {
            !LONG_FN_EXCEPTIONS
                .iter()
                .any(|(f, n)| f == file && n == name)
        })
        .map(|(file, name, n)| format!("{file}: fn {name} is {n} lines"))
        .collect();
    assert!(
        found.is_empty(),
        "split these functions into named steps of at most {MAX_FN_LINES} lines each:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn every_crate_without_unsafe_forbids_it() {
    let missing = roots_without_forbid(&workspace_root());
    assert!(
        missing.is_empty(),
        "these crates have no unsafe code: add #![forbid(unsafe_code)] to their root, so that \
         unsafe has to move to the sandbox crate (docs/ARCHITECTURE.md, \"unsafe\"):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_checks_see_what_they_check() {
    // Guards against a check that passes because it reads nothing.
    let root = workspace_root();
    assert!(members(&root).len() >= 10, "{:?}", members(&root));
    let host = module_map(&root.join("host/src"));
    assert!(host.contains_key(&vec![
        "process".to_owned(),
        "driver".to_owned(),
        "turn".to_owned()
    ]));
    let code =
        code_only("use crate::{a::X, b::{c, d as e}};\nlet x = super::f::g(); // crate::z\n");
    let paths = referenced_paths(&code);
    for p in ["crate::a::X", "crate::b::c", "crate::b::d", "super::f::g"] {
        assert!(paths.iter().any(|q| q == p), "{p} not in {paths:?}");
    }
    assert!(!paths.iter().any(|q| q.contains('z')), "{paths:?}");
    assert_eq!(
        fn_header("    pub(crate) async fn run(x: u8) {"),
        Some(("    ".into(), "run".into()))
    );
    // Every exception still names a function over the limit: a split that
    // is merged makes its line here fail until it is removed.
    let mut pairs = Vec::new();
    for member in members(&root) {
        pairs.extend(import_pairs(&root, &member.join("src")));
    }
    for (a, b) in IMPORT_PAIR_EXCEPTIONS {
        assert!(
            pairs
                .iter()
                .any(|(x, y)| (x == a && y == b) || (x == b && y == a)),
            "{a} and {b} no longer import each other: remove them from IMPORT_PAIR_EXCEPTIONS"
        );
    }
    let cycles = workspace_cycles(&root);
    for (dir, module) in CYCLE_EXCEPTIONS {
        assert!(
            cycles
                .iter()
                .any(|(d, component, _)| d == dir && component.iter().any(|c| c == module)),
            "{dir}: {module} is in no cycle any more: remove it from CYCLE_EXCEPTIONS"
        );
    }
    // A cycle of three is found, and one of its loops printed; a module
    // hanging off it is not part of it.
    let m = |s: &str| vec![s.to_owned()];
    let graph: Graph = BTreeMap::from([
        (m("a"), BTreeSet::from([m("b")])),
        (m("b"), BTreeSet::from([m("c")])),
        (m("c"), BTreeSet::from([m("a"), m("d")])),
        (m("d"), BTreeSet::new()),
    ]);
    assert_eq!(cycles_in(&graph), vec![vec![m("a"), m("b"), m("c")]]);
    assert_eq!(
        one_cycle(&graph, &[m("a"), m("b"), m("c")]),
        vec![m("a"), m("b"), m("c"), m("a")]
    );
    let chain: Graph = BTreeMap::from([(m("a"), BTreeSet::from([m("b")]))]);
    assert!(cycles_in(&chain).is_empty());
    // A name the crate root re-exports is followed to the module it comes
    // from (a cycle through `crate::X` is a cycle).
    let modules = BTreeMap::from([
        (Vec::new(), PathBuf::from("lib.rs")),
        (m("a"), PathBuf::from("a.rs")),
        (m("b"), PathBuf::from("b.rs")),
    ]);
    let reexports: Reexports =
        BTreeMap::from([(Vec::new(), reexports_of("pub use a::{X, Y as Z};\n"))]);
    assert_eq!(
        resolve("crate::Z", &m("b"), &modules, &reexports),
        Some(m("a"))
    );
    assert_eq!(
        resolve("crate::W", &m("b"), &modules, &reexports),
        Some(Vec::new())
    );
    let long = long_functions(&root);
    for (file, name) in LONG_FN_EXCEPTIONS {
        assert!(
            long.iter().any(|(f, n, _)| f == file && n == name),
            "{file}: fn {name} is no longer over {MAX_FN_LINES} lines: remove it from LONG_FN_EXCEPTIONS"
        );
    }
}
