//! Grants held in the store, against both backends: add, list, revoke,
//! the import of the configuration's grants, and the kernel's grant source
//! reading them (a change through one connection is what a turn on another
//! loads).

#[macro_use]
mod backend;

use std::sync::Arc;

use backend::Backend;
use serde_json::json;
use sharedos_kernel::{Grant, GrantSource};
use sharedos_protocol::{AccessContext, Identifier, Purpose, Timestamp};
use sharedos_store::{GrantOrigin, StoreError, StoreGrants};

both!(an_added_grant_is_loaded_by_another_connection_until_it_is_revoked);
both!(ids_are_never_reused_and_revoking_is_idempotent);
both!(the_configuration_import_adds_updates_keeps_revocations_and_retires);
both!(a_delegated_grant_is_loaded_with_its_ancestors);
both!(max_uses_of_a_store_held_grant_is_exact_across_connections);

const AT: &str = "2026-12-01T00:00:00Z";

fn grant(id: &str, agent: &str, max_uses: Option<u64>) -> Grant {
    serde_json::from_value(json!({
        "id": id,
        "subject": {"kind": "agent", "agentId": agent},
        "issuer": {"kind": "service", "serviceId": "host"},
        "namespaceId": "tenant-1",
        "capabilities": [{"namespace": "files", "path": [agent], "scope": "descendants", "actions": ["read"]}],
        "maxUses": max_uses,
    }))
    .unwrap()
}

fn context(agent: &str) -> AccessContext {
    AccessContext {
        namespace_id: Identifier::new("tenant-1").unwrap(),
        actor: serde_json::from_value(json!({"kind": "agent", "agentId": agent})).unwrap(),
        authority: serde_json::from_value(json!({"kind": "service", "serviceId": "host"})).unwrap(),
        owner: serde_json::from_value(json!({"kind": "human", "userId": "u"})).unwrap(),
        purpose: Purpose::new("test").unwrap(),
        trace_id: Identifier::new("t-1").unwrap(),
        enabled_tool_namespaces: vec![],
        now: Timestamp::parse("2026-12-01T00:00:02Z").unwrap(),
    }
}

fn ids(grants: &[Grant]) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = grants
        .iter()
        .map(|g| (g.id.as_str().to_owned(), g.revoked))
        .collect();
    out.sort();
    out
}

async fn an_added_grant_is_loaded_by_another_connection_until_it_is_revoked(backend: Backend) {
    let host_a = backend.open().await;
    let host_b = backend.open().await;
    let source_b = StoreGrants::new(Arc::clone(&host_b));
    assert!(source_b.load(&context("alice")).await.unwrap().is_empty());

    host_a
        .add_grant(&grant("g-read", "alice", None), GrantOrigin::Operator, AT)
        .await
        .unwrap();
    host_a
        .add_grant(&grant("g-bob", "bob", None), GrantOrigin::Operator, AT)
        .await
        .unwrap();
    let loaded = source_b.load(&context("alice")).await.unwrap();
    assert_eq!(ids(&loaded), [("g-read".to_owned(), false)], "only alice's");
    assert_eq!(
        loaded[0],
        grant("g-read", "alice", None),
        "read back as added"
    );

    assert!(
        host_a
            .revoke_grant("g-read", "2026-12-01T00:01:00Z")
            .await
            .unwrap()
    );
    let loaded = source_b.load(&context("alice")).await.unwrap();
    assert_eq!(
        ids(&loaded),
        [("g-read".to_owned(), true)],
        "the revocation is what the next turn on the other host loads"
    );
    let listed = host_b.grants().await.unwrap();
    assert_eq!(listed.len(), 2);
    let revoked = listed
        .iter()
        .find(|g| g.grant.id.as_str() == "g-read")
        .unwrap();
    assert_eq!(revoked.origin, GrantOrigin::Operator);
    assert_eq!(revoked.revoked_at.as_deref(), Some("2026-12-01T00:01:00Z"));
    assert!(revoked.grant.revoked);
}

async fn ids_are_never_reused_and_revoking_is_idempotent(backend: Backend) {
    let store = backend.open().await;
    let g = grant("g-1", "alice", Some(2));
    store
        .add_grant(&g, GrantOrigin::Operator, AT)
        .await
        .unwrap();
    let again = store.add_grant(&g, GrantOrigin::Operator, AT).await;
    assert!(
        matches!(again, Err(StoreError::GrantConflict(_))),
        "{again:?}"
    );
    assert!(store.revoke_grant("g-1", AT).await.unwrap());
    assert!(
        !store.revoke_grant("g-1", AT).await.unwrap(),
        "already revoked"
    );
    let reused = store.add_grant(&g, GrantOrigin::Operator, AT).await;
    let Err(StoreError::GrantConflict(message)) = reused else {
        panic!("a revoked id came back: {reused:?}");
    };
    assert!(message.contains("choose another id"), "{message}");
    let missing = store.revoke_grant("g-none", AT).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound { what: "grant", .. })),
        "{missing:?}"
    );
}

