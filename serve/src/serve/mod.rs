//! `sharedos serve`: sessions and runs over HTTP+JSON, for a host
//! application in any language (docs/SERVE.md).
//!
//! A unix socket by default (its file mode 0600: whoever can open it is
//! the trusted host application, unless `[[serve.peers]]` binds its uid to
//! a tenant); TCP only when asked, with TLS or on loopback, and then every
//! request must carry a bearer token: the operator's, or a tenant's that
//! fixes its scope ([`tenants`]). The kernel audits into the store
//! and counts `maxUses` in it. At start it takes its host id's lease and
//! reconciles the runs earlier processes under that id left in flight
//! (never re-run); while it runs it renews the lease and takes over the
//! runs of hosts whose lease expired ([`lease`]). On SIGTERM or SIGINT the
//! server stops accepting and waits for every run in flight to end (each
//! ends by its own deadline at the latest), then lets its lease go.

pub mod api;
mod at_rest;
mod conn;
mod effects;
mod event_filter;
mod files;
mod lease;
mod listing;
pub mod openapi;
mod preflight;
mod retention;
pub mod routes;
pub mod tenants;
mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use sharedos_kernel::{AuditSink, Kernel, UsageStore};
use sharedos_protocol::Timestamp;
use sharedos_store::{PostgresStore, SqliteOptions, SqliteStore, Store, StoreGrants};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::ServeConfig;
use crate::limits::MAX_REFUSING_CONNECTIONS;
use crate::session::Sessions;
use conn::{AcceptBackoff, ConnLimits, Connections, Slot, Watched};
use routes::Failure;
use sharedos_host::config::HostConfig;
use sharedos_host::executor::{Executor, OnTurnError};
use sharedos_host::seat::{
    LauncherFor, SeatError, executor_options, process_runtime, process_seat,
};
use tenants::{Gate, Refusal};
pub use tls::TlsFiles;

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
    /// TCP, every request authenticated with a bearer token: this one,
    /// the operator's (any scope), or a tenant's from the store. With TLS
    /// when `tls` is given; plain TCP only on loopback unless `[serve]
    /// allowPlainTcp`.
    Tcp {
        addr: SocketAddr,
        token: String,
        tls: Option<TlsFiles>,
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
    served: &ServeConfig,
    store: Arc<dyn Store>,
    launcher_for: &LauncherFor,
    host_id: &str,
) -> Result<Sessions, ServeError> {
    let config = &served.host;
    let files_root = config.resolve(&config.host.files_root);
    at_rest::files_root(&files_root, served.serve.allow_shared_store)?;
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
    let sessions = Sessions::new(store as Arc<dyn Store>, executors, agents, host_id)
        .with_catalogue(builtin_tools(config))
        .with_preflight(crate::preflight::Preflight::new(
            config.clone(),
            builtin_tools(config),
        ))
        .with_admission(served.serve.admission());
    Ok(match session_files(served, &files_root)? {
        Some(files) => sessions.with_files(files),
        None => sessions,
    })
}

/// The files root sessions' files are moved in and out of, when the
/// kernel has file tools (docs/SERVE.md, "Files in and out").
fn session_files(
    config: &ServeConfig,
    files_root: &std::path::Path,
) -> Result<Option<crate::session::SessionFiles>, ServeError> {
    let kernel = &config.host.kernel;
    if !kernel.files.enabled {
        return Ok(None);
    }
    let root = sharedos_kernel::tools::files::FilesRoot::open(files_root, kernel.files.clone())
        .map_err(|e| ServeError::Setup(format!("files root {}: {e}", files_root.display())))?;
    Ok(Some(crate::session::SessionFiles {
        root: Arc::new(root),
        max_upload_bytes: config.serve.max_upload_bytes,
    }))
}

/// The built-in tools the configuration's kernel registers (the file tools,
/// the escalation tool), which a session may name.
fn builtin_tools(config: &HostConfig) -> Vec<sharedos_protocol::ToolDefinition> {
    use sharedos_kernel::tools::{escalate, files};
    let mut tools = Vec::new();
    if config.kernel.files.enabled {
        tools.extend(files::FileOp::ALL.map(files::definition));
    }
    if config.kernel.escalation.enabled {
        tools.push(escalate::definition());
    }
    tools
}

