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

use super::{OpenSession, RunInput, Scope, SessionError, SessionTool};

/// The longest requestId accepted, in characters.
pub const MAX_REQUEST_ID_CHARS: usize = 256;

/// How much of a refused id an error message repeats.
const SHOWN_CHARS: usize = 64;

fn shown(id: &str) -> String {
    let mut s: String = id.chars().take(SHOWN_CHARS).collect();
    if s.len() < id.len() {
        s.push('…');
    }
    s
}

/// A requestId: 1 to 256 characters, none of them a control character
/// (a NUL cannot be stored as text by every store).
pub(super) fn check_request_id(id: &str) -> Result<(), SessionError> {
    let chars = id.chars().count();
    if chars == 0 || chars > MAX_REQUEST_ID_CHARS {
        return Err(SessionError::InvalidRequestId(format!(
            "must be 1 to {MAX_REQUEST_ID_CHARS} characters, got {chars}"
        )));
    }
    if id.chars().any(char::is_control) {
        return Err(SessionError::InvalidRequestId(format!(
            "{:?} contains a control character: use printable characters only",
            shown(id)
        )));
    }
    Ok(())
}

/// A session or run id as sharedos issues them: a hyphenated UUID. Anything
/// else (a path, a NUL, 10,000 characters) is refused before the store is
/// asked.
pub(super) fn check_issued_id(what: &'static str, id: &str) -> Result<(), SessionError> {
    let uuid_like = id.len() == 36
        && id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    if uuid_like {
        Ok(())
    } else {
        Err(SessionError::InvalidId {
            what,
            shown: shown(id),
        })
    }
}

impl Scope {
    /// Every id of the scope is printable: a control character in a
    /// namespace, authority or owner id is refused, whatever the store.
    pub fn check(&self) -> Result<(), SessionError> {
        let ids = [
            ("namespaceId", self.namespace_id.as_str().to_owned()),
            ("authority", self.authority.path()[1].clone()),
            ("owner", self.owner.path()[1].clone()),
        ];
        for (what, id) in ids {
            if id.chars().any(char::is_control) {
                return Err(SessionError::InvalidScope(format!(
                    "Sharedos-Scope: the {what} id {:?} contains a control character: use printable characters only",
                    shown(&id)
                )));
            }
        }
        Ok(())
    }
}

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
        tools: binding
            .tools
            .into_iter()
            .map(|tool| match tool {
                SessionTool::Defined(d) => Ok(*d),
                SessionTool::Named(name) => Err(StoreError::Corrupt(format!(
                    "session {} binding: tool {name} was never resolved",
                    session.id
                ))),
            })
            .collect::<Result<_, _>>()?,
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
