//! The built-in file tools on a real temp dir: round trip, limits, and
//! every way out of the agent's directory (`..`, absolute, symlinks, a
//! symlink swapped in during the calls).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use serde_json::{Value, json};
use sharedos_kernel::{
    FilesConfig, Kernel, KernelConfig, KernelTurn, MemoryAuditSink, Scope, TurnKernel,
};
use sharedos_protocol::{AccessContext, ToolResult, ToolStatus};
use tokio_util::sync::CancellationToken;

struct Files {
    kernel: Kernel,
    sink: Arc<MemoryAuditSink>,
    root: tempfile::TempDir,
    outside: tempfile::TempDir,
    ctx: AccessContext,
    turn: Arc<dyn KernelTurn>,
}

impl Files {
    fn agent_dir(&self) -> std::path::PathBuf {
        self.root.path().join("tenant-1").join("alice")
    }
    async fn call(&self, tool: &str, args: Value) -> ToolResult {
        let id = uuid::Uuid::new_v4().to_string();
        self.turn
            .invoke_tool(&self.ctx, &call(&id, tool, args), CancellationToken::new())
            .await
            .unwrap()
    }
}

async fn files_with(config: FilesConfig) -> Files {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside secret").unwrap();
    let config = KernelConfig {
        grants: vec![grant(
            "mem",
            "alice",
            vec![cap("files", &["alice"], Scope::Descendants, &["*"])],
        )],
        files: config,
        ..KernelConfig::default()
    };
    let sink = Arc::new(MemoryAuditSink::new());
    let kernel = Kernel::from_config(&config, root.path(), sink.clone()).unwrap();
    let ctx = context("alice");
    let turn = kernel.open_turn(&ctx).await.unwrap();
    Files {
        kernel,
        sink,
        root,
        outside,
        ctx,
        turn,
    }
}

async fn files() -> Files {
    files_with(FilesConfig::default()).await
}

fn code(r: &ToolResult) -> Option<&str> {
    r.error().map(|e| e.code.as_str())
}

