//! The egress gateway: the only way a runtime reaches a network, owned by
//! the host. See docs/EGRESS.md.

pub mod gateway;
pub mod policy;
mod proxy;
pub mod secret;
mod tunnel;
pub mod upstream;
pub mod usage;

pub use gateway::{EgressEvent, Gateway, GatewayLimits, ServeHandle, TurnBinding};
pub use policy::{
    AddressClass, ApiShape, Destination, EgressBudget, ModelRoute, NetworkPolicy, NetworkRoutes,
};
pub use secret::{Secret, SecretRef};
