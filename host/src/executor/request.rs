//! The request's own checks before any kernel call (B.1 steps 1–5) and
//! the sanitized request the runtime gets (A.2).

use std::collections::HashSet;

use serde_json::Value;
use sharedos_protocol::{
    AccessContext, Address, ExecutionRequest, ReachResult, RuntimeTurnRequest,
    RuntimeVisibleContext, ToolDefinition, canonical_json,
};

/// `actor_mismatch`, `receiver_mismatch`, `message_context_mismatch`, in
/// that order; addresses compared in canonical JSON.
pub(super) fn context_mismatch(request: &ExecutionRequest) -> Option<&'static str> {
    fn canon(a: &Address) -> String {
        canonical_json(&serde_json::to_value(a).unwrap_or(Value::Null))
    }
    let agent = canon(&request.agent);
    if canon(&request.context.actor) != agent {
        return Some("actor_mismatch");
    }
    if canon(&request.message.receiver) != agent {
        return Some("receiver_mismatch");
    }
    if request.message.trace_id != request.context.trace_id
        || request.message.purpose != request.context.purpose
    {
        return Some("message_context_mismatch");
    }
    None
}

/// The sanitized request of A.2: no authority, no enabled namespaces, no
/// grants; `tools` is the effective catalogue; reach narrowed to the
/// namespaces the effective tools operate on.
pub(super) fn sanitize(
    request: &ExecutionRequest,
    context: &AccessContext,
    reach: ReachResult,
    tools: Vec<ToolDefinition>,
) -> RuntimeTurnRequest {
    let namespaces: HashSet<&str> = tools
        .iter()
        .map(|t| t.required_capability.resource.namespace.as_str())
        .collect();
    let reach = match reach {
        ReachResult::Computed { reach } => ReachResult::Computed {
            reach: reach
                .into_iter()
                .filter(|e| namespaces.contains(e.namespace.as_str()))
                .collect(),
        },
        other => other,
    };
    RuntimeTurnRequest {
        version: request.version,
        execution_id: request.execution_id.clone(),
        agent: request.agent.clone(),
        context: RuntimeVisibleContext {
            actor: context.actor.clone(),
            owner: context.owner.clone(),
            namespace_id: context.namespace_id.clone(),
            purpose: context.purpose.clone(),
            trace_id: context.trace_id.clone(),
            now: context.now.clone(),
            reach,
        },
        message: request.message.clone(),
        tools,
        state: request.state.clone(),
        options: request.options,
        metadata: request.metadata.clone(),
    }
}

/// What the result says of a context mismatch.
pub(super) fn mismatch_message(code: &str) -> &'static str {
    match code {
        "actor_mismatch" => "The execution context actor does not match the agent.",
        "receiver_mismatch" => "The message receiver does not match the agent.",
        _ => "The message does not match the execution context.",
    }
}
