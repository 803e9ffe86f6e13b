//! The host side of the `initialize` handshake (protocol.md B.2): offer
//! the versions and limits, wait for the answer within a timeout, check
//! the chosen version and the reported manifest against the registry's.

use std::time::Duration;

use serde_json::value::RawValue;
use sharedos_peer::{
    HostInbound as Inbound, HostInbox as Inbox, Peer, PeerConfig, Violation, ViolationReason,
};
use sharedos_protocol::jsonrpc::truncate;
use sharedos_protocol::method::{Initialize, Method, Received};
use sharedos_protocol::{
    ConnectionLimits, HostInfo, InitializeParams, InitializeResult, JsonObject, PROTOCOL_VERSIONS,
    RuntimeManifest,
};

/// A peer configuration for the host end of a plugin connection (its
/// [`Inbox`] takes the plugin→host methods of the protocol's table): the
/// plugin speaks only after answering `initialize`.
pub fn host_peer_config(base: PeerConfig) -> PeerConfig {
    PeerConfig {
        handshake_first: true,
        ..base
    }
}

/// Why the handshake failed. Every case is a load failure of the runtime.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HandshakeError {
    #[error("did not answer initialize within {0:?}")]
    Timeout(Duration),
    #[error(
        "wrote to stdout before the handshake ({reason}): \"{sample}\"; stdout carries protocol messages only, log to stderr"
    )]
    StdoutBeforeHandshake {
        reason: &'static str,
        sample: String,
    },
    #[error("broke the protocol during the handshake: {0}")]
    Violation(Violation),
    #[error("refused initialize: {code} {message}")]
    Rejected { code: i64, message: String },
    #[error("answered initialize with an invalid result: {0}")]
    InvalidResult(String),
    #[error(
        "chose protocol version {chosen}, which this host does not speak (offered {offered:?})"
    )]
    UnsupportedVersion { chosen: u32, offered: Vec<u32> },
    #[error(
        "reported a manifest whose `{field}` is {reported}, but the configured runtime says {configured}"
    )]
    ManifestMismatch {
        field: &'static str,
        reported: String,
        configured: String,
    },
}

/// Sends `initialize`, waits for the answer within `timeout`, checks the
/// chosen version and the manifest against the configured one.
pub async fn handshake(
    peer: &Peer,
    inbound: &mut Inbox,
    expected: &RuntimeManifest,
    limits: ConnectionLimits,
    timeout: Duration,
) -> Result<InitializeResult, HandshakeError> {
    handshake_offering(peer, inbound, expected, limits, JsonObject::new(), timeout).await
}

/// [`handshake`] with the host's `capabilities` (`turns: "many"` for a
/// runtime with session affinity, docs/PROTOCOL.md section 4.6).
pub async fn handshake_offering(
    peer: &Peer,
    inbound: &mut Inbox,
    expected: &RuntimeManifest,
    limits: ConnectionLimits,
    capabilities: JsonObject,
    timeout: Duration,
) -> Result<InitializeResult, HandshakeError> {
    let params = InitializeParams {
        protocol_versions: PROTOCOL_VERSIONS.to_vec(),
        host: HostInfo {
            name: "sharedos".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        limits,
        capabilities,
    };
    let id = peer
        .request(Initialize::NAME, &params)
        .await
        .map_err(HandshakeError::Violation)?;
    let answer = match tokio::time::timeout(timeout, wait_handshake(inbound, id)).await {
        Ok(r) => r?,
        Err(_) => {
            peer.forget(id);
            return Err(HandshakeError::Timeout(timeout));
        }
    };
    let result: InitializeResult = serde_json::from_str(answer.get())
        .map_err(|e| HandshakeError::InvalidResult(truncate(&e.to_string(), 300)))?;
    if !PROTOCOL_VERSIONS.contains(&result.protocol_version) {
        return Err(HandshakeError::UnsupportedVersion {
            chosen: result.protocol_version,
            offered: PROTOCOL_VERSIONS.to_vec(),
        });
    }
    check_manifest(&result.manifest, expected)?;
    Ok(result)
}

/// The plugin sent `method` before answering `initialize`.
fn spoke_first(method: &str) -> HandshakeError {
    HandshakeError::StdoutBeforeHandshake {
        reason: "stdout_before_handshake",
        sample: sharedos_protocol::codec::escaped_sample(method.as_bytes(), 200),
    }
}

async fn wait_handshake(inbound: &mut Inbox, id: u64) -> Result<Box<RawValue>, HandshakeError> {
    loop {
        match inbound.recv().await {
            Some(Inbound::Response { id: got, result }) if got == id => {
                return result.map_err(|e| HandshakeError::Rejected {
                    code: e.code,
                    message: truncate(&e.message, 300),
                });
            }
            Some(Inbound::Response { .. }) => continue,
            Some(Inbound::Request { method, .. }) => return Err(spoke_first(method.name())),
            Some(Inbound::Notification { method, .. }) => return Err(spoke_first(method.name())),
            Some(Inbound::Closed(v)) => {
                return Err(match v.reason {
                    ViolationReason::InvalidJson
                    | ViolationReason::StdoutBeforeHandshake
                    | ViolationReason::InvalidEnvelope
                    | ViolationReason::BatchNotSupported
                    | ViolationReason::InvalidUtf8
                    | ViolationReason::FrameTooLarge => HandshakeError::StdoutBeforeHandshake {
                        reason: v.reason.as_str(),
                        sample: v.sample,
                    },
                    _ => HandshakeError::Violation(v),
                });
            }
            None => {
                return Err(HandshakeError::Violation(Violation::new(
                    ViolationReason::Io,
                    "the reader stopped",
                )));
            }
        }
    }
}

/// The reported manifest must equal the trusted registry entry, field by
/// field.
pub fn check_manifest(
    reported: &RuntimeManifest,
    expected: &RuntimeManifest,
) -> Result<(), HandshakeError> {
    let fields: [(&'static str, String, String); 4] = [
        ("id", show(&reported.id), show(&expected.id)),
        ("version", show(&reported.version), show(&expected.version)),
        (
            "protocolVersion",
            show(&reported.protocol_version),
            show(&expected.protocol_version),
        ),
        (
            "metadata",
            show(&reported.metadata),
            show(&expected.metadata),
        ),
    ];
    for (field, reported, configured) in fields {
        if reported != configured {
            return Err(HandshakeError::ManifestMismatch {
                field,
                reported,
                configured,
            });
        }
    }
    Ok(())
}

/// JSON rendering for the manifest comparison, bounded for messages.
fn show<T: serde::Serialize>(v: &T) -> String {
    let s = serde_json::to_string(v).unwrap_or_else(|_| "<unserializable>".into());
    truncate(&s, 200)
}