async fn the_configuration_import_adds_updates_keeps_revocations_and_retires(backend: Backend) {
    let store = backend.open().await;
    let first = vec![
        grant("c-keep", "alice", None),
        grant("c-change", "alice", Some(3)),
        grant("c-revoke", "alice", None),
        grant("c-drop", "alice", None),
    ];
    let report = store.import_config_grants(&first, AT).await.unwrap();
    assert_eq!(report.added, ["c-keep", "c-change", "c-revoke", "c-drop"]);
    store.revoke_grant("c-revoke", AT).await.unwrap();

    // The next start: one changed, one dropped, one new.
    let second = vec![
        grant("c-keep", "alice", None),
        grant("c-change", "alice", Some(5)),
        grant("c-revoke", "alice", None),
        grant("c-new", "alice", None),
    ];
    let report = backend
        .open()
        .await
        .import_config_grants(&second, AT)
        .await
        .unwrap();
    assert_eq!(report.added, ["c-new"]);
    assert_eq!(report.updated, ["c-change"]);
    assert_eq!(report.revoked, ["c-drop"], "no longer configured");
    assert_eq!(report.still_revoked, ["c-revoke"], "a revocation sticks");
    let loaded = StoreGrants::new(store.clone())
        .load(&context("alice"))
        .await
        .unwrap();
    assert_eq!(
        ids(&loaded),
        [
            ("c-change".to_owned(), false),
            ("c-drop".to_owned(), true),
            ("c-keep".to_owned(), false),
            ("c-new".to_owned(), false),
            ("c-revoke".to_owned(), true),
        ]
    );
    let changed = loaded.iter().find(|g| g.id.as_str() == "c-change").unwrap();
    assert_eq!(changed.max_uses, Some(5));

    // An operator's id named by the configuration: refused, nothing changed.
    store
        .add_grant(&grant("op-1", "alice", None), GrantOrigin::Operator, AT)
        .await
        .unwrap();
    let mut third = second.clone();
    third.push(grant("op-1", "alice", Some(1)));
    third.retain(|g| g.id.as_str() != "c-new");
    let clash = store.import_config_grants(&third, AT).await;
    let Err(StoreError::GrantConflict(message)) = clash else {
        panic!("{clash:?}");
    };
    assert!(
        message.contains("op-1") && message.contains("rename"),
        "{message}"
    );
    let c_new = store.grant("c-new").await.unwrap().unwrap();
    assert!(!c_new.grant.revoked, "the refused import changed nothing");
}

async fn a_delegated_grant_is_loaded_with_its_ancestors(backend: Backend) {
    let store = backend.open().await;
    let mut root = grant("root", "lead", None);
    root.capabilities[0].path = vec![];
    let mut middle = grant("middle", "team", None);
    middle.issuer = root.subject.clone();
    middle.parent_grant_id = Some(root.id.clone());
    let mut leaf = grant("leaf", "alice", None);
    leaf.issuer = middle.subject.clone();
    leaf.parent_grant_id = Some(middle.id.clone());
    for g in [&root, &middle, &leaf] {
        store.add_grant(g, GrantOrigin::Operator, AT).await.unwrap();
    }
    store.revoke_grant("root", AT).await.unwrap();
    let loaded = StoreGrants::new(store)
        .load(&context("alice"))
        .await
        .unwrap();
    assert_eq!(
        ids(&loaded),
        [
            ("leaf".to_owned(), false),
            ("middle".to_owned(), false),
            ("root".to_owned(), true),
        ],
        "the whole chain, the revoked root included, so the kernel can refuse it"
    );
}

async fn max_uses_of_a_store_held_grant_is_exact_across_connections(backend: Backend) {
    let a = backend.open().await;
    let b = backend.open().await;
    a.add_grant(
        &grant("g-twice", "alice", Some(2)),
        GrantOrigin::Operator,
        AT,
    )
    .await
    .unwrap();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let g = StoreGrants::new(s.clone())
                .load(&context("alice"))
                .await
                .unwrap();
            let max = g[0].max_uses.unwrap();
            s.try_consume(g[0].id.as_str(), max).await.unwrap()
        }));
    }
    let mut won = 0;
    for t in tasks {
        won += t.await.unwrap() as usize;
    }
    assert_eq!(won, 2, "exactly the stored maxUses");
}
