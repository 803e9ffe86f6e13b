//! A PostgreSQL database for tests and benchmarks: a fresh database on
//! the server `SHAREDOS_TEST_POSTGRES` names (a libpq connection string,
//! set by `.ci/run`), or else a private cluster started here (`initdb` and
//! `postgres` from `SHAREDOS_PG_BIN`, or `/usr/lib/postgresql/<n>/bin`),
//! listening only on a unix socket in a temporary directory, run as
//! `nobody` when this process is root (PostgreSQL refuses root), and
//! stopped when the value is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

/// A database to test against; dropping it stops a private cluster.
pub struct TestDatabase {
    /// The libpq connection string of the fresh database.
    pub conninfo: String,
    cluster: Option<(Child, tempfile::TempDir)>,
    stopped: bool,
}

const NOBODY: u32 = 65534;

fn bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("SHAREDOS_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("no PostgreSQL in /usr/lib/postgresql ({e}): install the postgresql package or set SHAREDOS_TEST_POSTGRES"))?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").is_file())
        .collect();
    found.sort();
    found
        .pop()
        .ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin".to_owned())
}

fn as_postgres_user(program: &Path) -> Command {
    if rustix::process::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            format!("--reuid={NOBODY}"),
            format!("--regid={NOBODY}"),
            "--clear-groups".into(),
        ])
        .arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl TestDatabase {
    pub async fn new() -> Result<Self, String> {
        if let Ok(server) = std::env::var("SHAREDOS_TEST_POSTGRES") {
            let name = format!(
                "sharedos_test_{}",
                std::process::id() as u64 * 1_000_000 + counter()
            );
            let (client, conn) = tokio_postgres::connect(&server, NoTls)
                .await
                .map_err(|e| format!("SHAREDOS_TEST_POSTGRES: {e}"))?;
            tokio::spawn(conn);
            client
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .map_err(|e| format!("create database {name}: {e}"))?;
            return Ok(Self {
                conninfo: format!("{server} dbname={name}"),
                cluster: None,
                stopped: false,
            });
        }
        Self::private().await
    }

    /// A private cluster even when `SHAREDOS_TEST_POSTGRES` names a shared
    /// server: for a test that stops the server under a host.
    pub async fn private() -> Result<Self, String> {
        tokio::task::spawn_blocking(Self::private_cluster)
            .await
            .map_err(|e| e.to_string())?
    }

    /// Stops a private cluster now (fast shutdown: its backends end, so
    /// every client's connection breaks). Does nothing for a shared server.
    pub fn stop(&mut self) {
        if let Some((child, _)) = self.cluster.as_mut()
            && !self.stopped
        {
            // SIGINT: PostgreSQL's fast shutdown, which also ends its
            // backends; then reap it before the directory goes.
            if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
            }
            let _ = child.wait();
            self.stopped = true;
        }
    }

    fn private_cluster() -> Result<Self, String> {
        let bin = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("sharedos-pg-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY))
                .map_err(|e| e.to_string())?;
        }
        let data = dir.path().join("data");
        let status = as_postgres_user(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "sharedos", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("initdb: {e}"))?;
        if !status.success() {
            return Err(format!("initdb failed: {status}"));
        }
        let log =
            std::fs::File::create(dir.path().join("postgres.log")).map_err(|e| e.to_string())?;
        let child = as_postgres_user(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .args(["-c", "listen_addresses=", "-c", "max_connections=50"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("postgres: {e}"))?;
        let this = Self {
            conninfo: format!(
                "host={} user=sharedos dbname=postgres",
                dir.path().display()
            ),
            cluster: Some((child, dir)),
            stopped: false,
        };
        let ready = || {
            Command::new(bin.join("pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(this.socket_dir().unwrap_or(Path::new("/nonexistent")))
                .status()
                .is_ok_and(|s| s.success())
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready() {
            if Instant::now() > deadline {
                return Err("the private PostgreSQL cluster did not start in 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(this)
    }

    fn socket_dir(&self) -> Option<&Path> {
        self.cluster.as_ref().map(|(_, d)| d.path())
    }
}

fn counter() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        self.stop();
    }
}
