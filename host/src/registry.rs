//! The runtime registry: built by the trusted host from configuration
//! only. A request has no field that selects a runtime; the host binds each
//! agent to a runtime in its own configuration.

use std::collections::BTreeMap;

use sharedos_protocol::RuntimeManifest;

use crate::executor::Seat;

/// A registry error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("runtime {0:?} is already registered")]
    Duplicate(String),
    #[error("runtime {0:?} is not registered (RuntimeNotFoundError); registered: {1}")]
    NotFound(String, String),
}

/// Seats keyed by their manifest id.
#[derive(Default, Clone)]
pub struct RuntimeRegistry {
    seats: BTreeMap<String, Seat>,
}

impl RuntimeRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a seat under its manifest id; a duplicate id is refused.
    pub fn register(&mut self, seat: Seat) -> Result<(), RegistryError> {
        let id = seat.manifest.id.to_string();
        if self.seats.contains_key(&id) {
            return Err(RegistryError::Duplicate(id));
        }
        self.seats.insert(id, seat);
        Ok(())
    }

    pub fn resolve(&self, id: &str) -> Result<&Seat, RegistryError> {
        self.seats.get(id).ok_or_else(|| {
            RegistryError::NotFound(
                id.to_owned(),
                self.seats.keys().cloned().collect::<Vec<_>>().join(", "),
            )
        })
    }

    /// Clones of the registered manifests; changing them changes nothing.
    pub fn list(&self) -> Vec<RuntimeManifest> {
        self.seats.values().map(|s| s.manifest.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;
    use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, RuntimePlugin, Signal};
    use sharedos_protocol::{RuntimeTurnOutcome, RuntimeTurnRequest};

    use super::*;

    struct Named(&'static str);

    #[async_trait]
    impl RuntimePlugin for Named {
        fn manifest(&self) -> RuntimeManifest {
            RuntimeManifest::new(self.0, "1.0.0").unwrap()
        }
        async fn run(
            &self,
            _: RuntimeTurnRequest,
            _: Arc<dyn RuntimeHost>,
            _: Signal,
        ) -> Result<RuntimeTurnOutcome, RuntimeError> {
            Ok(RuntimeTurnOutcome::complete(serde_json::Value::Null))
        }
    }

    #[test]
    fn g17_duplicate_unknown_and_list_clones() {
        let mut r = RuntimeRegistry::new();
        r.register(Seat::in_process(Arc::new(Named("a")))).unwrap();
        let err = r
            .register(Seat::in_process(Arc::new(Named("a"))))
            .unwrap_err();
        assert!(err.to_string().contains("already registered"));
        let err = r.resolve("b").err().unwrap();
        assert!(matches!(err, RegistryError::NotFound(..)));
        let mut listed = r.list();
        listed[0].version = sharedos_protocol::ident("9.9.9");
        assert_eq!(r.resolve("a").unwrap().manifest.version.as_str(), "1.0.0");
    }
}
