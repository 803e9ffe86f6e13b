//! The codebase's shape, checked on every run (issue 9, docs/ARCHITECTURE.md):
//!
//! - no two source files of a crate import each other (a module and its
//!   own submodules excepted: a parent declares and re-exports its
//!   children, a child uses what its parent shares);
//! - no modules of a crate import each other through a cycle of any
//!   length (a strongly connected component of the import graph, built
//!   by `sharedos_tests::modgraph`, re-exports and glob re-exports
//!   followed), with one such cycle printed;
//! - no function over 80 lines outside tests (`tests/` directories,
//!   `tests.rs` files, `#[cfg(test)] mod tests`) and the seccomp emitter
//!   with its syscall tables (`sandbox/src/layers/seccomp/`);
//! - every crate root whose crate has no `unsafe` says
//!   `#![forbid(unsafe_code)]`;
//! - the hand-written fast paths' own types are named only in their
//!   modules and by the users docs/ARCHITECTURE.md names.
//!
//! Each failure says what to fix. The source is read as text, with the
//! same rules as `python3 /work/tools/longfns.py .` for function length.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use sharedos_tests::modgraph::{
    Graph, Reexports, code_only, cycles_in, import_pairs, module_cycles, module_map, non_test_text,
    one_cycle, reexports_of, referenced_paths, relative, resolve, rust_files,
};

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

// ------------------------------------------------------------ fast paths

/// The names of the hand-written fast paths that stay in public APIs
/// (docs/ARCHITECTURE.md, "Fast paths sit behind their references", says
/// why each stays, with its figure), each with the only files outside
/// tests that may name it: its own module, the one consumer the doc
/// names, and the fuzz and bench code that holds it to its reference.
/// `(name, allowed path prefixes from the workspace root)`.
const FAST_PATH_NAMES: &[(&str, &[&str])] = &[
    // The call parsed in the pass that classified the line: the peer
    // hands it on, the host's driver takes it; `per_call::fast` gives it
    // the reference's face; the fuzz body holds the one pass and the hand
    // reader alone to the reference.
    (
        "Params::InvokeTool",
        &[
            "protocol/src/jsonrpc",
            "protocol/src/per_call.rs",
            "peer/src/read.rs",
            "fuzz/src/lib.rs",
        ],
    ),
    (
        "classify_call_by_hand",
        &["protocol/src/jsonrpc", "fuzz/src/lib.rs"],
    ),
    (
        "RequestParams::InvokeTool",
        &["peer/src/", "host/src/process/driver/turn.rs"],
    ),
    // A result written without serde: the peer and the SDK's RemoteHost.
    (
        "WriteJson",
        &[
            "protocol/src/tool_json",
            "protocol/src/per_call.rs",
            "peer/src/peer.rs",
            "peer/src/reply.rs",
            "peer/src/line.rs",
            "plugin-sdk/src/remote.rs",
        ],
    ),
    // The hand writers' constant pieces.
    (
        "Fragment",
        &[
            "protocol/src/json.rs",
            "protocol/src/tool_json",
            "kernel/src/audit/line.rs",
        ],
    ),
    // The turn's shared record parts: the kernel's alone (a sink outside
    // it that wants the lines takes `audit::per_call::LineSink`).
    ("AuditEntry", &["kernel/src/"]),
    ("EntryId", &["kernel/src/"]),
    ("RecordIdentity", &["kernel/src/"]),
    ("RecordMetadata", &["kernel/src/"]),
    ("IdentityRef", &["kernel/src/"]),
    ("MetadataRef", &["kernel/src/"]),
    // The call owned whole, so the host's RunToEnd can hand it to a task.
    (
        "invoke_tool_owned",
        &[
            "kernel/src/port.rs",
            "kernel/src/kernel/turn.rs",
            "host/src/executor/mediation.rs",
        ],
    ),
    ("OwnedInvoke", &["kernel/src/"]),
];

