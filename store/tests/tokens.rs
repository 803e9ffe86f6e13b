//! Tenant tokens held in the store, against both backends: a token added
//! through one connection is found by its secret's hash through another
//! until it is revoked there; the listing never carries the hash; ids and
//! secrets are unique; revoking twice or an unknown id says so.

#[macro_use]
mod backend;

use backend::Backend;
use serde_json::json;
use sharedos_store::{StoreError, StoredToken};

both!(a_token_is_found_by_its_hash_on_another_connection_until_it_is_revoked);
both!(ids_and_secrets_are_unique_and_revoking_says_what_it_did);

const AT: &str = "2026-12-01T00:00:00Z";

fn token(id: &str, namespace: &str, hash: &str) -> StoredToken {
    StoredToken {
        id: id.to_owned(),
        namespace_id: namespace.to_owned(),
        authority: serde_json::from_value(json!({"kind": "service", "serviceId": "app"})).unwrap(),
        label: format!("label of {id}"),
        secret_sha256: hash.to_owned(),
        created_at: AT.to_owned(),
        revoked_at: None,
    }
}

async fn a_token_is_found_by_its_hash_on_another_connection_until_it_is_revoked(backend: Backend) {
    let cli = backend.open().await;
    let host = backend.open().await;
    assert_eq!(host.token_by_hash("aa11").await.unwrap(), None);
    cli.add_token(&token("tok-a", "tenant-a", "aa11"))
        .await
        .unwrap();
    cli.add_token(&token("tok-b", "tenant-b", "bb22"))
        .await
        .unwrap();

    let found = host.token_by_hash("aa11").await.unwrap().unwrap();
    assert_eq!(found, token("tok-a", "tenant-a", "aa11"));
    assert_eq!(
        host.token_by_hash("bb22")
            .await
            .unwrap()
            .unwrap()
            .namespace_id,
        "tenant-b"
    );

    assert!(
        cli.revoke_token("tok-a", "2026-12-01T00:00:05Z")
            .await
            .unwrap()
    );
    let revoked = host.token_by_hash("aa11").await.unwrap().unwrap();
    assert_eq!(revoked.revoked_at.as_deref(), Some("2026-12-01T00:00:05Z"));
    assert_eq!(
        host.token_by_hash("bb22")
            .await
            .unwrap()
            .unwrap()
            .revoked_at,
        None
    );

    let listed = host.tokens().await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["tok-a", "tok-b"]);
    let shown = serde_json::to_string(&listed).unwrap();
    assert!(
        !shown.contains("aa11") && !shown.contains("bb22"),
        "{shown}"
    );
    assert!(!shown.contains("secret"), "{shown}");
}

async fn ids_and_secrets_are_unique_and_revoking_says_what_it_did(backend: Backend) {
    let store = backend.open().await;
    store
        .add_token(&token("tok-a", "tenant-a", "aa11"))
        .await
        .unwrap();
    let same_id = store.add_token(&token("tok-a", "tenant-b", "cc33")).await;
    assert!(
        matches!(same_id, Err(StoreError::Unavailable(_))),
        "{same_id:?}"
    );
    let same_secret = store.add_token(&token("tok-c", "tenant-b", "aa11")).await;
    assert!(
        matches!(same_secret, Err(StoreError::Unavailable(_))),
        "{same_secret:?}"
    );
    assert_eq!(
        store.tokens().await.unwrap().len(),
        1,
        "nothing half-written"
    );

    assert!(store.revoke_token("tok-a", AT).await.unwrap());
    assert!(
        !store
            .revoke_token("tok-a", "2026-12-02T00:00:00Z")
            .await
            .unwrap()
    );
    let kept = store.token_by_hash("aa11").await.unwrap().unwrap();
    assert_eq!(
        kept.revoked_at.as_deref(),
        Some(AT),
        "the first revocation is kept"
    );
    let unknown = store.revoke_token("tok-zz", AT).await;
    assert!(
        matches!(&unknown, Err(StoreError::NotFound { what: "token", id }) if id == "tok-zz"),
        "{unknown:?}"
    );
}
