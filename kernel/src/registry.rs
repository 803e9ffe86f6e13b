//! The tool registry: trusted definitions, each with its handler and its
//! input schema compiled once at registration.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde_json::Value;
use sharedos_protocol::{
    AccessContext, CapabilityRequirement, JsonObject, ToolCall, ToolDefinition, ToolResult,
};
use tokio_util::sync::CancellationToken;

use crate::grant::Requirement;
use crate::port::KernelError;

/// Why a handler did not answer with a result.
#[derive(Debug)]
pub enum ToolError {
    /// The handler stopped because `abort` fired (recorded `interrupted`).
    Aborted,
    /// The handler broke. The text goes to the error hook, never to the
    /// caller.
    Failed(String),
    /// A decision the handler asked the kernel for (re-entrant) could not
    /// be recorded.
    Kernel(KernelError),
}

/// What a handler answered: a typed result, or raw JSON (from a brokered
/// tool) that the kernel parses as a `ToolResult`.
#[derive(Debug, Clone)]
pub enum HandlerAnswer {
    Result(ToolResult),
    Raw(Value),
}

impl From<ToolResult> for HandlerAnswer {
    fn from(r: ToolResult) -> Self {
        HandlerAnswer::Result(r)
    }
}

/// A trusted tool implementation.
#[async_trait]
pub trait ToolHandler: Send + Sync {
    /// Refines arguments after the schema check (e.g. path segments). The
    /// returned object is what runs. An `Err` names the field (a JSON
    /// pointer) and what is wrong with it, never the value.
    fn parse_arguments(&self, arguments: &JsonObject) -> Result<JsonObject, String> {
        Ok(arguments.clone())
    }

    /// The exact requirement of this call (a path, a record id). `None`
    /// means the definition's declared requirement.
    fn resolve_requirement(
        &self,
        _context: &AccessContext,
        _call: &ToolCall,
    ) -> Result<Option<CapabilityRequirement>, String> {
        Ok(None)
    }

    /// Runs the call. `abort` is the turn's hard signal.
    async fn invoke(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError>;
}

/// A definition with its handler and its compiled argument (and output)
/// validators.
pub struct RegisteredTool {
    pub definition: ToolDefinition,
    pub handler: Arc<dyn ToolHandler>,
    validator: jsonschema::Validator,
    output_validator: Option<jsonschema::Validator>,
    /// The declared requirement as first made for a call (its owner that
    /// call's when the definition names none), kept so later calls with
    /// the same owner borrow it instead of copying its strings again.
    declared: OnceLock<Requirement>,
}

impl std::fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredTool")
            .field("name", &self.definition.name)
            .finish_non_exhaustive()
    }
}

impl RegisteredTool {
    /// The cell of the declared requirement made once (see `declared`).
    pub(crate) fn declared_requirement(&self) -> &OnceLock<Requirement> {
        &self.declared
    }

    /// Whether a succeeded output fits the definition's `outputSchema`
    /// (always, when it declares none).
    pub fn output_fits(&self, output: &Value) -> bool {
        self.output_validator
            .as_ref()
            .is_none_or(|v| v.is_valid(output))
    }

    /// Checks `arguments` against the input schema. The message names the
    /// failing location as a JSON pointer and the violated keyword, never
    /// the value.
    pub fn check_arguments(&self, arguments: &JsonObject) -> Result<(), String> {
        let instance = Value::Object(arguments.clone());
        match self.validator.validate(&instance) {
            Ok(()) => Ok(()),
            Err(e) => {
                let at = e.instance_path().as_str().to_owned();
                let at = if at.is_empty() { "/".to_owned() } else { at };
                Err(match e.kind() {
                    jsonschema::error::ValidationErrorKind::Required { property } => {
                        let name = property.as_str().unwrap_or("?");
                        format!("{}: required property is missing", join_pointer(&at, name))
                    }
                    kind => format!("{at}: does not satisfy '{}'", kind.keyword()),
                })
            }
        }
    }
}

fn join_pointer(base: &str, name: &str) -> String {
    let escaped = name.replace('~', "~0").replace('/', "~1");
    if base == "/" {
        format!("/{escaped}")
    } else {
        format!("{base}/{escaped}")
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    #[error("tool {0}: already registered")]
    Duplicate(String),
    #[error("{0}")]
    InvalidDefinition(String),
    #[error("tool {name}: inputSchema does not compile: {message}")]
    InvalidSchema { name: String, message: String },
}

/// Registered tools in registration order. Immutable once built; the
/// kernel swaps whole registries and each turn holds the one it started
/// with.
#[derive(Debug, Default)]
pub struct ToolRegistry {
    tools: Vec<Arc<RegisteredTool>>,
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool. Refuses a duplicate name, a read tool marked
    /// destructive, a write tool marked readOnly, a requirement outside its
    /// own namespace's shape, and a schema that does not compile.
    pub fn register(
        &mut self,
        definition: ToolDefinition,
        handler: Arc<dyn ToolHandler>,
    ) -> Result<(), RegistrationError> {
        definition
            .check()
            .map_err(|e| RegistrationError::InvalidDefinition(e.to_string()))?;
        if self.get(definition.name.as_str()).is_some() {
            return Err(RegistrationError::Duplicate(definition.name.to_string()));
        }
        let schema = Value::Object(definition.input_schema.clone());
        let validator =
            jsonschema::validator_for(&schema).map_err(|e| RegistrationError::InvalidSchema {
                name: definition.name.to_string(),
                message: e.to_string(),
            })?;
        let output_validator = match &definition.output_schema {
            None => None,
            Some(o) => Some(
                jsonschema::validator_for(&Value::Object(o.clone())).map_err(|e| {
                    RegistrationError::InvalidSchema {
                        name: definition.name.to_string(),
                        message: format!("outputSchema: {e}"),
                    }
                })?,
            ),
        };
        self.tools.push(Arc::new(RegisteredTool {
            definition,
            handler,
            validator,
            output_validator,
            declared: OnceLock::new(),
        }));
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Arc<RegisteredTool>> {
        self.tools
            .iter()
            .find(|t| t.definition.name.as_str() == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<RegisteredTool>> {
        self.tools.iter()
    }

    pub fn names(&self) -> HashSet<String> {
        self.tools
            .iter()
            .map(|t| t.definition.name.to_string())
            .collect()
    }

    /// A copy sharing every registered tool (for copy-on-write updates).
    pub fn snapshot(&self) -> Self {
        Self {
            tools: self.tools.clone(),
        }
    }
}
