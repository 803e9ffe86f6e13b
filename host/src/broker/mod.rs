//! The wire path's protocol logic: a bidirectional JSON-RPC peer over any
//! `AsyncRead + AsyncWrite` pair ([`peer`]) and the host side of the
//! handshake and of one turn ([`turn`]). Nothing here touches a file
//! descriptor; `process` hands in the child's pipes.

pub mod peer;
mod read;
pub mod turn;

pub use peer::{Inbound, Inbox, Peer, PeerConfig, Replier, Violation, ViolationReason};
pub use turn::{HandshakeError, drive_turn, handshake, host_peer_config};

#[cfg(test)]
mod tests;
