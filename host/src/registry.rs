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

// Its tests (a duplicate id, an unknown id, `list()` returning clones) are
// host/tests/registry.rs, with the shared test plugin in the seats.
