//! `sharedos grants`: an operator's view of the grants a served host reads
//! from its store (docs/STORE.md, "Grants"): list them, add one, revoke
//! one. Every host sharing the database applies a change from its next
//! turn on.

use std::path::PathBuf;

use serde::Deserialize;
use sharedos_kernel::{Grant, KernelConfig};
use sharedos_protocol::Timestamp;
use sharedos_serve::store::{GrantOrigin, Store, StoreError, StoredGrant};

use sharedos_host::config::HostConfig;
use sharedos_serve::serve::StoreChoice;

/// `sharedos grants` arguments: the store, as `sharedos serve` takes it.
#[derive(Debug, clap::Args)]
pub struct GrantsArgs {
    /// The host configuration (its namespaces check an added grant; its
    /// directory holds the default database).
    #[arg(long, value_name = "host.toml")]
    pub config: PathBuf,
    /// The SQLite database (default: sharedos.db next to the configuration).
    #[arg(long, value_name = "PATH", conflicts_with = "postgres")]
    pub database: Option<PathBuf>,
    /// The PostgreSQL store (a libpq connection string).
    #[arg(long, value_name = "CONNINFO")]
    pub postgres: Option<String>,
    #[command(subcommand)]
    pub action: GrantsAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum GrantsAction {
    /// Every stored grant: id, state, origin, subject, namespace, uses.
    List {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add grants from a file ("-": standard input): one JSON grant, a JSON
    /// array of grants, or TOML with `[[grants]]` tables (the shape of
    /// `[[kernel.grants]]`).
    Add { file: PathBuf },
    /// Revoke a grant for every later turn of every host.
    Revoke { id: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsToml {
    grants: Vec<Grant>,
}

fn parse_grants(text: &str, from: &str) -> Result<Vec<Grant>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') {
        return serde_json::from_str::<Grant>(text)
            .map(|g| vec![g])
            .map_err(|e| format!("{from}: not a grant: {e}"));
    }
    if trimmed.starts_with('[') && !trimmed.starts_with("[[") {
        return serde_json::from_str(text).map_err(|e| format!("{from}: not a grant array: {e}"));
    }
    toml::from_str::<GrantsToml>(text)
        .map(|t| t.grants)
        .map_err(|e| format!("{from}: neither a JSON grant nor TOML with [[grants]] tables: {e}"))
}

/// Checks new grants as the configuration's own are checked: known
/// namespaces, no empty capability, `maxUses` above 0, a parent that
/// exists (in the file or the store).
async fn check(config: &HostConfig, store: &dyn Store, new: &[Grant]) -> Result<(), String> {
    let mut kernel: KernelConfig = config.kernel.clone();
    kernel.grants = Vec::new();
    for g in new {
        let mut parent = g.parent_grant_id.clone();
        while let Some(id) = parent.take() {
            if new.iter().chain(&kernel.grants).any(|x| x.id == id) {
                break;
            }
            let stored = store.grant(id.as_str()).await.map_err(|e| e.to_string())?;
            if let Some(p) = stored {
                parent = p.grant.parent_grant_id.clone();
                kernel.grants.push(p.grant);
            }
        }
    }
    kernel.grants.extend(new.iter().cloned());
    kernel
        .validate()
        .map_err(|e| format!("the grant is not valid: {e}"))
}

fn print_table(grants: &[(StoredGrant, Option<u64>)]) {
    println!("id\tstate\torigin\tsubject\tnamespace\tuses");
    for (g, remaining) in grants {
        let uses = match (g.grant.max_uses, remaining) {
            (Some(max), Some(left)) => format!("{}/{max}", max - left),
            _ => "unbounded".to_owned(),
        };
        println!(
            "{}\t{}\t{}\t{}\t{}\t{uses}",
            g.grant.id.as_str(),
            if g.grant.revoked { "revoked" } else { "live" },
            g.origin.as_str(),
            g.grant.subject.path().join("/"),
            g.grant.namespace_id.as_str(),
        );
    }
}

async fn list(store: &dyn Store, json: bool) -> Result<(), String> {
    let mut rows = Vec::new();
    for g in store.grants().await.map_err(|e| e.to_string())? {
        let remaining = match g.grant.max_uses {
            Some(max) => Some(store.remaining(g.grant.id.as_str(), max).await?),
            None => None,
        };
        rows.push((g, remaining));
    }
    if json {
        let out: Vec<serde_json::Value> = rows
            .iter()
            .map(|(g, left)| {
                let mut v = serde_json::to_value(g).unwrap_or_default();
                v["remainingUses"] = serde_json::to_value(left).unwrap_or_default();
                v
            })
            .collect();
        println!("{}", serde_json::Value::Array(out));
    } else {
        print_table(&rows);
    }
    Ok(())
}

async fn act(args: &GrantsArgs, config: &HostConfig, store: &dyn Store) -> Result<(), String> {
    let at = Timestamp::now().to_string();
    match &args.action {
        GrantsAction::List { json } => list(store, *json).await,
        GrantsAction::Add { file } => {
            let from = file.display().to_string();
            let text = if from == "-" {
                std::io::read_to_string(std::io::stdin()).map_err(|e| format!("stdin: {e}"))?
            } else {
                std::fs::read_to_string(file).map_err(|e| format!("{from}: {e}"))?
            };
            let grants = parse_grants(&text, &from)?;
            check(config, store, &grants).await?;
            for g in &grants {
                store
                    .add_grant(g, GrantOrigin::Operator, &at)
                    .await
                    .map_err(|e| e.to_string())?;
                println!("added {}", g.id.as_str());
            }
            Ok(())
        }
        GrantsAction::Revoke { id } => revoked("grant", id, store.revoke_grant(id, &at).await),
    }
}

/// Runs `sharedos grants`; returns the exit code (2: the store or the
/// configuration could not be used; 1: the change was refused).
pub async fn command(args: GrantsArgs) -> i32 {
    let (config, store) =
        match open_store("grants", &args.config, &args.database, &args.postgres).await {
            Ok(opened) => opened,
            Err(code) => return code,
        };
    match act(&args, &config, store.as_ref()).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sharedos grants: {e}");
            1
        }
    }
}

