//! `sharedos serve`: sessions and runs over HTTP+JSON, for a host
//! application in any language (docs/SERVE.md).
//!
//! A unix socket by default (its file mode 0600: whoever can open it is
//! the trusted host application); TCP only when asked, and then every
//! request must carry the bearer token. The kernel audits into the store
//! and counts `maxUses` in it. At start it takes its host id's lease and
//! reconciles the runs earlier processes under that id left in flight
//! (never re-run); while it runs it renews the lease and takes over the
//! runs of hosts whose lease expired ([`lease`]). On SIGTERM or SIGINT the
//! server stops accepting and waits for every run in flight to end (each
//! ends by its own deadline at the latest), then lets its lease go.

mod at_rest;
mod lease;
pub mod routes;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use sharedos_kernel::{AuditSink, Kernel, UsageStore};
use sharedos_protocol::Timestamp;
use sharedos_store::{PostgresStore, SqliteOptions, SqliteStore, Store, StoreGrants};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use crate::config::HostConfig;
use crate::executor::{Executor, OnTurnError};
use crate::seat::{LauncherFor, SeatError, executor_options, process_runtime, process_seat};
use crate::session::Sessions;
use routes::Failure;

/// Why a server (or its sessions) could not be set up: what failed and
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Seat(#[from] SeatError),
    #[error("{0}")]
    Setup(String),
}

/// Where the server listens.
#[derive(Debug, Clone)]
pub enum Listen {
    Unix(PathBuf),
    /// TCP, every request authenticated with this bearer token.
    Tcp {
        addr: SocketAddr,
        token: String,
    },
}

/// Which store the server keeps its state in.
#[derive(Debug, Clone)]
pub enum StoreChoice {
    /// The SQLite file (created if missing).
    Sqlite(PathBuf, SqliteOptions),
    /// A PostgreSQL server (libpq connection string), shared with other
    /// hosts; events kept per ended run.
    Postgres(String, Option<u64>),
}

impl StoreChoice {
    /// `--postgres`, else `--database`, else `sharedos.db` next to the
    /// configuration; every event kept.
    pub fn from_flags(
        config: &HostConfig,
        database: Option<PathBuf>,
        postgres: Option<String>,
    ) -> Self {
        match postgres {
            Some(conninfo) => StoreChoice::Postgres(conninfo, None),
            None => StoreChoice::Sqlite(
                database.unwrap_or_else(|| config.resolve(std::path::Path::new("sharedos.db"))),
                SqliteOptions::default(),
            ),
        }
    }
    /// Opens (or creates) the chosen store.
    pub async fn open(&self) -> Result<Arc<dyn Store>, ServeError> {
        let store: Arc<dyn Store> = match self {
            StoreChoice::Sqlite(path, options) => Arc::new(
                SqliteStore::open(path, options.clone())
                    .map_err(|e| ServeError::Setup(e.to_string()))?,
            ),
            StoreChoice::Postgres(conninfo, keep) => Arc::new(
                PostgresStore::connect(conninfo, *keep)
                    .await
                    .map_err(|e| ServeError::Setup(e.to_string()))?,
            ),
        };
        Ok(store)
    }
}

/// What `serve` needs beyond the host configuration.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: Listen,
    pub store: StoreChoice,
    /// Whose in-flight runs this process reconciles at start, and whose
    /// lease it holds.
    pub host_id: String,
    /// How long the lease lasts unrenewed (renewed every third of it).
    pub lease: Duration,
}

pub use crate::limits::{DEFAULT_LEASE, MIN_TOKEN_LEN};

/// Imports the configuration's `[kernel].grants` into the store
/// (docs/STORE.md, "Grants"), and reports what changed on stderr.
pub async fn import_grants(config: &HostConfig, store: &dyn Store) -> Result<(), ServeError> {
    let report = store
        .import_config_grants(&config.kernel.grants, &Timestamp::now().to_string())
        .await
        .map_err(|e| ServeError::Setup(format!("importing the configuration's grants: {e}")))?;
    for (what, ids) in [
        ("added", &report.added),
        ("updated", &report.updated),
        ("revoked (no longer configured)", &report.revoked),
        ("left revoked (revoked in the store)", &report.still_revoked),
    ] {
        if !ids.is_empty() {
            eprintln!(
                "sharedos serve: configured grants {what}: {}",
                ids.join(", ")
            );
        }
    }
    Ok(())
}

/// Builds the sessions of a configuration over `store`. The kernel's
/// grants are the store's (import the configuration's first:
/// [`import_grants`]).
pub fn sessions_from_config(
    config: &HostConfig,
    store: Arc<dyn Store>,
    launcher_for: &LauncherFor,
    host_id: &str,
) -> Result<Sessions, ServeError> {
    let files_root = config.resolve(&config.host.files_root);
    at_rest::files_root(&files_root, config.serve.allow_shared_store)?;
    let kernel = Kernel::builder_from_config(
        &config.kernel,
        &files_root,
        Arc::clone(&store) as Arc<dyn AuditSink>,
    )
    .map_err(|e| ServeError::Setup(format!("kernel: {e}")))?
    .grant_source(Arc::new(StoreGrants::new(Arc::clone(&store))))
    .usage_store(Arc::clone(&store) as Arc<dyn UsageStore>)
    .build();
    let kernel = Arc::new(kernel);
    let on_turn_error: OnTurnError = Arc::new(|error, ids| {
        tracing::error!(execution_id = %ids.execution_id, "turn failed: {error:?}");
    });
    let options = executor_options(config, on_turn_error);
    let mut executors = HashMap::new();
    for entry in &config.runtimes {
        let runtime = process_runtime(config, entry, launcher_for(entry)?)?;
        let executor = Executor::new(kernel.clone(), process_seat(runtime), options.clone())
            .map_err(|e| ServeError::Setup(format!("executor: {e}")))?;
        executors.insert(entry.id.to_string(), Arc::new(executor));
    }
    let agents = config
        .agents
        .iter()
        .map(|a| (a.agent_id.to_string(), a.runtime.to_string()))
        .collect();
    Ok(Sessions::new(
        store as Arc<dyn Store>,
        executors,
        agents,
        host_id,
    ))
}

