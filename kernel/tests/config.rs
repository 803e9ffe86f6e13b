//! The host's configuration: TOML shape, validation that names the entry,
//! and registration refusals.

mod common;

use std::sync::Arc;

use common::*;
use sharedos_kernel::{
    Kernel, KernelConfig, KernelSetupError, MemoryAuditSink, RegistrationError, ToolRegistry,
    TurnKernel,
};
use sharedos_protocol::ReadWrite;

const EXAMPLE: &str = r#"
auditWriteTimeoutMs = 2000
namespaces = ["crm"]

[files]
enabled = true
maxReadBytes = 65536

[escalation]
enabled = true

[[grants]]
id = "alice-admission"
subject = { kind = "agent", agentId = "alice" }
issuer = { kind = "service", serviceId = "host" }
namespaceId = "tenant-1"
maxUses = 100
expiresAt = "2027-01-01T00:00:00Z"
capabilities = [
  { namespace = "sharedos.execution", path = ["agent", "alice"], scope = "exact", actions = ["invoke"] },
]

[[grants]]
id = "alice-memory"
subject = { kind = "agent", agentId = "alice" }
issuer = { kind = "service", serviceId = "host" }
namespaceId = "tenant-1"
constraints = { purposes = ["testing"] }

[[grants.capabilities]]
namespace = "files"
path = ["alice"]
scope = "descendants"
actions = ["read", "write", "list", "delete"]

[[grants.capabilities]]
namespace = "crm"
path = ["accounts"]
owner = { kind = "human", userId = "olivia" }
scope = "descendants"
actions = ["*"]
"#;

#[tokio::test]
async fn the_documented_toml_builds_a_kernel_that_admits_alice() {
    let config: KernelConfig = toml::from_str(EXAMPLE).unwrap();
    config.validate().unwrap();
    assert_eq!(config.grants.len(), 2);
    assert_eq!(config.files.max_read_bytes, 65536);
    let root = tempfile::tempdir().unwrap();
    let kernel =
        Kernel::from_config(&config, root.path(), Arc::new(MemoryAuditSink::new())).unwrap();
    let ctx = context("alice");
    let turn = kernel.open_turn(&ctx).await.unwrap();
    assert!(turn.admit(&ctx, &agent("alice")).await.unwrap().allowed);
    assert_eq!(turn.list_tools(&ctx).await.unwrap().len(), 4);
}

fn refused(toml_text: &str) -> String {
    match toml::from_str::<KernelConfig>(toml_text) {
        Err(e) => e.to_string(),
        Ok(c) => c
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default(),
    }
}

#[test]
fn validation_names_the_entry_that_makes_no_sense() {
    let base = |cap: &str, extra: &str| {
        format!(
            "[[grants]]\nid = \"g-7\"\nsubject = {{ kind = \"agent\", agentId = \"a\" }}\nissuer = {{ kind = \"service\", serviceId = \"h\" }}\nnamespaceId = \"t\"\n{extra}\ncapabilities = [{cap}]\n"
        )
    };
    let unknown = refused(&base(
        r#"{ namespace = "vault", path = [], scope = "exact", actions = ["read"] }"#,
        "",
    ));
    assert!(
        unknown.contains("g-7")
            && unknown.contains("unknown namespace")
            && unknown.contains("vault"),
        "{unknown}"
    );
    let dotdot = refused(&base(
        r#"{ namespace = "files", path = [".."], scope = "exact", actions = ["read"] }"#,
        "",
    ));
    assert!(
        dotdot.contains("'.'") || dotdot.contains("segment"),
        "{dotdot}"
    );
    let empty_actions = refused(&base(
        r#"{ namespace = "files", path = [], scope = "exact", actions = [] }"#,
        "",
    ));
    assert!(
        empty_actions.contains("g-7") && empty_actions.contains("actions"),
        "{empty_actions}"
    );
    let zero = refused(&base(
        r#"{ namespace = "files", path = [], scope = "exact", actions = ["read"] }"#,
        "maxUses = 0",
    ));
    assert!(zero.contains("maxUses"), "{zero}");
    let window = refused(&base(
        r#"{ namespace = "files", path = [], scope = "exact", actions = ["read"] }"#,
        "notBefore = \"2027-01-01T00:00:00Z\"\nexpiresAt = \"2026-01-01T00:00:00Z\"",
    ));
    assert!(window.contains("notBefore"), "{window}");
    let unknown_key = refused(&base(
        r#"{ namespace = "files", path = [], scope = "exact", actions = ["read"] }"#,
        "sudo = true",
    ));
    assert!(unknown_key.contains("sudo"), "{unknown_key}");
    let dup = format!(
        "{}{}",
        base(
            r#"{ namespace = "files", path = [], scope = "exact", actions = ["read"] }"#,
            ""
        ),
        base(
            r#"{ namespace = "files", path = [], scope = "exact", actions = ["read"] }"#,
            ""
        )
    );
    assert!(refused(&dup).contains("earlier grant"));
}

#[test]
fn from_config_refuses_an_invalid_config() {
    let mut config = KernelConfig::default();
    config.grants.push(grant("bad", "alice", vec![]));
    let root = tempfile::tempdir().unwrap();
    let err =
        Kernel::from_config(&config, root.path(), Arc::new(MemoryAuditSink::new())).unwrap_err();
    assert!(matches!(err, KernelSetupError::Config(_)));
    assert!(err.to_string().contains("bad"));
}

#[test]
fn registration_refuses_duplicates_contradictions_and_bad_schemas() {
    let mut reg = ToolRegistry::new();
    let tool = ScriptedTool::new(Script::Echo);
    reg.register(scripted_definition("t.one", ReadWrite::Read), tool.clone())
        .unwrap();
    assert_eq!(
        reg.register(scripted_definition("t.one", ReadWrite::Read), tool.clone()),
        Err(RegistrationError::Duplicate("t.one".into()))
    );
    let mut destructive_read = scripted_definition("t.two", ReadWrite::Read);
    destructive_read.annotations = Some(sharedos_protocol::ToolAnnotations {
        destructive: Some(true),
        ..Default::default()
    });
    assert!(
        matches!(reg.register(destructive_read, tool.clone()), Err(RegistrationError::InvalidDefinition(m)) if m.contains("t.two"))
    );
    let mut readonly_write = scripted_definition("t.three", ReadWrite::Write);
    readonly_write.annotations = Some(sharedos_protocol::ToolAnnotations {
        read_only: Some(true),
        ..Default::default()
    });
    assert!(matches!(
        reg.register(readonly_write, tool.clone()),
        Err(RegistrationError::InvalidDefinition(_))
    ));
    let mut bad_schema = scripted_definition("t.four", ReadWrite::Read);
    bad_schema
        .input_schema
        .insert("type".into(), serde_json::json!(42));
    assert!(matches!(
        reg.register(bad_schema, tool),
        Err(RegistrationError::InvalidSchema { .. })
    ));
}

#[test]
fn a_host_can_flatten_the_kernel_config_into_its_own() {
    #[derive(serde::Deserialize)]
    struct HostConfig {
        runtime: String,
        #[serde(flatten)]
        kernel: KernelConfig,
    }
    let text = format!("runtime = \"standard\"\n{EXAMPLE}");
    let host: HostConfig = toml::from_str(&text).unwrap();
    assert_eq!(host.runtime, "standard");
    assert_eq!(host.kernel.grants.len(), 2);
    host.kernel.validate().unwrap();
}