/// The configuration and the store a store-managing command (`grants`,
/// `tokens`) works on; `Err(2)`, said on stderr, when either cannot be
/// used.
pub(crate) async fn open_store(
    command: &str,
    config: &std::path::Path,
    database: &Option<PathBuf>,
    postgres: &Option<String>,
) -> Result<(HostConfig, std::sync::Arc<dyn Store>), i32> {
    let config = HostConfig::load(config).map_err(|e| {
        eprintln!("sharedos {command}: {e}");
        2
    })?;
    let choice = StoreChoice::from_flags(&config, database.clone(), postgres.clone());
    let store = choice.open().await.map_err(|e| {
        eprintln!("sharedos {command}: {e}");
        2
    })?;
    Ok((config, store))
}

/// What a revocation of `what` `id` did, as `grants` and `tokens` print it.
pub(crate) fn revoked(
    what: &str,
    id: &str,
    result: Result<bool, StoreError>,
) -> Result<(), String> {
    match result {
        Ok(true) => {
            println!("revoked {id}");
            Ok(())
        }
        Ok(false) => {
            println!("{id} was already revoked");
            Ok(())
        }
        Err(StoreError::NotFound { .. }) => Err(format!(
            "no {what} {id:?} in the store: `sharedos {what}s list` shows the ids"
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_grants;

    const ONE: &str = r#"{"id": "g1", "subject": {"kind": "agent", "agentId": "alice"},
        "issuer": {"kind": "service", "serviceId": "host"}, "namespaceId": "t",
        "capabilities": [{"namespace": "files", "path": ["alice"], "scope": "descendants", "actions": ["read"]}]}"#;

    #[test]
    fn a_grant_file_is_one_json_grant_an_array_or_toml_grants() {
        assert_eq!(parse_grants(ONE, "f").unwrap()[0].id.as_str(), "g1");
        let two = format!("[{ONE}, {}]", ONE.replace("\"g1\"", "\"g2\""));
        let ids: Vec<String> = parse_grants(&two, "f")
            .unwrap()
            .iter()
            .map(|g| g.id.as_str().to_owned())
            .collect();
        assert_eq!(ids, ["g1", "g2"]);
        let toml = r#"
[[grants]]
id = "g3"
subject = { kind = "agent", agentId = "alice" }
issuer = { kind = "service", serviceId = "host" }
namespaceId = "t"
maxUses = 2
capabilities = [{ namespace = "files", path = ["alice"], scope = "exact", actions = ["read"] }]
"#;
        let g = parse_grants(toml, "f").unwrap();
        assert_eq!((g[0].id.as_str(), g[0].max_uses), ("g3", Some(2)));
    }

    #[test]
    fn a_grant_file_with_an_unknown_field_or_neither_shape_is_refused_by_name() {
        let typo = ONE.replace("\"capabilities\"", "\"capabilites\"");
        let err = parse_grants(&typo, "grant.json").unwrap_err();
        assert!(err.starts_with("grant.json: not a grant"), "{err}");
        let err = parse_grants("hello", "g.txt").unwrap_err();
        assert!(err.contains("neither a JSON grant nor TOML"), "{err}");
    }
}