/// Whether `code` names `name` as a whole path (not as the tail of a
/// longer name: `RequestParams::InvokeTool` does not name
/// `Params::InvokeTool`).
fn names(code: &str, name: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(name)
        .any(|(at, _)| !code[..at].ends_with(word) && !code[at + name.len()..].starts_with(word))
}

/// Whether a file is test code as a whole (a `tests/` directory or a
/// `tests.rs` file).
fn is_test_file(rel: &str) -> bool {
    rel.split('/').any(|p| p == "tests") || rel.ends_with("/tests.rs")
}

/// `file: name` for each fast-path name a non-test file names outside its
/// allowed files.
fn fast_path_names_outside(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for dir in members(root).into_iter().chain([root.join("fuzz")]) {
        rust_files(&dir, &mut files);
    }
    let mut found = Vec::new();
    for file in files {
        let rel = relative(root, &file);
        if is_test_file(&rel) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let code = code_only(non_test_text(&text));
        for (name, allowed) in FAST_PATH_NAMES {
            if names(&code, name) && !allowed.iter().any(|a| rel.starts_with(a)) {
                found.push(format!("{rel}: {name}"));
            }
        }
    }
    found
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
fn no_fast_path_type_is_named_outside_its_modules() {
    let found = fast_path_names_outside(&workspace_root());
    assert!(
        found.is_empty(),
        "these files name a hand-written fast path's own type outside the modules allowed to \
         (FAST_PATH_NAMES): use the reference's face (the serde type, `invoke_tool`, \
         `AuditRecord`), or say in docs/ARCHITECTURE.md (\"Fast paths\") why this user needs \
         the fast one, with its figure, and allow it:\n  {}",
        found.join("\n  ")
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
    // A glob re-export is followed to the module that defines the name;
    // a name the re-exporting module defines itself stays there.
    let reexports: Reexports = BTreeMap::from([
        (Vec::new(), reexports_of("pub use a::*;\npub struct W;\n")),
        (
            m("a"),
            reexports_of("pub struct X;\npub(crate) fn f() {}\n"),
        ),
    ]);
    for (path, module) in [
        ("crate::X", m("a")),
        ("crate::f", m("a")),
        ("crate::W", Vec::new()),
    ] {
        assert_eq!(
            resolve(path, &m("b"), &modules, &reexports),
            Some(module),
            "{path}"
        );
    }
    // ... so a cycle through a glob is a cycle: b names crate::X, which
    // is a's, and a names b.
    let files = tempfile::tempdir().expect("a temporary directory");
    for (file, text) in [
        ("lib.rs", "mod a;\nmod b;\npub use a::*;\n"),
        ("a.rs", "pub struct X;\npub fn g() { crate::b::h() }\n"),
        ("b.rs", "pub fn h() { let _ = crate::X; }\n"),
    ] {
        std::fs::write(files.path().join(file), text).expect("a source file");
    }
    let found = module_cycles(files.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, vec!["crate::a", "crate::b"]);
    // A fast path named where it may not be is seen, a longer name that
    // ends with it is not; every allowed prefix still holds a file.
    assert!(names(
        "match p { Params::InvokeTool(c) => c }",
        "Params::InvokeTool"
    ));
    assert!(!names("RequestParams::InvokeTool(c)", "Params::InvokeTool"));
    assert!(!names("WriteJsonish", "WriteJson"));
    for (name, allowed) in FAST_PATH_NAMES {
        for prefix in *allowed {
            let mut files = Vec::new();
            let path = root.join(prefix);
            rust_files(path.parent().unwrap_or(&root), &mut files);
            assert!(
                files.iter().any(|f| relative(&root, f).starts_with(prefix)),
                "{name}: no file starts with {prefix}: remove it from FAST_PATH_NAMES"
            );
        }
    }
    let long = long_functions(&root);
    for (file, name) in LONG_FN_EXCEPTIONS {
        assert!(
            long.iter().any(|(f, n, _)| f == file && n == name),
            "{file}: fn {name} is no longer over {MAX_FN_LINES} lines: remove it from LONG_FN_EXCEPTIONS"
        );
    }
}
