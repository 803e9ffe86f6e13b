//! The host's end of a plugin connection, next to the process runtime
//! that owns the pipes: the `initialize` handshake ([`handshake`]) and the
//! driver of one turn ([`turn`]), both on the one JSON-RPC peer
//! ([`sharedos_peer`]) the plugin SDK runs too. No file descriptor here:
//! the process code hands the peer the child's pipes.

mod calls;
pub mod handshake;
pub mod turn;

pub use handshake::{
    HandshakeError, check_manifest, handshake, handshake_offering, host_peer_config,
};
pub use sharedos_peer::{
    HostInbound as Inbound, HostInbox as Inbox, Peer, PeerConfig, Replier, Violation,
    ViolationReason,
};
pub use turn::{EXIT_DRAIN_GRACE, drive_turn, host_call_error, turn_run_params};

#[cfg(test)]
mod tests;
