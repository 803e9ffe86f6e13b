//! The module import graph of a crate, read from its source text: each
//! module and the modules its code names (`use` trees and inline paths,
//! re-exports followed), the pairs of files that import each other and
//! the import cycles of any length (strongly connected components).
//! tests/tests/architecture.rs holds the rules that read it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, skipping `target`, `node_modules`, `.git`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

pub fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The text before a file's `#[cfg(test)] mod tests` (the tests follow it).
pub fn non_test_text(text: &str) -> &str {
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
pub fn code_only(text: &str) -> String {
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
pub fn module_map(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
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
pub fn expand_use_tree(tree: &str, prefix: &str, out: &mut Vec<String>) {
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

pub fn join_path(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, _) => path.to_owned(),
        (_, true) => prefix.to_owned(),
        _ => format!("{prefix}::{path}"),
    }
}

/// Every `crate::`, `super::` and `self::` path a file's code names: its
/// `use` trees expanded, and the paths written inline.
pub fn referenced_paths(code: &str) -> Vec<String> {
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

/// What a module gives to the paths that name it: each name it
/// re-exports (`Name`, or the alias of `as`) with the path it re-exports,
/// as written (`pub use a::b::Name;`), the paths its glob re-exports
/// (`pub use a::b::*;` gives `a::b`) and the names it defines itself.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Exports {
    pub named: BTreeMap<String, String>,
    pub globs: Vec<String>,
    pub defined: BTreeSet<String>,
}

/// Each module's [`Exports`].
pub type Reexports = BTreeMap<Vec<String>, Exports>;

pub fn reexports_of(code: &str) -> Exports {
    let mut out = Exports {
        defined: defined_names(code),
        ..Exports::default()
    };
    for head in ["pub use ", "pub(crate) use ", "pub(super) use "] {
        let mut rest = code;
        while let Some(at) = rest.find(head) {
            let after = &rest[at + head.len()..];
            let end = after.find(';').unwrap_or(after.len());
            let mut with_alias = Vec::new();
            expand_use_tree_aliased(&after[..end], "", &mut with_alias);
            for (path, name) in with_alias {
                if name == "*" {
                    out.globs
                        .push(path.trim_end_matches("*").trim_end_matches("::").to_owned());
                } else if name != "self" {
                    out.named.insert(name, path);
                }
            }
            rest = &after[end..];
        }
    }
    out
}

/// The names of the items a module's code defines (`struct X`, `fn f`,
/// `mod m`, `macro_rules! m`, ...), read from its text.
fn defined_names(code: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 10] = [
        "struct",
        "enum",
        "fn",
        "trait",
        "type",
        "const",
        "static",
        "union",
        "mod",
        "macro_rules!",
    ];
    let words: Vec<&str> = code
        .split(|c: char| c.is_whitespace() || matches!(c, '(' | '{' | '<' | ':' | ';' | '='))
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|w| KEYWORDS.contains(&w[0]))
        .map(|w| w[1].to_owned())
        .collect()
}

/// [`expand_use_tree`], keeping for each path the name it is known by.
pub fn expand_use_tree_aliased(tree: &str, prefix: &str, out: &mut Vec<(String, String)>) {
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
/// module re-exports is followed to the module it comes from, through a
/// glob (`pub use a::*`) too when the module does not define the name
/// itself and the glob's module gives it.
pub fn resolve(
    path: &str,
    from: &[String],
    modules: &BTreeMap<Vec<String>, PathBuf>,
    reexports: &Reexports,
) -> Option<Vec<String>> {
    resolve_within(path, from, modules, reexports, 4)
}

pub fn resolve_within(
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
    let name = full.get(found.len());
    let exports = reexports.get(&found);
    let reexported = name.and_then(|name| {
        let exports = exports?;
        if let Some(target) = exports.named.get(name) {
            return Some(target.clone());
        }
        if exports.defined.contains(name) {
            return None;
        }
        // A glob re-export: the glob whose module gives the name.
        exports.globs.iter().find_map(|glob| {
            let from_glob = resolve_within(glob, &found, modules, reexports, 0)?;
            let mut sub = from_glob.clone();
            sub.push(name.clone());
            let gives = modules.contains_key(&sub)
                || reexports.get(&from_glob).is_some_and(|e| {
                    e.defined.contains(name) || e.named.contains_key(name) || !e.globs.is_empty()
                });
            gives.then(|| format!("{glob}::{name}"))
        })
    });
    match reexported {
        Some(target) if depth > 0 => {
            let mut path = target;
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
pub type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

pub fn import_graph(src: &Path) -> (BTreeMap<Vec<String>, PathBuf>, Graph) {
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
pub fn import_pairs(root: &Path, src: &Path) -> Vec<(String, String)> {
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
pub fn cycles_in(graph: &Graph) -> Vec<Vec<Vec<String>>> {
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
pub fn one_cycle(graph: &Graph, component: &[Vec<String>]) -> Vec<Vec<String>> {
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
pub fn module_cycles(src: &Path) -> Vec<(Vec<String>, String)> {
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
