//! The `sharedos serve` command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use sharedos_host::config::HostConfig;
use sharedos_host::seat::LauncherFor;
use sharedos_serve::config::ServeConfig;
use sharedos_serve::serve::{Listen, MIN_TOKEN_LEN, ServeOptions, StoreChoice, TlsFiles, serve};

/// The shortest lease accepted: renewals every third of it must have time
/// to reach the store.
const MIN_LEASE_MS: u64 = 300;

/// `sharedos serve` arguments.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[arg(long, value_name = "host.toml")]
    pub config: PathBuf,
    /// The unix socket (default: sharedos.sock next to the configuration).
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// Listen on TCP instead (opt-in); requires --token-file.
    #[arg(long, value_name = "ADDR:PORT", requires = "token_file")]
    pub listen: Option<SocketAddr>,
    /// A file holding the operator's bearer token (any scope); tenants
    /// send their own (`sharedos tokens add`).
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// TLS for --listen: the certificate chain (PEM); with --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key", requires = "listen")]
    pub tls_cert: Option<PathBuf>,
    /// TLS for --listen: the certificate's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The SQLite database (default: sharedos.db next to the configuration).
    #[arg(long, value_name = "PATH", conflicts_with = "postgres")]
    pub database: Option<PathBuf>,
    /// Keep the state in PostgreSQL instead (a libpq connection string,
    /// e.g. "host=/run/postgresql dbname=sharedos user=sharedos"), shared
    /// with other hosts.
    #[arg(long, value_name = "CONNINFO")]
    pub postgres: Option<String>,
    /// This host's id: the in-flight runs it reconciles at start are its own.
    #[arg(long, default_value = "local")]
    pub host_id: String,
    /// How long this host's lease lasts unrenewed, in milliseconds (renewed
    /// every third of it); other hosts take over its runs once it expired.
    #[arg(long, value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(MIN_LEASE_MS..))]
    pub lease_ms: u64,
    /// Events kept per ended run (the latest); default: all.
    #[arg(long, value_name = "N")]
    pub keep_events: Option<u64>,
}

fn options(args: &ServeArgs, config: &HostConfig) -> Result<ServeOptions, String> {
    let listen = match (&args.listen, &args.token_file) {
        (Some(addr), Some(file)) => {
            let token = std::fs::read_to_string(file)
                .map_err(|e| format!("--token-file {}: {e}", file.display()))?
                .trim()
                .to_owned();
            if token.len() < MIN_TOKEN_LEN {
                return Err(format!(
                    "--token-file {}: the token must have at least {MIN_TOKEN_LEN} characters",
                    file.display()
                ));
            }
            let tls = match (&args.tls_cert, &args.tls_key) {
                (Some(cert), Some(key)) => Some(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                _ => None,
            };
            Listen::Tcp {
                addr: *addr,
                token,
                tls,
            }
        }
        (Some(_), None) => return Err("--listen needs --token-file".into()),
        (None, _) => Listen::Unix(
            args.socket
                .clone()
                .unwrap_or_else(|| config.resolve(std::path::Path::new("sharedos.sock"))),
        ),
    };
    let mut store = StoreChoice::from_flags(config, args.database.clone(), args.postgres.clone());
    match &mut store {
        StoreChoice::Sqlite(_, options) => options.keep_events_per_run = args.keep_events,
        StoreChoice::Postgres(_, keep) => *keep = args.keep_events,
    }
    Ok(ServeOptions {
        listen,
        store,
        host_id: args.host_id.clone(),
        lease: std::time::Duration::from_millis(args.lease_ms),
    })
}

/// Runs `sharedos serve`; returns the exit code.
pub async fn command(args: ServeArgs, launcher_for: &LauncherFor) -> i32 {
    let config = match ServeConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sharedos serve: {e}");
            return 2;
        }
    };
    let options = match options(&args, &config.host) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sharedos serve: {e}");
            return 2;
        }
    };
    let shutdown = CancellationToken::new();
    let signalled = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        signalled.cancel();
    });
    match serve(&config, options, launcher_for, shutdown).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sharedos serve: {e}");
            2
        }
    }
}
