//! `sharedos.escalate`: the affordance whose presence in a turn's catalogue
//! offers escalation. Escalating is a turn outcome (`escalate{reason}`),
//! so a direct call is answered `failed escalation_not_terminated`.

use async_trait::async_trait;
use serde_json::json;
use sharedos_protocol::{
    AccessContext, ReadWrite, ToolAnnotations, ToolCall, ToolDefinition, ToolResult,
};
use tokio_util::sync::CancellationToken;

use super::{Def, ESCALATION_NAMESPACE};
use crate::registry::{HandlerAnswer, ToolError, ToolHandler};

use sharedos_protocol::ESCALATE_TOOL;

pub fn definition() -> ToolDefinition {
    Def {
        name: ESCALATE_TOOL,
        description: "Ask a human reviewer for authority this turn does not have. End the turn with an \
                      escalate outcome carrying the reason; calling this tool directly does nothing.",
        namespace: "sharedos",
        read_write: ReadWrite::Read,
        schema: json!({
            "type": "object",
            "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 512}},
            "required": ["reason"],
            "additionalProperties": false
        }),
        cap_namespace: ESCALATION_NAMESPACE,
        action: "request",
        annotations: ToolAnnotations { read_only: Some(true), destructive: Some(false), idempotent: Some(true) },
    }
    .build()
}

/// The handler: always `failed escalation_not_terminated`.
#[derive(Debug, Default)]
pub struct EscalateHandler;

#[async_trait]
impl ToolHandler for EscalateHandler {
    async fn invoke(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        _abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        Ok(ToolResult::failed(
            call,
            "escalation_not_terminated",
            "Escalation ends the turn: return an escalate outcome with the reason instead of calling this tool.",
            context.now.clone(),
        )
        .into())
    }
}
