//! One JSON-RPC 2.0 peer over NDJSON pipes (protocol.md C.2), used by the
//! host at its end of a plugin connection and by the Rust plugin SDK at
//! the other. It never touches a file descriptor: the process code hands
//! it pipes, the tests hand it `tokio::io::duplex`.
//!
//! - [`Peer`] sends: requests whose answers come back in wire order
//!   ([`Peer::request`]), requests whose answers go straight to their
//!   caller ([`Peer::call`]), notifications. It owns the pending map.
//! - [`Inbox`] reads, pulled by its one consumer: it classifies every line
//!   and hands out what it accepts as one ordered sequence of [`Inbound`]
//!   items, so a consumer applies an emit written before a response
//!   before that response.
//! - One writer task drains a bounded queue with a write-stall timeout,
//!   writing everything queued in one flush.
//! - What each side takes is its half of the protocol's method table
//!   ([`sharedos_protocol::method::TABLE`]), as its type says: an
//!   [`Inbox`] of the host's side ([`HostInbox`]) hands out the requests
//!   and notifications of `method::to_host` as enums, the plugin's
//!   ([`PluginInbox`]) those of `method::to_plugin`;
//!   consumers parse params with [`params`] as the method's declared type
//!   and answer with [`Replier::answer`].
//!
//! Policy (protocol.md B.6, D) is configuration ([`PeerConfig`]): framing,
//! UTF-8 and envelope violations are fatal, with a typed [`Violation`]
//! holding an escaped, truncated sample. Unknown notification methods and
//! responses to ids not pending are dropped and counted against a budget.
//! Unknown request methods get `-32601`; requests over the in-flight cap
//! get `-32055` without being delivered; a request id reused while in
//! flight is fatal. The host runs it with budgets and the handshake rule,
//! the SDK with [`PeerConfig::plugin`].
//!
//! jsonrpsee: `jsonrpsee-types` is the wire envelope of everything this
//! peer writes (`Request`, `Notification`, `Response`, `ErrorObject`;
//! see [`error`]). Incoming lines are *not* parsed with its
//! `Request`/`Response` deserializers: those accept `"id":null`, ids of
//! any size and a response without `jsonrpc`, and a second, laxer parse
//! next to ours would let a hostile peer show the envelope check and the
//! dispatch different messages (the differential-parsing hazard of
//! protocol.md D #16). So one strict, borrowed parse
//! ([`sharedos_protocol::jsonrpc::classify`]) classifies each line, and
//! its `WireError` is the lenient reading of an error object received (a
//! malformed one becomes `internal` instead of failing the call), which
//! `ErrorObject`'s deserializer cannot be.

#![forbid(unsafe_code)]

mod budget;
mod config;
mod frame;
mod line;
mod peer;
mod read;
mod reply;
mod shared;
mod violation;
mod write;

pub use config::PeerConfig;
pub use frame::read_lines;
pub use jsonrpsee_types::{ErrorObject, ErrorObjectOwned};
pub use line::{
    error, error_with, request as request_line, request_written as request_line_written,
};
pub use peer::Peer;
pub use read::{HostInbound, HostInbox, Inbound, Inbox, PluginInbound, PluginInbox, RequestParams};
pub use reply::Replier;
pub use shared::Answer;
pub use violation::{
    EMPTY_LINE, REQUEST_WITHOUT_ID, SAMPLE_BYTES, UNKNOWN_METHOD, UNKNOWN_NOTIFICATION,
    UNKNOWN_RESPONSE_ID, Violation, ViolationReason,
};

use serde_json::value::RawValue;
use sharedos_protocol::ErrorKind;
use sharedos_protocol::jsonrpc::WireError;
use sharedos_protocol::method::Method;

/// A message's params as method `M` declares them; `None` when absent or
/// not of that shape (the input is never echoed: serde's message may quote
/// it).
pub fn params<M: Method>(raw: Option<&RawValue>) -> Option<M::Params> {
    serde_json::from_str(raw?.get()).ok()
}

/// The kind of an error received: its `data.kind`, else its code's kind
/// (one mapping, [`sharedos_protocol::RpcErrorCode`]), else `internal`.
pub fn kind_of(e: &WireError) -> ErrorKind {
    e.kind()
        .or_else(|| {
            i32::try_from(e.code)
                .ok()
                .and_then(sharedos_protocol::RpcErrorCode::from_code)
                .map(|c| c.kind())
        })
        .unwrap_or(ErrorKind::Internal)
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