fn tree(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        out.push(e.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    out
}

#[tokio::test]
async fn write_read_list_delete_round_trip() {
    let f = files().await;
    let listed = f.turn.list_tools(&f.ctx).await.unwrap();
    let names: Vec<_> = listed.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(
        names,
        ["files.read", "files.write", "files.list", "files.delete"]
    );
    let empty = f.call("files.list", json!({})).await;
    assert_eq!(empty.output().unwrap()["entries"], json!([]));
    let w = f
        .call(
            "files.write",
            json!({"path": "notes/today.md", "content": "hello"}),
        )
        .await;
    assert_eq!(w.status(), ToolStatus::Succeeded, "{w:?}");
    assert_eq!(
        std::fs::read_to_string(f.agent_dir().join("notes/today.md")).unwrap(),
        "hello"
    );
    let r = f
        .call("files.read", json!({"path": "notes/today.md"}))
        .await;
    assert_eq!(r.output().unwrap()["content"], json!("hello"));
    let w = f
        .call(
            "files.write",
            json!({"path": "notes/today.md", "content": "replaced"}),
        )
        .await;
    assert_eq!(w.status(), ToolStatus::Succeeded);
    let l = f.call("files.list", json!({"path": "notes"})).await;
    assert_eq!(
        l.output().unwrap()["entries"],
        json!([{"name": "today.md", "kind": "file", "bytes": 8}])
    );
    let root = f.call("files.list", json!({"path": ""})).await;
    assert_eq!(
        root.output().unwrap()["entries"][0]["kind"],
        json!("directory")
    );
    assert_eq!(
        f.call("files.delete", json!({"path": "notes/today.md"}))
            .await
            .status(),
        ToolStatus::Succeeded
    );
    assert_eq!(
        code(
            &f.call("files.read", json!({"path": "notes/today.md"}))
                .await
        ),
        Some("file_not_found")
    );
    assert_eq!(
        f.call("files.delete", json!({"path": "notes"}))
            .await
            .status(),
        ToolStatus::Succeeded
    );
    assert!(tree(&f.agent_dir()).is_empty(), "no temp files left behind");
}

#[tokio::test]
async fn the_requirement_is_the_exact_file_path() {
    let f = files().await;
    f.call("files.write", json!({"path": "a/b.txt", "content": "x"}))
        .await;
    let checked: Vec<_> = f
        .sink
        .records()
        .into_iter()
        .filter(|r| r.kind == "authorization.checked")
        .collect();
    let res = checked[0].resource.clone().unwrap();
    let path: Vec<_> = res.path.iter().map(|s| s.as_str().to_owned()).collect();
    assert_eq!(
        (res.namespace.as_str(), path),
        (
            "files",
            vec!["alice".to_owned(), "a".into(), "b.txt".into()]
        )
    );
    assert_eq!(checked[0].action.as_deref(), Some("write"));
}

#[tokio::test]
async fn a_read_only_grant_cannot_write_and_another_agents_files_are_out_of_reach() {
    let root = tempfile::tempdir().unwrap();
    let config = KernelConfig {
        grants: vec![
            grant(
                "read",
                "alice",
                vec![cap(
                    "files",
                    &["alice"],
                    Scope::Descendants,
                    &["read", "list"],
                )],
            ),
            // A grant naming bob's files does not move alice's tools there.
            grant(
                "bobs",
                "alice",
                vec![cap("files", &["bob"], Scope::Descendants, &["*"])],
            ),
        ],
        ..KernelConfig::default()
    };
    let kernel =
        Kernel::from_config(&config, root.path(), Arc::new(MemoryAuditSink::new())).unwrap();
    let ctx = context("alice");
    let turn = kernel.open_turn(&ctx).await.unwrap();
    std::fs::create_dir_all(root.path().join("tenant-1/bob")).unwrap();
    std::fs::write(root.path().join("tenant-1/bob/diary.txt"), "bob's").unwrap();
    let w = call(
        "c1",
        "files.write",
        json!({"path": "x.txt", "content": "y"}),
    );
    let r = turn
        .invoke_tool(&ctx, &w, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(code(&r), Some("no_matching_grant"));
    let r = call("c2", "files.read", json!({"path": "diary.txt"}));
    let r = turn
        .invoke_tool(&ctx, &r, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(code(&r), Some("file_not_found"));
    assert!(!root.path().join("tenant-1/alice/x.txt").exists());
}

#[tokio::test]
async fn dot_dot_and_absolute_paths_are_invalid_arguments() {
    let f = files().await;
    for path in [
        "../escape.txt",
        "a/../../escape.txt",
        "/etc/passwd",
        "./x",
        "a//b",
        "a/ b",
        "a\\b",
        ".sharedos-tmp-x",
    ] {
        for (tool, args) in [
            ("files.write", json!({"path": path, "content": "pwned"})),
            ("files.read", json!({"path": path})),
            ("files.delete", json!({"path": path})),
            ("files.list", json!({"path": path})),
        ] {
            let r = f.call(tool, args).await;
            assert_eq!(code(&r), Some("invalid_tool_arguments"), "{tool} {path}");
            let msg = r.error().unwrap().message.to_string();
            assert!(msg.contains("/path") && !msg.contains("passwd"), "{msg}");
        }
    }
    assert!(!f.root.path().join("escape.txt").exists());
    assert!(!f.root.path().join("tenant-1/escape.txt").exists());
}

#[tokio::test]
async fn a_symlink_to_outside_is_never_followed() {
    let f = files().await;
    std::fs::create_dir_all(f.agent_dir()).unwrap();
    std::os::unix::fs::symlink(f.outside.path(), f.agent_dir().join("link")).unwrap();
    std::os::unix::fs::symlink(
        f.outside.path().join("secret.txt"),
        f.agent_dir().join("leaf"),
    )
    .unwrap();
    let before = tree(f.outside.path());
    for (tool, args) in [
        ("files.read", json!({"path": "link/secret.txt"})),
        (
            "files.write",
            json!({"path": "link/new.txt", "content": "pwned"}),
        ),
        ("files.delete", json!({"path": "link/secret.txt"})),
        ("files.list", json!({"path": "link"})),
        ("files.read", json!({"path": "leaf"})),
    ] {
        let r = f.call(tool, args.clone()).await;
        assert_eq!(code(&r), Some("path_not_allowed"), "{tool} {args}");
        assert!(
            !serde_json::to_string(&r)
                .unwrap()
                .contains("outside secret")
        );
    }
    // Writing over a symlink leaf replaces the link, never its target.
    let w = f
        .call("files.write", json!({"path": "leaf", "content": "mine"}))
        .await;
    assert_eq!(w.status(), ToolStatus::Succeeded);
    assert_eq!(
        std::fs::read_to_string(f.outside.path().join("secret.txt")).unwrap(),
        "outside secret"
    );
    assert!(
        !std::fs::symlink_metadata(f.agent_dir().join("leaf"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // Deleting the link removes the link only.
    assert_eq!(
        f.call("files.delete", json!({"path": "link"}))
            .await
            .status(),
        ToolStatus::Succeeded
    );
    assert_eq!(tree(f.outside.path()), before);
    assert_eq!(
        std::fs::read_to_string(f.outside.path().join("secret.txt")).unwrap(),
        "outside secret"
    );
}

#[tokio::test]
async fn the_agent_directory_itself_swapped_for_a_symlink_is_refused() {
    let f = files().await;
    std::fs::create_dir_all(f.root.path().join("tenant-1")).unwrap();
    std::os::unix::fs::symlink(f.outside.path(), f.agent_dir()).unwrap();
    let r = f
        .call("files.write", json!({"path": "x.txt", "content": "pwned"}))
        .await;
    assert_eq!(code(&r), Some("path_not_allowed"));
    let r = f.call("files.read", json!({"path": "secret.txt"})).await;
    assert_eq!(code(&r), Some("path_not_allowed"));
    assert_eq!(tree(f.outside.path()), ["secret.txt"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_during_the_calls_never_leads_outside() {
    let f = files().await;
    let dir = f.agent_dir().join("d");
    std::fs::create_dir_all(&dir).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (swap_stop, swap_dir, target) = (
        Arc::clone(&stop),
        dir.clone(),
        f.outside.path().to_path_buf(),
    );
    let swapper = std::thread::spawn(move || {
        let parked = swap_dir.with_extension("real");
        while !swap_stop.load(Ordering::Relaxed) {
            // Real directory -> symlink to outside -> real directory.
            if std::fs::rename(&swap_dir, &parked).is_ok() {
                let _ = std::os::unix::fs::symlink(&target, &swap_dir);
                std::thread::yield_now();
                let _ = std::fs::remove_file(&swap_dir);
                let _ = std::fs::rename(&parked, &swap_dir);
            }
        }
    });
    let mut outcomes = std::collections::BTreeMap::new();
    for i in 0..300 {
        let r = f
            .call(
                "files.write",
                json!({"path": format!("d/f{i}.txt"), "content": "race"}),
            )
            .await;
        *outcomes
            .entry(code(&r).unwrap_or("succeeded").to_owned())
            .or_insert(0) += 1;
        let r = f.call("files.read", json!({"path": "d/secret.txt"})).await;
        assert_ne!(
            r.status(),
            ToolStatus::Succeeded,
            "read outside through the swapped link"
        );
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert_eq!(
        tree(f.outside.path()),
        ["secret.txt"],
        "nothing written outside; outcomes {outcomes:?}"
    );
}

/// A file under the inline bound is read on the caller's thread, one over
/// it on the blocking pool: both answer the same way, a file that errs
/// (missing, a directory, a non-directory in the path) likewise.
#[tokio::test]
async fn small_and_large_files_read_alike_and_errors_are_the_same() {
    let f = files().await;
    let dir = f.agent_dir();
    std::fs::create_dir_all(dir.join("d")).unwrap();
    let small = "s".repeat(100);
    let large = "l".repeat(sharedos_kernel::tools::files::INLINE_READ_BYTES as usize + 1);
    std::fs::write(dir.join("d/small"), &small).unwrap();
    std::fs::write(dir.join("d/large"), &large).unwrap();
    for (path, content) in [("d/small", &small), ("d/large", &large)] {
        let r = f.call("files.read", json!({"path": path})).await;
        assert_eq!(r.status(), ToolStatus::Succeeded, "{path}: {r:?}");
        let out = r.output().unwrap();
        assert_eq!(out["content"], json!(content), "{path}");
        assert_eq!(out["bytes"], json!(content.len()), "{path}");
    }
    for (path, expected) in [
        ("d/missing", "file_not_found"),
        ("d", "not_a_file"),
        ("d/small/x", "not_a_directory"),
    ] {
        let r = f.call("files.read", json!({"path": path})).await;
        assert_eq!(code(&r), Some(expected), "{path}: {r:?}");
    }
}

#[tokio::test]
async fn size_limits_hold() {
    let f = files_with(FilesConfig {
        max_read_bytes: 8,
        max_write_bytes: 16,
        ..FilesConfig::default()
    })
    .await;
    let r = f
        .call(
            "files.write",
            json!({"path": "big", "content": "x".repeat(17)}),
        )
        .await;
    assert_eq!(code(&r), Some("invalid_tool_arguments"));
    assert!(r.error().unwrap().message.as_str().contains("/content"));
    assert_eq!(
        f.call(
            "files.write",
            json!({"path": "mid", "content": "x".repeat(12)})
        )
        .await
        .status(),
        ToolStatus::Succeeded
    );
    assert_eq!(
        code(&f.call("files.read", json!({"path": "mid"})).await),
        Some("file_too_large")
    );
}

#[tokio::test]
async fn a_fifo_or_a_directory_is_not_read() {
    let f = files().await;
    std::fs::create_dir_all(f.agent_dir().join("sub")).unwrap();
    let fifo = f.agent_dir().join("pipe");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status();
    if status.is_ok_and(|s| s.success()) {
        assert_eq!(
            code(&f.call("files.read", json!({"path": "pipe"})).await),
            Some("not_a_file")
        );
    }
    assert_eq!(
        code(&f.call("files.read", json!({"path": "sub"})).await),
        Some("not_a_file")
    );
}

#[tokio::test]
async fn a_namespace_id_that_is_not_a_name_is_refused() {
    let f = files().await;
    let mut ctx = f.ctx.clone();
    ctx.namespace_id = sharedos_protocol::ident("../..");
    let mut g = grant(
        "mem",
        "alice",
        vec![cap("files", &["alice"], Scope::Descendants, &["*"])],
    );
    g.namespace_id = ctx.namespace_id.clone();
    f.kernel.config_grants().unwrap().replace(vec![g]);
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    // A name no other program has put beside the root (its parent is
    // the shared temp directory).
    let name = format!(
        "escaped-{}",
        f.root.path().file_name().unwrap().to_string_lossy()
    );
    let c = call("c1", "files.write", json!({"path": name, "content": "y"}));
    let r = turn
        .invoke_tool(&ctx, &c, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(code(&r), Some("path_not_allowed"));
    assert!(!f.root.path().parent().unwrap().join(&name).exists());
}

#[tokio::test]
async fn f3_the_host_policy_only_narrows() {
    let f = files().await;
    assert_eq!(
        f.call(
            "files.write",
            json!({"path": "vault/k.txt", "content": "v"})
        )
        .await
        .status(),
        ToolStatus::Succeeded
    );
    f.kernel.set_host_policy(sharedos_kernel::HostPolicy {
        frozen: vec![sharedos_kernel::FrozenSubtree {
            namespace: sharedos_protocol::ident("files"),
            path: segs(&["alice", "vault"]),
        }],
        freeze_mutations: false,
    });
    assert_eq!(
        code(&f.call("files.read", json!({"path": "vault/k.txt"})).await),
        Some("host_policy_denied")
    );
    assert_eq!(
        f.call("files.write", json!({"path": "open.txt", "content": "v"}))
            .await
            .status(),
        ToolStatus::Succeeded
    );
    f.kernel.set_host_policy(sharedos_kernel::HostPolicy {
        frozen: vec![],
        freeze_mutations: true,
    });
    let listed: Vec<_> = f
        .turn
        .list_tools(&f.ctx)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(listed, ["files.read", "files.list"]);
    assert_eq!(
        code(
            &f.call("files.write", json!({"path": "open.txt", "content": "w"}))
                .await
        ),
        Some("host_policy_denied")
    );
    assert_eq!(
        code(&f.call("files.delete", json!({"path": "open.txt"})).await),
        Some("host_policy_denied")
    );
    assert_eq!(
        f.call("files.read", json!({"path": "vault/k.txt"}))
            .await
            .status(),
        ToolStatus::Succeeded
    );
    assert_eq!(
        std::fs::read_to_string(f.agent_dir().join("open.txt")).unwrap(),
        "v"
    );
    let denied: Vec<_> = f
        .sink
        .records()
        .into_iter()
        .filter(|r| {
            r.kind == "authorization.checked" && r.reason.as_deref() == Some("host_policy_denied")
        })
        .collect();
    assert_eq!(denied.len(), 3);
}

#[tokio::test]
async fn names_with_control_format_bidi_or_invisible_characters_are_refused() {
    let f = files().await;
    f.call("files.write", json!({"path": "seed.txt", "content": "x"}))
        .await;
    for (path, shown) in [
        ("invoice\u{202e}fdp.exe", "U+202E"),
        ("a/\u{2066}b\u{2069}", "U+2066"),
        ("zero\u{200b}width.txt", "U+200B"),
        ("\u{feff}bom.txt", "U+FEFF"),
        ("soft\u{ad}hyphen", "U+00AD"),
        ("tag\u{e0041}.txt", "U+E0041"),
        ("nbsp\u{a0}name", "U+00A0"),
        ("hangul\u{3164}filler", "U+3164"),
        ("line\u{2028}sep", "U+2028"),
        ("c1\u{9b}x", "U+009B"),
        ("esc\u{1b}[31m", "U+001B"),
    ] {
        for (tool, args) in [
            ("files.write", json!({"path": path, "content": "pwned"})),
            ("files.read", json!({"path": path})),
            ("files.delete", json!({"path": path})),
        ] {
            let r = f.call(tool, args).await;
            assert_eq!(code(&r), Some("invalid_tool_arguments"), "{tool} {path:?}");
            let msg = r.error().unwrap().message.to_string();
            assert!(msg.contains(shown), "{tool} {path:?}: {msg}");
            assert!(
                !msg.contains(path),
                "the refused name is never echoed: {msg}"
            );
        }
    }
    assert_eq!(tree(&f.agent_dir()), vec!["seed.txt".to_owned()]);
    // Letters of any script are names like any other.
    let r = f
        .call(
            "files.write",
            json!({"path": "résumé 漢字.md", "content": "ok"}),
        )
        .await;
    assert_eq!(r.status(), ToolStatus::Succeeded, "{r:?}");
}
