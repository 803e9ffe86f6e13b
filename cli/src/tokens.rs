//! `sharedos tokens`: the tenants' credentials for `sharedos serve` over
//! TCP (docs/SERVE.md, "Tenants"; docs/STORE.md, "Tokens"): add one (its
//! secret printed once), list them (never a secret), revoke one. Every
//! host sharing the store refuses a revoked token from its next request.

use std::path::PathBuf;

use sharedos_protocol::{Address, Identifier, Timestamp};
use sharedos_serve::serve::tenants::new_token;
use sharedos_serve::store::Store;

use crate::grants::{open_store, revoked};

/// `sharedos tokens` arguments: the store, as `sharedos serve` takes it.
#[derive(Debug, clap::Args)]
pub struct TokensArgs {
    /// The host configuration (its directory holds the default database).
    #[arg(long, value_name = "host.toml")]
    pub config: PathBuf,
    /// The SQLite database (default: sharedos.db next to the configuration).
    #[arg(long, value_name = "PATH", conflicts_with = "postgres")]
    pub database: Option<PathBuf>,
    /// The PostgreSQL store (a libpq connection string).
    #[arg(long, value_name = "CONNINFO")]
    pub postgres: Option<String>,
    #[command(subcommand)]
    pub action: TokensAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum TokensAction {
    /// Add a tenant's token; its secret is printed once, on stdout.
    Add {
        /// The tenant's namespace: every request with the token is in it.
        #[arg(long, value_name = "ID")]
        namespace: String,
        /// The authority its turns run under, as Address JSON, e.g.
        /// '{"kind":"service","serviceId":"app-a"}'.
        #[arg(long, value_name = "JSON")]
        authority: String,
        /// A note for the operator (who holds it, what for).
        #[arg(long, default_value = "")]
        label: String,
    },
    /// Every stored token: id, state, namespace, authority, label, dates.
    List {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token for every later request of every host.
    Revoke { id: String },
}

async fn add(
    store: &dyn Store,
    namespace: &str,
    authority: &str,
    label: &str,
) -> Result<(), String> {
    let namespace =
        Identifier::new(namespace).map_err(|e| format!("--namespace {namespace:?}: {e}"))?;
    let authority: Address = serde_json::from_str(authority).map_err(|e| {
        format!("--authority: not an Address ({e}): e.g. '{{\"kind\":\"service\",\"serviceId\":\"app-a\"}}'")
    })?;
    for (what, text) in [
        ("--namespace", namespace.as_str()),
        ("--authority", &authority.path()[1]),
        ("--label", label),
    ] {
        if text.chars().any(char::is_control) {
            return Err(format!(
                "{what}: a control character: use printable characters only"
            ));
        }
    }
    let at = Timestamp::now().to_string();
    let (token, secret) = new_token(&namespace, &authority, label, &at)
        .map_err(|e| format!("the OS's random source failed: {e}"))?;
    store.add_token(&token).await.map_err(|e| e.to_string())?;
    eprintln!(
        "added {} for namespace {:?}: the secret below is shown once; the store keeps only its hash",
        token.id,
        namespace.as_str()
    );
    println!("{}\t{secret}", token.id);
    Ok(())
}

async fn list(store: &dyn Store, json: bool) -> Result<(), String> {
    let tokens = store.tokens().await.map_err(|e| e.to_string())?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&tokens).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!("ID\tSTATE\tNAMESPACE\tAUTHORITY\tLABEL\tCREATED\tREVOKED");
    for t in tokens {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            t.id,
            if t.revoked_at.is_some() {
                "revoked"
            } else {
                "live"
            },
            t.namespace_id,
            t.authority.path().join("/"),
            t.label,
            t.created_at,
            t.revoked_at.as_deref().unwrap_or("-"),
        );
    }
    Ok(())
}

async fn act(action: &TokensAction, store: &dyn Store) -> Result<(), String> {
    match action {
        TokensAction::Add {
            namespace,
            authority,
            label,
        } => add(store, namespace, authority, label).await,
        TokensAction::List { json } => list(store, *json).await,
        TokensAction::Revoke { id } => revoked(
            "token",
            id,
            store.revoke_token(id, &Timestamp::now().to_string()).await,
        ),
    }
}

/// Runs `sharedos tokens`; returns the exit code (2: the store or the
/// configuration could not be used; 1: the change was refused).
pub async fn command(args: TokensArgs) -> i32 {
    let (_, store) = match open_store("tokens", &args.config, &args.database, &args.postgres).await
    {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    match act(&args.action, store.as_ref()).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sharedos tokens: {e}");
            1
        }
    }
}
