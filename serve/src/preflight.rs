//! The scope's half of `GET /v1/preflight`: the agents a session in the
//! caller's scope may name, each runtime's sandbox (built once per process
//! by `sharedos_host::preflight`), and the catalogue's tools with whether
//! a live grant covers each (docs/SERVE.md, "Preflight").

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_host::config::HostConfig;
use sharedos_host::preflight::{RuntimeSandbox, runtime_sandbox};
use sharedos_kernel::Grant;
use sharedos_protocol::{Address, Identifier, Timestamp, ToolDefinition};
use sharedos_store::{Store, StoreError};
use tokio::sync::OnceCell;

/// Why a preflight was refused.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("agent {name:?} is not bound to a runtime in the configuration (agents: {known})")]
    UnknownAgent { name: String, known: String },
    #[error("the scope's grants could not be read: {0}")]
    Store(#[from] StoreError),
}

/// The host's answer to "what would a session get here", each runtime's
/// sandbox built once for the process's life.
pub struct Preflight {
    config: HostConfig,
    catalogue: Vec<ToolDefinition>,
    sandboxes: HashMap<String, Arc<OnceCell<RuntimeSandbox>>>,
}

impl Preflight {
    /// `catalogue`: the tools a session may name (the host's built-in ones).
    pub fn new(config: HostConfig, catalogue: Vec<ToolDefinition>) -> Self {
        let sandboxes = config
            .runtimes
            .iter()
            .map(|r| (r.id.to_string(), Arc::new(OnceCell::new())))
            .collect();
        Self {
            config,
            catalogue,
            sandboxes,
        }
    }

    /// The sandbox of runtime `id`, built on first use (off the async
    /// threads: it forks) and kept.
    async fn sandbox(&self, id: &str) -> Option<RuntimeSandbox> {
        let cell = self.sandboxes.get(id)?;
        let entry = self.config.runtimes.iter().find(|r| r.id.as_str() == id)?;
        let built = cell
            .get_or_init(|| async {
                let (config, probe) = (self.config.clone(), entry.clone());
                tokio::task::spawn_blocking(move || runtime_sandbox(&config, &probe))
                    .await
                    .unwrap_or_else(|e| {
                        RuntimeSandbox::probe_failed(
                            entry,
                            format!("the sandbox probe failed: {e}"),
                        )
                    })
            })
            .await;
        Some(built.clone())
    }

    /// What a session in `namespace_id` under `authority` would get:
    /// every agent it may name (or only `agent`), its runtime's sandbox,
    /// and the catalogue's tools with whether a live grant of that scope
    /// covers each tool's namespace and action.
    pub async fn answer(
        &self,
        store: &dyn Store,
        namespace_id: &Identifier,
        authority: &Address,
        agent: Option<&str>,
    ) -> Result<Value, PreflightError> {
        let agents: Vec<_> = self
            .config
            .agents
            .iter()
            .filter(|a| agent.is_none_or(|name| a.agent_id.as_str() == name))
            .collect();
        if let (Some(name), true) = (agent, agents.is_empty()) {
            let known: Vec<&str> = self
                .config
                .agents
                .iter()
                .map(|a| a.agent_id.as_str())
                .collect();
            return Err(PreflightError::UnknownAgent {
                // A hostile name is shown cut short, never echoed whole.
                name: name.chars().take(64).collect(),
                known: known.join(", "),
            });
        }
        let now = Timestamp::now();
        let mut out = Vec::new();
        for a in agents {
            let subject = Address::Agent {
                agent_id: a.agent_id.clone(),
            };
            let grants = store.grants_for(namespace_id.as_str(), &subject).await?;
            let live: Vec<&Grant> = grants
                .iter()
                .filter(|g| &g.issuer == authority && live_at(g, &now))
                .collect();
            out.push(json!({
                "agentId": a.agent_id,
                "sandbox": self.sandbox(a.runtime.as_str()).await,
                "tools": self.tools(&live),
            }));
        }
        Ok(json!({"namespaceId": namespace_id, "agents": out}))
    }

    fn tools(&self, grants: &[&Grant]) -> Vec<Value> {
        let mut tools: Vec<Value> = self
            .catalogue
            .iter()
            .map(|t| {
                let need = &t.required_capability;
                let granted = grants.iter().any(|g| {
                    g.capabilities.iter().any(|c| {
                        c.namespace == need.resource.namespace
                            && c.allows_action(need.action.as_str())
                    })
                });
                json!({"name": t.name, "description": t.description, "namespace": t.namespace,
                       "action": need.action, "granted": granted})
            })
            .collect();
        tools.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        tools
    }
}

/// Not revoked and inside its time window at `now`.
fn live_at(g: &Grant, now: &Timestamp) -> bool {
    let now = now.to_offset();
    !g.revoked
        && g.not_before.as_ref().is_none_or(|t| now >= t.to_offset())
        && g.expires_at.as_ref().is_none_or(|t| now <= t.to_offset())
}