/// Runs the server until `shutdown` fires, then drains.
pub async fn serve(
    config: &HostConfig,
    options: ServeOptions,
    launcher_for: &LauncherFor,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    // Nothing is opened, created or imported before both are checked.
    let allow_shared = config.serve.allow_shared_store;
    at_rest::check_store(&options.store, allow_shared)?;
    at_rest::files_root(&config.resolve(&config.host.files_root), allow_shared)?;
    let store = options.store.open().await?;
    import_grants(config, store.as_ref()).await?;
    let sessions = Arc::new(sessions_from_config(
        config,
        store,
        launcher_for,
        &options.host_id,
    )?);
    start_lease(&sessions, options.lease).await?;
    let stop_lease = CancellationToken::new();
    let lease_loop = lease::spawn(Arc::clone(&sessions), options.lease, stop_lease.clone());
    let token = match &options.listen {
        Listen::Tcp { token, .. } => Some(Arc::new(token.clone())),
        Listen::Unix(_) => None,
    };
    match &options.listen {
        Listen::Unix(path) => {
            let listener = bind_unix(path)?;
            eprintln!("sharedos serve: listening on unix:{}", path.display());
            accept_loop(&sessions, None, &shutdown, || listener.accept()).await;
            let _ = std::fs::remove_file(path);
        }
        Listen::Tcp { addr, .. } => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| ServeError::Setup(format!("cannot listen on {addr}: {e}")))?;
            eprintln!("sharedos serve: listening on tcp:{addr} (bearer token required)");
            accept_loop(&sessions, token, &shutdown, || listener.accept()).await;
        }
    }
    eprintln!("sharedos serve: draining runs in flight");
    sessions.drain().await;
    stop_lease.cancel();
    let _ = lease_loop.await;
    if sessions.lease_status().lost.is_none()
        && let Err(e) = sessions.store().release_lease().await
    {
        eprintln!("sharedos serve: could not release the lease: {e}");
    }
    eprintln!("sharedos serve: stopped");
    Ok(())
}

/// Takes the lease of this host id and reports the runs it reconciled.
async fn start_lease(sessions: &Sessions, lease: Duration) -> Result<(), ServeError> {
    let acquired = sessions
        .acquire_lease(lease)
        .await
        .map_err(|e| ServeError::Setup(format!("taking the lease of this host id: {e}")))?;
    if acquired.was_live {
        eprintln!(
            "sharedos serve: the lease of host id {:?} had not expired: the process that held it is fenced (give each live host its own --host-id)",
            sessions.host_id()
        );
    }
    eprintln!(
        "sharedos serve: holding the lease of host id {:?} (epoch {}, {} ms)",
        sessions.host_id(),
        acquired.lease.epoch,
        lease.as_millis()
    );
    for run in &acquired.recovered {
        eprintln!(
            "sharedos serve: recovered run {}: {}",
            run.run_id,
            serde_json::to_string(run).unwrap_or_default()
        );
    }
    Ok(())
}

fn bind_unix(path: &PathBuf) -> Result<UnixListener, ServeError> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::Setup(format!(
                "{} is in use by a running server: stop it or choose another --socket",
                path.display()
            )));
        }
        std::fs::remove_file(path).map_err(|e| {
            ServeError::Setup(format!(
                "cannot remove the stale socket {}: {e}",
                path.display()
            ))
        })?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| ServeError::Setup(format!("cannot listen on {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ServeError::Setup(format!("cannot restrict {}: {e}", path.display())))?;
    Ok(listener)
}

async fn accept_loop<S, A, F, Fut>(
    sessions: &Arc<Sessions>,
    token: Option<Arc<String>>,
    shutdown: &CancellationToken,
    accept: F,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = std::io::Result<(S, A)>>,
{
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    continue;
                }
            },
        };
        let sessions = Arc::clone(sessions);
        let token = token.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let sessions = Arc::clone(&sessions);
                let token = token.clone();
                async move {
                    if let Some(t) = &token
                        && !authorized(&req, t)
                    {
                        let f = Failure::new(
                            StatusCode::UNAUTHORIZED,
                            "unauthorized",
                            "send Authorization: Bearer <token>",
                        );
                        return Ok::<_, std::convert::Infallible>(f.into_response());
                    }
                    Ok(routes::route(sessions, req).await)
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Compares the bearer token in constant time.
fn authorized(req: &Request<hyper::body::Incoming>, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}