/// Runs the server until `shutdown` fires, then drains.
pub async fn serve(
    config: &ServeConfig,
    options: ServeOptions,
    launcher_for: &LauncherFor,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    // Nothing is opened, created or imported before both are checked.
    let allow_shared = config.serve.allow_shared_store;
    at_rest::check_store(&options.store, allow_shared)?;
    let host = &config.host;
    at_rest::files_root(&host.resolve(&host.host.files_root), allow_shared)?;
    let acceptor = tcp_security(config, &options.listen)?;
    let store = options.store.open().await?;
    import_grants(host, store.as_ref()).await?;
    let gate_store = Arc::clone(&store);
    let sessions = Arc::new(sessions_from_config(
        config,
        store,
        launcher_for,
        &options.host_id,
    )?);
    start_lease(&sessions, options.lease).await?;
    let stop_lease = CancellationToken::new();
    let sweeper = retention::Sweeper::new(config.serve.retention.clone());
    let lease_loop = lease::spawn(
        Arc::clone(&sessions),
        (options.lease, sweeper),
        stop_lease.clone(),
    );
    let cancels = sessions.watch_cancels(stop_lease.clone());
    let limits = ConnLimits {
        header_read: config.serve.header_read_timeout(),
        idle: config.serve.idle_timeout(),
        max_connections: conn::connection_cap(config.serve.max_connections),
    };
    let listening = Listening {
        config,
        sessions: &sessions,
        store: gate_store,
        limits,
        shutdown: &shutdown,
    };
    listening.run(&options.listen, acceptor).await?;
    eprintln!("sharedos serve: draining runs in flight");
    sessions.drain().await;
    stop_lease.cancel();
    let _ = lease_loop.await;
    let _ = cancels.await;
    if sessions.lease_status().lost.is_none()
        && let Err(e) = sessions.store().release_lease().await
    {
        eprintln!("sharedos serve: could not release the lease: {e}");
    }
    eprintln!("sharedos serve: stopped");
    Ok(())
}

/// What the listener serves, and until when.
struct Listening<'a> {
    config: &'a ServeConfig,
    sessions: &'a Arc<Sessions>,
    store: Arc<dyn Store>,
    limits: ConnLimits,
    shutdown: &'a CancellationToken,
}

impl Listening<'_> {
    /// Listens on `listen` until shutdown: the unix socket (each peer's
    /// gate by its uid), or TCP (plain or TLS, bearer tokens).
    async fn run(
        self,
        listen: &Listen,
        acceptor: Option<tokio_rustls::TlsAcceptor>,
    ) -> Result<(), ServeError> {
        let Listening {
            config,
            sessions,
            store,
            limits,
            shutdown,
        } = self;
        match listen {
            Listen::Unix(path) => {
                let listener = bind_unix(path)?;
                eprintln!("sharedos serve: listening on unix:{}", path.display());
                let peers = Arc::new(config.serve.peers.clone());
                let prepare = move |s: UnixStream| {
                    let gate = unix_gate(&peers, &s);
                    async move { gate.map(|g| (s, g)) }
                };
                accept_loop(sessions, limits, shutdown, || listener.accept(), prepare).await;
                let _ = std::fs::remove_file(path);
            }
            Listen::Tcp { addr, token, .. } => {
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|e| ServeError::Setup(format!("cannot listen on {addr}: {e}")))?;
                let gate = Gate::Bearer {
                    operator: Arc::new(token.clone()),
                    store,
                };
                let accept = || listener.accept();
                match acceptor {
                    None => {
                        eprintln!(
                            "sharedos serve: listening on tcp:{addr} (plain; bearer token required)"
                        );
                        let prepare = move |s: TcpStream| {
                            let gate = gate.clone();
                            async move { Some((s, gate)) }
                        };
                        accept_loop(sessions, limits, shutdown, accept, prepare).await;
                    }
                    Some(acceptor) => {
                        eprintln!(
                            "sharedos serve: listening on tcp:{addr} (TLS; bearer token required)"
                        );
                        let prepare = move |s: TcpStream| {
                            let (acceptor, gate) = (acceptor.clone(), gate.clone());
                            async move {
                                let tls =
                                    tokio::time::timeout(limits.header_read, acceptor.accept(s));
                                Some((tls.await.ok()?.ok()?, gate))
                            }
                        };
                        accept_loop(sessions, limits, shutdown, accept, prepare).await;
                    }
                }
            }
        }
        Ok(())
    }
}

/// TLS for a TCP listener, when its files are given (by flag or
/// `[serve]`); without them, plain TCP only on a loopback address unless
/// `[serve] allowPlainTcp`. Checked before anything is opened.
fn tcp_security(
    config: &ServeConfig,
    listen: &Listen,
) -> Result<Option<tokio_rustls::TlsAcceptor>, ServeError> {
    let Listen::Tcp { addr, tls, .. } = listen else {
        return Ok(None);
    };
    let configured = match (&config.serve.tls_cert, &config.serve.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: config.host.resolve(cert),
            key: config.host.resolve(key),
        }),
        _ => None,
    };
    match tls.clone().or(configured) {
        Some(files) => tls::acceptor(&files).map(Some),
        None if addr.ip().is_loopback() || config.serve.allow_plain_tcp => Ok(None),
        None => Err(ServeError::Setup(format!(
            "--listen {addr} is not a loopback address and no TLS is configured: bearer tokens would cross the network in clear; give --tls-cert and --tls-key (or [serve] tlsCert/tlsKey), listen on 127.0.0.1 or ::1, or set [serve] allowPlainTcp = true"
        ))),
    }
}

