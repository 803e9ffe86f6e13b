//! The built-in tools a newcomer gets: files-as-memory and the escalation
//! affordance.

pub mod escalate;
pub mod files;
pub mod leftovers;

use serde_json::Value;
use sharedos_protocol::{
    CapabilityRequirement, Description, Identifier, JsonObject, ReadWrite, ResourceRef, ShortName,
    ToolAnnotations, ToolDefinition, ident,
};

/// The resource namespace of turn admission (`sharedos.execution` /
/// `["agent", id]` / `invoke`).
pub const EXECUTION_NAMESPACE: &str = "sharedos.execution";
/// The resource namespace of the file tools (`files` / `[agentId, ...]`).
pub const FILES_NAMESPACE: &str = "files";
/// The resource namespace a grant names to offer `sharedos.escalate`.
pub const ESCALATION_NAMESPACE: &str = "sharedos.escalation";
/// The `source` of every built-in definition.
pub const BUILTIN_SOURCE: &str = "sharedos.builtin";

/// Builds a definition from literals written in this crate.
pub(crate) struct Def<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub namespace: &'a str,
    pub read_write: ReadWrite,
    pub schema: Value,
    pub cap_namespace: &'a str,
    pub action: &'a str,
    pub annotations: ToolAnnotations,
}

impl Def<'_> {
    pub fn build(self) -> ToolDefinition {
        let input_schema: JsonObject = match self.schema {
            Value::Object(o) => o,
            _ => JsonObject::new(),
        };
        ToolDefinition {
            name: ident(self.name),
            description: Description::new(self.description).unwrap_or_else(|_| desc_fallback()),
            namespace: ident(self.namespace),
            source: ident(BUILTIN_SOURCE),
            read_write: self.read_write,
            input_schema,
            output_schema: None,
            required_capability: CapabilityRequirement {
                resource: ResourceRef {
                    namespace: ident(self.cap_namespace),
                    path: vec![],
                    owner: None,
                },
                action: ShortName::new(self.action).unwrap_or_else(|_| short_fallback()),
            },
            annotations: Some(self.annotations),
            metadata: None,
        }
    }
}

fn desc_fallback() -> Description {
    Description::new("A built-in tool.")
        .unwrap_or_else(|_| unreachable!("literal description is valid"))
}

fn short_fallback() -> ShortName {
    ShortName::new("invoke").unwrap_or_else(|_| unreachable!("literal action is valid"))
}

/// The identifier of an agent address, if it is one.
pub(crate) fn agent_id(address: &sharedos_protocol::Address) -> Option<&Identifier> {
    match address {
        sharedos_protocol::Address::Agent { agent_id } => Some(agent_id),
        _ => None,
    }
}
