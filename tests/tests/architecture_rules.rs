//! The workspace's rules that docs/ARCHITECTURE.md states, checked on the
//! files: which crate may depend on which (a new edge fails here until the
//! table and the doc say why), no generated file committed, and every path
//! and spec section the docs and the code cite exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The committed files (`git ls-files`), relative to the root.
fn tracked() -> Vec<String> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Each package's workspace dependencies (the `[dependencies]` table only:
/// dev-dependencies are the tests' business).
fn crate_edges() -> BTreeMap<String, BTreeSet<String>> {
    let mut edges = BTreeMap::new();
    for file in tracked().iter().filter(|f| f.ends_with("Cargo.toml")) {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let manifest: toml::Table = toml::from_str(&text).unwrap();
        let Some(name) = manifest
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
        else {
            continue;
        };
        let deps: BTreeSet<String> = manifest
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|d| {
                d.keys()
                    .filter(|k| k.starts_with("sharedos-"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        edges.insert(name.to_owned(), deps);
    }
    edges
}

/// Which workspace crates each crate may depend on (docs/ARCHITECTURE.md,
/// "Crates"): the wire contract at the bottom, the peer on it, the SDK on
/// both, the kernel and the sandbox knowing nothing of processes or of each
/// other, the store under the host, the host on all of those, and the
/// binaries and test crates on top. `sharedos-fuzz` and `rmcp-echo` (the
/// bench's peer) are workspaces of their own.
const ALLOWED: &[(&str, &[&str])] = &[
    ("sharedos-protocol", &[]),
    ("sharedos-peer", &["sharedos-protocol"]),
    (
        "sharedos-plugin-sdk",
        &["sharedos-protocol", "sharedos-peer"],
    ),
    ("sharedos-kernel", &["sharedos-protocol"]),
    ("sharedos-sandbox", &[]),
    // Streams over one channel (the microVM's egress line): std alone.
    ("sharedos-chanmux", &[]),
    // The microVM guest's init: a program of its own, on nothing of ours
    // but the channel's framing, which the host's side shares.
    ("sharedos-guest-init", &["sharedos-chanmux"]),
    ("sharedos-store", &["sharedos-protocol", "sharedos-kernel"]),
    ("sharedos-egress", &["sharedos-protocol", "sharedos-kernel"]),
    (
        "sharedos-host",
        &[
            "sharedos-protocol",
            "sharedos-peer",
            "sharedos-plugin-sdk",
            "sharedos-kernel",
            "sharedos-sandbox",
            "sharedos-egress",
            "sharedos-chanmux",
        ],
    ),
    // Sessions and the HTTP API: the one product crate on the store.
    (
        "sharedos-serve",
        &[
            "sharedos-protocol",
            "sharedos-kernel",
            "sharedos-host",
            "sharedos-store",
        ],
    ),
    (
        "sharedos-conformance",
        &[
            "sharedos-protocol",
            "sharedos-kernel",
            "sharedos-sandbox",
            "sharedos-host",
        ],
    ),
    (
        "sharedos-echo",
        &["sharedos-protocol", "sharedos-plugin-sdk"],
    ),
    (
        "sharedos-standard",
        &["sharedos-protocol", "sharedos-plugin-sdk"],
    ),
    (
        "sharedos-harness",
        &["sharedos-protocol", "sharedos-plugin-sdk"],
    ),
    (
        "sharedos-adversary",
        &["sharedos-protocol", "sharedos-plugin-sdk"],
    ),
    (
        "sharedos-testplugin",
        &["sharedos-protocol", "sharedos-plugin-sdk"],
    ),
    (
        "sharedos-bench",
        &[
            "sharedos-protocol",
            "sharedos-plugin-sdk",
            "sharedos-kernel",
            "sharedos-sandbox",
            "sharedos-egress",
            "sharedos-host",
            "sharedos-store",
            "sharedos-testplugin",
        ],
    ),
    (
        "sharedos-cli",
        &[
            "sharedos-protocol",
            "sharedos-kernel",
            "sharedos-sandbox",
            "sharedos-egress",
            "sharedos-host",
            "sharedos-conformance",
            "sharedos-serve",
            "sharedos-standard",
            "sharedos-harness",
        ],
    ),
    // The test kit: dev-dependencies only (and sharedos-tests').
    (
        "sharedos-testkit",
        &[
            "sharedos-protocol",
            "sharedos-plugin-sdk",
            "sharedos-kernel",
        ],
    ),
    ("sharedos-tests", &["*"]),
    ("sharedos-fuzz", &["*"]),
    ("rmcp-echo", &[]),
];

/// The edges `edges` has that `ALLOWED` does not, and packages it does not
/// know.
fn forbidden_edges(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut out = Vec::new();
    for (krate, deps) in edges {
        let Some(may) = allowed.get(krate.as_str()) else {
            out.push(format!(
                "{krate}: not in the table of crates (add it, and to docs/ARCHITECTURE.md)"
            ));
            continue;
        };
        if may.contains(&"*") {
            continue;
        }
        for dep in deps {
            if !may.contains(&dep.as_str()) {
                out.push(format!("{krate} -> {dep}"));
            }
        }
    }
    out
}

#[test]
fn every_crate_depends_only_on_the_crates_the_architecture_allows() {
    let edges = crate_edges();
    assert!(
        edges.contains_key("sharedos-host"),
        "the manifests were read"
    );
    let bad = forbidden_edges(&edges);
    assert!(
        bad.is_empty(),
        "dependencies the architecture does not allow (docs/ARCHITECTURE.md, \"Crates\"):\n  {}",
        bad.join("\n  ")
    );
    // The check sees an edge: the kernel may not depend on the sandbox.
    let mut planted = edges.clone();
    planted
        .get_mut("sharedos-kernel")
        .unwrap()
        .insert("sharedos-sandbox".into());
    assert_eq!(
        forbidden_edges(&planted),
        vec!["sharedos-kernel -> sharedos-sandbox".to_owned()]
    );
}

/// What tools write and nobody writes by hand.
fn generated(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == ".rustc_info.json"
        || name.ends_with(".pyc")
        || name.ends_with(".tgz")
        || name.ends_with(".whl")
        || path.split('/').any(|c| {
            matches!(
                c,
                "target"
                    | "node_modules"
                    | "__pycache__"
                    | ".pytest_cache"
                    | ".cache"
                    | "dist"
                    | "build"
            ) || c.ends_with(".egg-info")
        })
}

#[test]
fn no_generated_file_is_committed() {
    let bad: Vec<String> = tracked().into_iter().filter(|p| generated(p)).collect();
    assert!(bad.is_empty(), "generated files committed: {bad:?}");
    assert!(generated("sdk/python/sharedos_plugin.egg-info/PKG-INFO"));
    assert!(generated(".rustc_info.json"));
    assert!(!generated("sdk/python/sharedos_plugin/host.py"));
}

/// The backticked paths a text cites (`host/src/seat.rs`, `docs/EGRESS.md`,
/// `plugins/harness/specs/`): relative paths with a directory part.
fn cited_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, part) in text.split('`').enumerate() {
        let p = part.trim_start_matches("./");
        let looks_like_path = i % 2 == 1
            && p.trim_end_matches('/').contains('/')
            && !p.starts_with('/')
            && !p.contains("://")
            && !p.contains(['*', '<', '{', ' ', '$', '@', ':', '='])
            && p.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && (p.ends_with('/')
                || [
                    ".rs", ".md", ".toml", ".json", ".py", ".mjs", ".txt", ".lock", ".sh",
                ]
                .iter()
                .any(|e| p.ends_with(e)));
        if looks_like_path {
            out.push(p.to_owned());
        }
    }
    out
}

/// The text of a Rust file's `//` comments, one line each.
fn comments(text: &str) -> String {
    text.lines()
        .filter_map(|l| l.split_once("//").map(|(_, c)| c))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_path_the_docs_cite_exists() {
    let files = tracked();
    let mut dirs: BTreeSet<String> = BTreeSet::new();
    for f in &files {
        let mut at = 0;
        while let Some(i) = f[at..].find('/') {
            dirs.insert(f[..at + i + 1].to_owned());
            at += i + 1;
        }
    }
    // A path is cited from the root, from docs/, or from the crate or
    // directory the paragraph is about (`executor/events.rs` under
    // host/src/): it exists when some committed file or directory ends
    // with it at a component boundary.
    let exists = |p: &str| {
        let hit = |have: &String| have == p || have.ends_with(&format!("/{p}"));
        if p.ends_with('/') {
            dirs.iter().any(hit)
        } else {
            files.iter().any(hit)
        }
    };
    // A path whose first directory is none of the repository's is about
    // something else (a path inside the sandbox) and is not checked; nor
    // is one under a served host's files root (`filesRoot = "files"` in
    // the docs' host.toml: `files/<namespace>/<agent>/...`), which is the
    // host's data, not the repository's, whatever directories the
    // repository has named `files`.
    let ours = |p: &str| {
        let first = p.split('/').next().unwrap_or_default();
        first != "files"
            && dirs
                .iter()
                .any(|d| d.trim_end_matches('/').rsplit('/').next() == Some(first))
    };
    let mut missing = Vec::new();
    let mut seen = 0;
    for doc in files
        .iter()
        .filter(|f| f.ends_with(".md") || f.ends_with(".rs"))
    {
        let text = std::fs::read_to_string(root().join(doc)).unwrap_or_default();
        // In Rust source, the comments cite (`//`, `///`, `//!`).
        let text = if doc.ends_with(".rs") {
            comments(&text)
        } else {
            text
        };
        for p in cited_paths(&text) {
            seen += 1;
            if ours(&p) && !exists(&p) {
                missing.push(format!("{doc}: `{p}`"));
            }
        }
    }
    assert!(seen > 200, "the citations were found ({seen})");
    assert!(
        missing.is_empty(),
        "paths the docs and the code's comments cite that do not exist:\n  {}",
        missing.join("\n  ")
    );
    assert_eq!(
        cited_paths(&comments(
            "let x = \"`a/b.rs`\";\n/// see `host/src/seat.rs`\n"
        )),
        vec!["host/src/seat.rs".to_owned()]
    );
    assert_eq!(
        cited_paths("see `host/src/seat.rs`, `a b`, `fd/` and `host/src/`"),
        vec!["host/src/seat.rs".to_owned(), "host/src/".to_owned()]
    );
}

/// The section headings of a spec (`A.1`, `B.3`) and, for each, the
/// numbers of its list items (`B.3.4` is item 4 of B.3).
fn spec_sections(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current = None;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix('#') {
            let id = h.trim_start_matches('#').trim_start();
            let id: String = id
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
                .collect();
            let id = id.trim_end_matches('.').to_owned();
            current = Some(id.clone());
            out.entry(id).or_default();
        } else if let Some(cur) = &current {
            let item: String = line
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if !item.is_empty() && line.trim_start()[item.len()..].starts_with(". ") {
                out.entry(cur.clone()).or_default().insert(item);
            }
        }
    }
    out
}

/// `(spec, section)` for each `envelope.md B.2`-style citation in `text`.
fn spec_citations(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for spec in ["envelope", "sandbox", "protocol"] {
        let needle = format!("{spec}.md ");
        let mut at = 0;
        while let Some(i) = text[at..].find(&needle) {
            let start = at + i + needle.len();
            let rest = text[start..].trim_start_matches('§').trim_start();
            let id: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
                .collect();
            let id = id.trim_end_matches('.');
            let mut parts = id.split('.');
            let letter_ok = parts
                .next()
                .is_some_and(|l| l.len() == 1 && l.chars().all(|c| c.is_ascii_uppercase()));
            if letter_ok
                && id.contains('.')
                && parts.all(|n| n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty())
            {
                out.push((spec.to_owned(), id.to_owned()));
            }
            at = start;
        }
    }
    out
}

#[test]
fn every_spec_section_the_code_and_docs_cite_exists() {
    let mut sections = BTreeMap::new();
    for spec in ["envelope", "sandbox", "protocol"] {
        let text = std::fs::read_to_string(root().join(format!("docs/spec/{spec}.md"))).unwrap();
        sections.insert(spec.to_owned(), spec_sections(&text));
    }
    let mut missing = Vec::new();
    let mut seen = 0;
    for file in tracked()
        .iter()
        .filter(|f| f.ends_with(".rs") || f.ends_with(".md"))
    {
        let text = std::fs::read_to_string(root().join(file)).unwrap_or_default();
        for (spec, id) in spec_citations(&text) {
            seen += 1;
            let parts: Vec<&str> = id.split('.').collect();
            let found = match parts.as_slice() {
                [_, _] => sections[&spec].contains_key(&id),
                [l, s, item] => sections[&spec]
                    .get(&format!("{l}.{s}"))
                    .is_some_and(|items| items.contains(*item)),
                _ => false,
            };
            if !found {
                missing.push(format!("{file}: {spec}.md {id}"));
            }
        }
    }
    assert!(seen > 50, "the citations were found ({seen})");
    assert!(
        missing.is_empty(),
        "spec sections cited that docs/spec does not have:\n  {}",
        missing.join("\n  ")
    );
}
