//! Data at rest under a real `sharedos serve`: the SQLite database, its
//! `-wal` and `-shm` and the files root are created owner-only even under
//! `umask 000`; a database or a files root that others may read is refused
//! at start, naming the path and the fix, and left untouched, unless
//! host.toml says `[serve] allowSharedStore = true`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sharedos_tests::served::{
    open_session, run_to_end, serve_command, start_command, start_with, write_config_with,
};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `sharedos serve` that must refuse to start: its exit code and
/// stderr (killed and failed if it is still running after 60 s).
fn refused(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let command = serve_command(dir, "serve.sock", args);
    let log = dir.join("refused.log");
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sharedos serve started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), std::fs::read_to_string(&log).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_and_the_files_root_are_created_owner_only_under_umask_000() {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), "");
    let config = std::fs::read_to_string(dir.path().join("host.toml")).unwrap();
    let config = config.replace("filesRoot = \"files\"", "filesRoot = \"state/files\"");
    std::fs::write(dir.path().join("host.toml"), config).unwrap();
    let db = dir.path().join("sharedos.db");
    let mut command = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        "umask 000; exec \"$@\"".to_owned(),
        "sh".to_owned(),
    ];
    command.extend(serve_command(
        dir.path(),
        "serve.sock",
        &["--database", db.to_str().unwrap()],
    ));
    let server = start_command(dir.path(), "serve.sock", command);
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([{"op": "call", "tool": "files.write",
                         "arguments": {"path": "note.txt", "content": "x"}}]);
    let run = run_to_end(&socket, &session, "write", script).await;
    assert_eq!(run["result"]["status"], "succeeded", "{run}");

    for suffix in ["", "-wal", "-shm"] {
        let path = dir.path().join(format!("sharedos.db{suffix}"));
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    let files = dir.path().join("state").join("files");
    assert_eq!(mode(&files), 0o700, "the files root");
    assert_eq!(mode(&dir.path().join("state")), 0o700, "its missing parent");
    assert!(
        dir.path()
            .join("state/files")
            .join(sharedos_tests::turns::NAMESPACE)
            .join(sharedos_tests::turns::AGENT)
            .join("note.txt")
            .exists(),
        "the run wrote under the files root"
    );
    assert_eq!(mode(&socket), 0o600, "the socket");
}

#[test]
fn a_database_others_can_read_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), "");
    let db = dir.path().join("sharedos.db");
    std::fs::write(&db, b"").unwrap();
    set_mode(&db, 0o644);
    let (code, err) = refused(dir.path(), &["--database", db.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    let shown = db.display().to_string();
    for needle in [
        shown.as_str(),
        "mode 0644",
        "chmod 600",
        "allowSharedStore = true",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    assert!(!dir.path().join("serve.sock").exists(), "never listened");
    assert_eq!(std::fs::metadata(&db).unwrap().len(), 0, "never written to");
    assert_eq!(mode(&db), 0o644, "never changed");
    assert!(!dir.path().join("files").exists(), "nothing created");

    // Owner-only, the same file is used.
    set_mode(&db, 0o600);
    let server = start_with(
        dir.path(),
        "serve.sock",
        &["--database", db.to_str().unwrap()],
    );
    drop(server);
    assert!(std::fs::metadata(&db).unwrap().len() > 0, "migrated");
}

#[test]
fn a_files_root_others_can_reach_is_refused_before_the_store_is_created() {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), "");
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    set_mode(&files, 0o755);
    let db = dir.path().join("sharedos.db");
    let (code, err) = refused(dir.path(), &["--database", db.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    let shown = files.display().to_string();
    for needle in [shown.as_str(), "mode 0755", "chmod 700", "allowSharedStore"] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    assert!(!db.exists(), "the store was not created");
    assert!(!dir.path().join("serve.sock").exists(), "never listened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_shared_store_starts_on_a_shared_store_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), "\n[serve]\nallowSharedStore = true\n");
    let db = dir.path().join("sharedos.db");
    std::fs::write(&db, b"").unwrap();
    set_mode(&db, 0o644);
    let server = start_with(
        dir.path(),
        "serve.sock",
        &["--database", db.to_str().unwrap()],
    );
    let session = open_session(&server.socket()).await;
    assert!(!session.is_empty());
    let log = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("serve-"))
        .unwrap();
    let err = std::fs::read_to_string(log).unwrap();
    assert!(
        err.contains(&db.display().to_string()) && err.contains("starting anyway"),
        "{err}"
    );
    assert_eq!(mode(&db), 0o644, "the operator's mode is kept");
    assert_eq!(
        mode(&dir.path().join("files")),
        0o700,
        "a files root serve creates is owner-only all the same"
    );
}

#[test]
fn an_unknown_serve_option_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), "\n[serve]\nallowSharedStores = true\n");
    let (code, err) = refused(dir.path(), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("allowSharedStores"), "{err}");
}
