//! The egress gateway: the only way a runtime reaches a network, owned by
//! the host. See docs/EGRESS.md.

#![forbid(unsafe_code)]

mod binding;
mod body;
mod exposure;
pub mod gateway;
#[cfg(any(test, feature = "mock"))]
pub mod mock;
pub mod policy;
mod pool;
mod proxy;
mod redact;
mod route;
pub mod seat;
pub mod secret;
mod timer;
mod tunnel;
pub mod upstream;
pub mod usage;

pub use binding::{EGRESS_BUDGET_EXCEEDED, MODEL_ACCESS_REFUSED, MODEL_UNAVAILABLE};
pub use gateway::{EgressEvent, Gateway, GatewayLimits, Listener, ServeHandle, TurnBinding};
pub use policy::{
    AddressClass, ApiShape, Destination, EgressBudget, ModelRoute, NetworkPolicy, NetworkRoutes,
};
pub use seat::{BoundTurn, EGRESS_NAMESPACE, EGRESS_PORT, EgressSeat, ServeError, egress_url};
pub use secret::{Secret, SecretRef};