/// The gate of a unix connection: the socket's owner when no peer is
/// mapped; else by the peer's uid. A peer whose credentials cannot be read
/// while peers are mapped is refused (closed): it could be any tenant.
fn unix_gate(peers: &[crate::config::PeerTenant], stream: &UnixStream) -> Option<Gate> {
    if peers.is_empty() {
        return Some(Gate::Trusted);
    }
    match stream.peer_cred() {
        Ok(cred) => Some(tenants::peer_gate(peers, cred.uid())),
        Err(e) => {
            eprintln!(
                "sharedos serve: a unix peer's credentials could not be read ({e}): its connection is closed"
            );
            None
        }
    }
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

/// Accepts connections until `shutdown`, each held to `limits`
/// ([`conn`]): at the cap the longest idle one makes room, or the new one
/// is answered `503`; exhausted descriptors pause accepting.
async fn accept_loop<S, A, F, Fut, P, PFut, T>(
    sessions: &Arc<Sessions>,
    limits: ConnLimits,
    shutdown: &CancellationToken,
    accept: F,
    prepare: P,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = std::io::Result<(S, A)>>,
    P: Fn(S) -> PFut,
    PFut: Future<Output = Option<(T, Gate)>> + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connections = Connections::new(limits.max_connections);
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING_CONNECTIONS));
    let mut backoff = AcceptBackoff::default();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = accept() => match accepted {
                Ok((s, _)) => {
                    backoff.accepted();
                    s
                }
                Err(e) => {
                    if let Some(pause) = backoff.failed(&e) {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(pause) => {}
                        }
                    }
                    continue;
                }
            },
        };
        // A TLS handshake, or reading the peer's credentials, happens in
        // the connection's own task (bounded by `headerReadTimeoutMs`).
        match connections.admit() {
            Some(slot) => {
                let (sessions, prepared) = (Arc::clone(sessions), prepare(stream));
                tokio::spawn(async move {
                    if let Some((stream, gate)) = prepared.await {
                        serve_connection(stream, slot, sessions, gate, limits).await;
                    }
                });
            }
            None => {
                if let Ok(permit) = Arc::clone(&refusing).try_acquire_owned() {
                    let prepared = prepare(stream);
                    tokio::spawn(async move {
                        if let Some((stream, _)) = prepared.await {
                            refuse(stream, permit, limits).await;
                        }
                    });
                }
            }
        }
    }
}

/// One connection: its requests answered until the client leaves or the
/// watchdog closes it (idle, a slow head, or evicted).
async fn serve_connection<S>(
    stream: S,
    slot: Slot,
    sessions: Arc<Sessions>,
    gate: Gate,
    limits: ConnLimits,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::clone(&slot.activity);
    let service = service_fn(move |mut req: Request<hyper::body::Incoming>| {
        let guard = activity.begin();
        let sessions = Arc::clone(&sessions);
        let gate = gate.clone();
        async move {
            let authorization = req
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            let response = match gate.admit(authorization, req.uri().path()).await {
                Ok(bound) => {
                    if let Some(binding) = bound {
                        req.extensions_mut().insert(binding);
                    }
                    routes::route(sessions, req, limits.header_read).await
                }
                Err(refusal) => refused(refusal),
            };
            // The request is under way until its response's body is done.
            let response = response.map(|body| {
                body.map_frame(move |frame| {
                    let _held = &guard;
                    frame
                })
                .boxed_unsync()
            });
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let io = TokioIo::new(Watched::new(stream, Arc::clone(&slot.activity)));
    let connection = http1::Builder::new().serve_connection(io, service);
    tokio::select! {
        _ = connection => {}
        _ = slot.activity.expired(&limits) => {}
    }
}

/// A connection past the cap while every open one is busy: its request
/// answered `503 too_many_connections`, then closed.
async fn refuse<S>(stream: S, _permit: OwnedSemaphorePermit, limits: ConnLimits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let max = limits.max_connections;
    let service = service_fn(move |_req: Request<hyper::body::Incoming>| async move {
        let mut response = Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            format!("all {max} connections this host holds open are busy: retry shortly, or raise [serve] maxConnections"),
        )
        .into_response();
        response.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
        Ok::<_, std::convert::Infallible>(response)
    });
    let connection = http1::Builder::new()
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(limits.header_read, connection).await;
}

/// A request refused before routing; a `401` says how to authenticate.
fn refused(r: Refusal) -> hyper::Response<routes::Body> {
    let unauthorized = r.status == StatusCode::UNAUTHORIZED;
    let mut response = Failure::new(r.status, r.code, r.message).into_response();
    if unauthorized {
        response.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}
