//! G17, the registry half: a duplicate id, an unknown id, and `list()`
//! returning clones.

use std::sync::Arc;

use serde_json::json;
use sharedos_host::executor::Seat;
use sharedos_host::registry::{RegistryError, RuntimeRegistry};
use sharedos_protocol::{RuntimeManifest, ident};
use sharedos_testplugin::{Script, ScriptPlugin};

fn manifest(id: &str, version: &str) -> RuntimeManifest {
    let mut m = RuntimeManifest::new(id, version).unwrap();
    m.metadata = json!({"package": "registry-tests"}).as_object().cloned();
    m
}

/// A seat of the shared test plugin under the manifest `id`/`version`.
fn seat(id: &str, version: &str) -> Seat {
    let (plugin, _) = ScriptPlugin::fixed(Script::default());
    Seat::in_process(Arc::new(plugin.with_manifest(manifest(id, version))))
}

#[test]
fn g17_a_duplicate_id_is_refused_and_the_first_seat_stays() {
    let mut r = RuntimeRegistry::new();
    r.register(seat("acme.loop", "1.0.0")).unwrap();
    let err = r.register(seat("acme.loop", "2.0.0")).unwrap_err();
    assert_eq!(err, RegistryError::Duplicate("acme.loop".into()));
    assert!(err.to_string().contains("already registered"), "{err}");
    assert_eq!(
        r.resolve("acme.loop").unwrap().manifest.version.as_str(),
        "1.0.0"
    );
    assert_eq!(r.list().len(), 1);
}

#[test]
fn g17_an_unknown_id_is_runtime_not_found() {
    let mut r = RuntimeRegistry::new();
    r.register(seat("acme.loop", "1.0.0")).unwrap();
    r.register(seat("sharedos.standard", "0.1.0")).unwrap();
    let err = r.resolve("acme.other").err().expect("not found");
    match &err {
        RegistryError::NotFound(id, registered) => {
            assert_eq!(id, "acme.other");
            assert!(registered.contains("acme.loop") && registered.contains("sharedos.standard"));
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(err.to_string().contains("RuntimeNotFoundError"), "{err}");
    // An empty registry says so the same way.
    assert!(matches!(
        RuntimeRegistry::new().resolve("acme.loop"),
        Err(RegistryError::NotFound(..))
    ));
    // Ids are exact: no trimming or case folding at resolve.
    assert!(r.resolve("ACME.LOOP").is_err());
}

#[test]
fn g17_list_returns_clones() {
    let mut r = RuntimeRegistry::new();
    r.register(seat("acme.loop", "1.0.0")).unwrap();
    r.register(seat("acme.zeta", "3.0.0")).unwrap();
    let mut listed = r.list();
    let ids: Vec<&str> = listed.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, vec!["acme.loop", "acme.zeta"]);
    listed[0].version = ident("9.9.9");
    listed[0]
        .metadata
        .as_mut()
        .unwrap()
        .insert("forged".into(), json!(true));
    listed.clear();
    let again = r.list();
    assert_eq!(again.len(), 2);
    assert_eq!(again[0].version.as_str(), "1.0.0");
    assert!(!again[0].metadata.as_ref().unwrap().contains_key("forged"));
    assert_eq!(r.resolve("acme.loop").unwrap().manifest, again[0]);
    // A resolved seat's manifest is the snapshot taken at registration.
    assert_eq!(
        r.resolve("acme.zeta").unwrap().manifest,
        manifest("acme.zeta", "3.0.0")
    );
}
