//! The turn a run becomes: the session's binding and scope, the run's
//! input, and the run id as execution id and trace id (which is how
//! recovery finds a run's audit records).

use serde_json::Value;
use sha2::{Digest, Sha256};
use sharedos_protocol::{
    AccessContext, Address, ExecutionRequest, Identifier, MessageEnvelope, Purpose, Timestamp,
    Version, canonical_json,
};
use sharedos_store::{SessionRecord, StoreError};

use super::{OpenSession, RunInput, Scope, SessionError};

/// Refuses a binding no turn could ever be built from.
pub(super) fn check_binding(scope: &Scope, spec: &OpenSession) -> Result<(), SessionError> {
    Purpose::new(&spec.purpose).map_err(|e| SessionError::InvalidInput(format!("purpose: {e}")))?;
    let probe = RunInput {
        payload: Value::Null,
        options: None,
    };
    let record = SessionRecord {
        id: "probe".into(),
        agent_id: spec.agent_id.to_string(),
        runtime_id: String::new(),
        scope: Value::Null,
        binding: serde_json::to_value(spec)
            .map_err(|e| SessionError::InvalidInput(e.to_string()))?,
        open: true,
        created_at: String::new(),
        closed_at: None,
    };
    build(&record, scope, "probe", &probe, Timestamp::now()).map(|_| ())
}

/// The request of one run.
pub(super) fn build(
    session: &SessionRecord,
    scope: &Scope,
    run_id: &str,
    input: &RunInput,
    now: Timestamp,
) -> Result<ExecutionRequest, SessionError> {
    let binding: OpenSession = serde_json::from_value(session.binding.clone())
        .map_err(|e| StoreError::Corrupt(format!("session {} binding: {e}", session.id)))?;
    let invalid =
        |what: &str, e: &dyn std::fmt::Display| SessionError::InvalidInput(format!("{what}: {e}"));
    let id = Identifier::new(run_id).map_err(|e| invalid("run id", &e))?;
    let purpose = Purpose::new(&binding.purpose).map_err(|e| invalid("purpose", &e))?;
    let agent = Address::Agent {
        agent_id: binding.agent_id.clone(),
    };
    let request = ExecutionRequest {
        version: Version::V1,
        execution_id: id.clone(),
        agent: agent.clone(),
        context: AccessContext {
            namespace_id: scope.namespace_id.clone(),
            actor: agent.clone(),
            authority: scope.authority.clone(),
            owner: scope.owner.clone(),
            purpose: purpose.clone(),
            trace_id: id.clone(),
            enabled_tool_namespaces: binding.enabled_tool_namespaces.clone(),
            now: now.clone(),
        },
        message: MessageEnvelope {
            version: Version::V1,
            id: id.clone(),
            sender: scope.owner.clone(),
            receiver: agent,
            purpose,
            payload: input.payload.clone(),
            trace_id: id,
            created_at: now,
            reply_to: None,
            provenance: None,
        },
        tools: binding.tools,
        state: None,
        options: input.options,
        metadata: None,
    };
    request.check().map_err(|e| invalid("request", &e))?;
    Ok(request)
}

/// What makes two inputs identical: the SHA-256 of their canonical JSON.
pub(super) fn digest(input: &Value) -> String {
    let hash = Sha256::digest(canonical_json(input).as_bytes());
    hash.iter().map(|b| format!("{b:02x}")).collect()
}
