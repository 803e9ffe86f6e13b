//! `sharedos serve` when its database fails for real, on both backends:
//! full (SQLite on a small tmpfs this test mounts and fills; PostgreSQL
//! with its database in a tablespace on such a tmpfs, so the server's own
//! writes get ENOSPC), locked (a PostgreSQL table locked by another
//! session past the store's lock timeout; SQLite's busy timeout is in
//! `sessions.rs`), and down (a PostgreSQL server that is stopped). Checked
//! from the outside: the status codes, the files on disk, the rows in the
//! database.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_store::cluster::TestDatabase;
use sharedos_store::{PostgresStore, SqliteOptions, SqliteStore, Store};
use sharedos_tests::served::{
    Events, agent_file, open_session, post_run, start_with, wait_state, write_config,
};
use tokio_postgres::NoTls;

/// A tmpfs of `size` mounted on `path`, unmounted on drop.
struct Tmpfs(PathBuf);

/// The uid the private PostgreSQL cluster runs as (`cluster.rs`).
const NOBODY: u32 = 65534;

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        Self::mount_with(path, &format!("size={size},mode=0700"))
    }

    /// Owned by the PostgreSQL server's uid: a tablespace's directory.
    fn mount_for_postgres(path: &Path, size: &str) -> Tmpfs {
        Self::mount_with(
            path,
            &format!("size={size},mode=0700,uid={NOBODY},gid={NOBODY}"),
        )
    }

    fn mount_with(path: &Path, options: &str) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs needs root");
        Tmpfs(path.to_path_buf())
    }

    /// Writes a filler file until the file system is full; returns it.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        while f.write_all(&[0]).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn write_script(name: &str) -> Value {
    json!([{"op": "call", "tool": "files.write", "arguments": {"path": name, "content": "x"}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_sqlite_disk_refuses_runs_and_fails_a_run_in_flight_audit_unavailable() {
    if !sharedos_tests::needs_root(
        "serve_store_outage::a_full_sqlite_disk_refuses_runs_and_fails_a_run_in_flight_audit_unavailable",
        "a small full disk is a tmpfs mounted for the test, which needs root",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let disk = Tmpfs::mount(&dir.path().join("db"), "4m");
    let db = dir.path().join("db").join("sharedos.db");
    let server = start_with(
        dir.path(),
        "serve.sock",
        &["--database", db.to_str().unwrap()],
    );
    let socket = server.socket();
    let session = open_session(&socket).await;

    // Full at admission: refused before dispatch, nothing stored.
    let filler = disk.fill();
    let (status, body) = post_run(&socket, &session, "full-1", write_script("refused.txt")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("full"),
        "{body}"
    );
    std::fs::remove_file(&filler).unwrap();
    let (status, body) = post_run(&socket, &session, "full-1", write_script("later.txt")).await;
    assert_eq!(
        (status, &body["repeated"]),
        (201, &json!(false)),
        "the refused admission stored nothing: {body}"
    );
    assert!(!agent_file(dir.path(), "refused.txt").exists());
    wait_state(&socket, body["run"]["id"].as_str().unwrap(), "ended").await;

    // Full mid-run, twice: the turn has started and waits; the disk fills.
    // First its next decision (the write's authorization) cannot be
    // recorded; then, in another run, its next journal write cannot.
    let (full, rows) = (Outage::Full(&disk), Db::Sqlite(db.clone()));
    mid_run(
        &socket,
        &session,
        dir.path(),
        &full,
        &rows,
        "decision",
        json!([]),
    )
    .await;
    let pause = json!([{"op": "emit", "type": "note", "data": {}}, {"op": "sleep", "ms": 5000}]);
    let journal = mid_run(
        &socket,
        &session,
        dir.path(),
        &full,
        &rows,
        "journal",
        pause,
    )
    .await;
    let why = journal["result"]["journalError"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("full"), "{journal}");
    drop(server);
}

/// The served host's database, to read its rows back.
enum Db {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Db {
    async fn open(&self) -> Arc<dyn Store> {
        match self {
            Db::Sqlite(path) => {
                Arc::new(SqliteStore::open(path, SqliteOptions::default()).unwrap())
            }
            Db::Postgres(conninfo) => {
                Arc::new(PostgresStore::connect(conninfo, None).await.unwrap())
            }
        }
    }
}

/// What fails under the running host, and how it ends.
enum Outage<'a> {
    /// The file system fills; space comes back while the run waits to
    /// store its end.
    Full(&'a Tmpfs),
    /// Another session holds `table` in SHARE mode (reads pass, writes
    /// wait), until the run has ended.
    Locked(&'a tokio_postgres::Client, &'static str),
}

impl Outage<'_> {
    async fn start(&self) -> Option<PathBuf> {
        match self {
            Outage::Full(disk) => Some(disk.fill()),
            Outage::Locked(client, table) => {
                client
                    .batch_execute(&format!("BEGIN; LOCK TABLE {table} IN SHARE MODE"))
                    .await
                    .unwrap();
                None
            }
        }
    }

    /// Ends the outage; returns the run once it has ended.
    async fn end(&self, socket: &Path, run: &str, filler: Option<PathBuf>) -> Value {
        match self {
            Outage::Full(_) => {
                // While the disk is full the run's end cannot be stored
                // either; it is retried, and lands once space is back.
                let in_flight = wait_state(socket, run, "in_flight").await;
                assert!(in_flight["result"].is_null());
                tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
                std::fs::remove_file(filler.unwrap()).unwrap();
                wait_state(socket, run, "ended").await
            }
            Outage::Locked(client, _) => {
                let ended = wait_state(socket, run, "ended").await;
                client.batch_execute("ROLLBACK").await.unwrap();
                ended
            }
        }
    }
}

/// Starts a run that emits `ready`, waits for the test's signal, runs
/// `between`, then writes a file. Starts the outage, signals, and ends the
/// outage. Returns the ended run, checked.
#[allow(clippy::too_many_arguments)]
async fn mid_run(
    socket: &Path,
    session: &str,
    dir: &Path,
    outage: &Outage<'_>,
    db: &Db,
    name: &str,
    between: Value,
) -> Value {
    let go = dir.join(format!("go-{name}"));
    let effect = format!("effect-{name}.txt");
    let mut script = vec![
        json!({"op": "emit", "type": "ready", "data": {}}),
        json!({"op": "wait_path", "path": go.to_str().unwrap()}),
    ];
    script.extend(between.as_array().unwrap().iter().cloned());
    script.push(
        json!({"op": "call", "tool": "files.write", "arguments": {"path": effect, "content": "x"}}),
    );
    script.push(json!({"op": "emit", "type": "after", "data": {}}));
    let (status, body) = post_run(socket, session, name, Value::Array(script)).await;
    assert_eq!(status, 201, "{body}");
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let mut events = Events::open(socket, &run, None).await;
    while let Some((_, _, e)) = events.next().await {
        if e["data"]["type"] == "ready" {
            break;
        }
    }
    let filler = outage.start().await;
    std::fs::write(&go, "").unwrap();
    let ended = outage.end(socket, &run, filler).await;
    assert_eq!(ended["result"]["status"], "failed", "{ended}");
    assert_eq!(
        ended["result"]["error"]["code"], "audit_unavailable",
        "{ended}"
    );
    assert!(
        !agent_file(dir, &effect).exists(),
        "no effect ran without its decision committed"
    );

    // The rows: every stored audit record and event reads back whole; no
    // allowed decision for the write, no `after` event, the journal has no
    // gap.
    let store = db.open().await;
    let trail = store.audit_trail(&run).await.unwrap();
    assert!(
        !trail.iter().any(|r| r.kind == "authorization.checked"
            && serde_json::to_value(r.outcome).unwrap() == "allowed"
            && r.operation_id.is_some()),
        "{trail:?}"
    );
    let journal = store.events_after(&run, None, 10_000).await.unwrap();
    let sequences: Vec<u64> = journal.iter().map(|e| e.sequence).collect();
    assert_eq!(sequences, (0..journal.len() as u64).collect::<Vec<_>>());
    assert!(!journal.iter().any(|e| e.data["type"] == "after"));
    ended
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_server_that_is_down_refuses_runs_before_dispatch() {
    let mut db = TestDatabase::private().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = start_with(dir.path(), "serve.sock", &["--postgres", &db.conninfo]);
    let socket = server.socket();
    let session = open_session(&socket).await;

    db.stop();
    let (status, body) = post_run(&socket, &session, "down-1", write_script("down.txt")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("the store is unavailable"), "{message}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !agent_file(dir.path(), "down.txt").exists(),
        "nothing was dispatched"
    );

    // A fresh start against the stopped server is refused with the reason.
    let out = Command::new(sharedos_tests::turns::workspace_bin("sharedos"))
        .args(["serve", "--config"])
        .arg(dir.path().join("host.toml"))
        .arg("--socket")
        .arg(dir.path().join("second.sock"))
        .args(["--postgres", &db.conninfo])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");
    drop(server);
}

/// `n` characters that neither pglz nor anything else compresses: a row
/// holding them needs `n` bytes of new pages (TOAST), not the free space
/// left in a page the table already has.
fn incompressible(n: usize) -> String {
    let mut g = sharedos_testkit::XorShift::new(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|_| char::from(b"0123456789abcdef"[(g.next_u64() & 15) as usize]))
        .collect()
}

async fn superuser(conninfo: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_postgres_tablespace_refuses_runs_and_fails_a_run_in_flight_audit_unavailable() {
    if !sharedos_tests::needs_root(
        "serve_store_outage::a_full_postgres_tablespace_refuses_runs_and_fails_a_run_in_flight_audit_unavailable",
        "a small full tablespace is a tmpfs mounted for the test, which needs root",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    // The database lives in a tablespace on a tmpfs: the server's own
    // writes to its tables get ENOSPC once the tmpfs is full (its WAL
    // stays in the data directory, so the server itself keeps running).
    let space = dir.path().join("pgspace");
    let disk = Tmpfs::mount_for_postgres(&space, "32m");
    let cluster = TestDatabase::private().await.unwrap();
    let admin = superuser(&cluster.conninfo).await;
    // Two statements: neither may run inside a transaction block.
    admin
        .batch_execute(&format!(
            "CREATE TABLESPACE small LOCATION '{}'",
            space.display()
        ))
        .await
        .unwrap();
    admin
        .batch_execute("CREATE DATABASE onsmall TABLESPACE small")
        .await
        .unwrap();
    let conninfo = cluster
        .conninfo
        .replace("dbname=postgres", "dbname=onsmall");
    let server = start_with(dir.path(), "serve.sock", &["--postgres", &conninfo]);
    let socket = server.socket();
    let session = open_session(&socket).await;

    // Full at admission: refused before dispatch, nothing stored.
    let filler = disk.fill();
    let (status, body) = post_run(&socket, &session, "full-1", write_script("refused.txt")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("53100") && message.contains("No space left on device"),
        "the server's own words: {message}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!agent_file(dir.path(), "refused.txt").exists());
    std::fs::remove_file(&filler).unwrap();
    let (status, body) = post_run(&socket, &session, "full-1", write_script("later.txt")).await;
    assert_eq!(
        (status, &body["repeated"]),
        (201, &json!(false)),
        "the refused admission stored nothing: {body}"
    );
    wait_state(&socket, body["run"]["id"].as_str().unwrap(), "ended").await;
    assert!(agent_file(dir.path(), "later.txt").exists());

    // Full mid-run: the run's next journal write (an event too large for
    // the pages the table has) cannot be stored.
    let blob = incompressible(256 * 1024);
    let pause = json!([{"op": "emit", "type": "note", "data": blob}, {"op": "sleep", "ms": 5000}]);
    let rows = Db::Postgres(conninfo.clone());
    let journal = mid_run(
        &socket,
        &session,
        dir.path(),
        &Outage::Full(&disk),
        &rows,
        "journal",
        pause,
    )
    .await;
    let why = journal["result"]["journalError"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("No space left on device"), "{journal}");
    drop(server);
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_table_locked_by_another_session_refuses_runs_and_fails_a_run_in_flight() {
    let db = TestDatabase::new().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = start_with(dir.path(), "serve.sock", &["--postgres", &db.conninfo]);
    let socket = server.socket();
    let session = open_session(&socket).await;
    let other = superuser(&db.conninfo).await;

    // Admission waits for the lock on `runs` as long as the store's lock
    // timeout (5 s), then refuses before dispatch; nothing stored.
    other
        .batch_execute("BEGIN; LOCK TABLE runs IN SHARE MODE")
        .await
        .unwrap();
    let (status, body) = post_run(&socket, &session, "locked-1", write_script("locked.txt")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("lock timeout"), "{message}");
    other.batch_execute("ROLLBACK").await.unwrap();
    assert!(!agent_file(dir.path(), "locked.txt").exists());
    let (status, body) = post_run(&socket, &session, "locked-1", write_script("later.txt")).await;
    assert_eq!((status, &body["repeated"]), (201, &json!(false)), "{body}");
    wait_state(&socket, body["run"]["id"].as_str().unwrap(), "ended").await;

    // Mid-run: the journal's table is locked; the next event's write times
    // out, and the turn ends audit_unavailable without its effect.
    let pause = json!([{"op": "emit", "type": "note", "data": {}}, {"op": "sleep", "ms": 8000}]);
    let rows = Db::Postgres(db.conninfo.clone());
    let journal = mid_run(
        &socket,
        &session,
        dir.path(),
        &Outage::Locked(&other, "run_events"),
        &rows,
        "journal",
        pause,
    )
    .await;
    let why = journal["result"]["journalError"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("lock timeout"), "{journal}");
    drop(server);
}
