//! The records the store tests write: a session, a run, a journal event,
//! an access context, shared by backends.rs and lease.rs.

#![allow(dead_code)] // each test file uses its part

use serde_json::json;
use sharedos_protocol::{
    AccessContext, Address, ExecutionEvent, Identifier, Purpose, ShortName, Timestamp, Version,
};
use sharedos_store::{NewRun, SessionRecord};

pub fn session(id: &str) -> SessionRecord {
    SessionRecord {
        id: id.into(),
        agent_id: "alice".into(),
        runtime_id: "sharedos.standard".into(),
        scope: json!({"namespaceId": "tenant-1"}),
        binding: json!({}),
        open: true,
        created_at: "2026-12-01T00:00:00Z".into(),
        closed_at: None,
    }
}

/// Run `id` of session `s1`, asked for as `request` with payload `digest`,
/// admitted by `host`.
pub fn new_run(id: &str, request: &str, digest: &str, host: &str) -> NewRun {
    NewRun {
        id: id.into(),
        session_id: "s1".into(),
        request_id: request.into(),
        payload_digest: digest.into(),
        input: json!({"text": "hello"}),
        host_id: host.into(),
        admitted_at: "2026-12-01T00:00:01Z".into(),
    }
}

pub fn event(run: &str, sequence: u64) -> ExecutionEvent {
    ExecutionEvent {
        version: Version::V1,
        event_id: Identifier::new(format!("{run}-e{sequence}")).unwrap(),
        execution_id: Identifier::new(run).unwrap(),
        trace_id: Identifier::new(run).unwrap(),
        sequence,
        kind: ShortName::new("runtime.note").unwrap(),
        data: json!({"n": sequence}).into(),
        occurred_at: Timestamp::parse("2026-12-01T00:00:02Z").unwrap(),
    }
}

pub fn context(trace: &str) -> AccessContext {
    AccessContext {
        namespace_id: Identifier::new("tenant-1").unwrap(),
        actor: serde_json::from_value(json!({"kind": "agent", "agentId": "alice"})).unwrap(),
        authority: serde_json::from_value(json!({"kind": "service", "serviceId": "host"})).unwrap(),
        owner: serde_json::from_value::<Address>(json!({"kind": "human", "userId": "u"})).unwrap(),
        purpose: Purpose::new("test").unwrap(),
        trace_id: Identifier::new(trace).unwrap(),
        enabled_tool_namespaces: vec![],
        now: Timestamp::parse("2026-12-01T00:00:02Z").unwrap(),
    }
}
