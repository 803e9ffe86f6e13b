//! The host side of one connection: the `initialize` handshake and one
//! turn (protocol.md B.2, B.3), serving the plugin's `host/*` messages with
//! a [`RuntimeHost`]. No file descriptor here either.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use sharedos_plugin_sdk::{HostCallError, RuntimeError, RuntimeHost, Signal};
use sharedos_protocol::jsonrpc::{WireError, truncate};
use sharedos_protocol::{
    AnnotateParams, ConnectionLimits, EmitParams, ErrorKind, HostInfo, InitializeParams,
    InitializeResult, InvokeToolParams, JsonObject, PROTOCOL_VERSIONS, RuntimeLimits,
    RuntimeManifest, RuntimeTurnOutcome, RuntimeTurnRequest, ToolResult, TurnAbortParams,
    TurnDrainingParams, TurnId, TurnRunParams, methods,
};
use tokio::time::Instant;

use super::peer::{
    Inbound, Inbox, Peer, PeerConfig, Replier, Violation, ViolationReason, wire_error,
};

/// The plugin→host requests the host serves (the protocol's method table
/// lists them; a test checks the two agree).
pub const REQUEST_METHODS: &[&str] = &[methods::HOST_INVOKE_TOOL];
/// The plugin→host notifications the host takes.
pub const NOTIFICATION_METHODS: &[&str] = &[methods::HOST_EMIT, methods::HOST_ANNOTATE];

/// After the process exits, how long the reader may still deliver what the
/// plugin wrote before it died (its outcome, typically).
pub const EXIT_DRAIN_GRACE: Duration = Duration::from_millis(250);

/// One tool call being served, tagged with its slot in `pending`.
type CallFuture =
    std::pin::Pin<Box<dyn Future<Output = (u64, Result<ToolResult, HostCallError>)> + Send>>;

/// A peer configuration for the host end of a plugin connection.
pub fn host_peer_config(base: PeerConfig) -> PeerConfig {
    PeerConfig {
        request_methods: REQUEST_METHODS,
        notification_methods: NOTIFICATION_METHODS,
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
    peer: &mut Peer,
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
    peer: &mut Peer,
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
        .request(methods::INITIALIZE, &params)
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
            Some(Inbound::Request { method, .. }) | Some(Inbound::Notification { method, .. }) => {
                return Err(HandshakeError::StdoutBeforeHandshake {
                    reason: "stdout_before_handshake",
                    sample: sharedos_protocol::codec::escaped_sample(method.as_bytes(), 200),
                });
            }
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

/// Runs one turn on an initialized connection: sends `turn/run`, serves
/// `host/invokeTool` concurrently and `host/emit` / `host/annotate` in wire
/// order, forwards the drain and the abort, and returns when the `turn/run`
/// response arrives (or the turn cannot go on). `exited` resolves when the
/// plugin process is gone; what it wrote before dying is still delivered
/// for [`EXIT_DRAIN_GRACE`].
pub async fn drive_turn(
    peer: &Peer,
    run_id: u64,
    inbound: &mut Inbox,
    turn_id: &TurnId,
    host: Arc<dyn RuntimeHost>,
    abort: Signal,
    exited: impl Future<Output = String>,
) -> Result<RuntimeTurnOutcome, RuntimeError> {
    // The calls run inside this task (no spawn, no cross-thread wake-up
    // per call); whatever is still running at the end is spawned then.
    let mut calls: FuturesUnordered<CallFuture> = FuturesUnordered::new();
    let mut pending: HashMap<u64, Replier> = HashMap::new();
    let mut next_call = 0u64;
    let draining = host.draining();
    let mut drain_sent = false;
    let mut exit_deadline: Option<(Instant, String)> = None;
    let mut dead_seen = false;
    let dead = peer.dead();
    tokio::pin!(dead);
    tokio::pin!(exited);

    let ending = loop {
        let exit_sleep = async {
            match &exit_deadline {
                Some((at, _)) => tokio::time::sleep_until(*at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = abort.raised() => {
                peer.try_notify(methods::TURN_ABORT, &TurnAbortParams { turn_id: turn_id.clone(), reason: Some("aborted".into()) });
                for (_, reply) in pending.drain() {
                    reply.try_error(&WireError::new(ErrorKind::Cancelled, "the turn was aborted"));
                }
                break Err(RuntimeError::Failed("the turn was aborted by the host".into()));
            }
            item = inbound.recv() => {
                let Some(item) = item else {
                    break Err(RuntimeError::Protocol("the plugin connection stopped".into()));
                };
                match item {
                    Inbound::Response { id, result } if id == run_id => {
                        break match result {
                            Ok(raw) => serde_json::from_str::<RuntimeTurnOutcome>(raw.get())
                                .map_err(|e| RuntimeError::InvalidOutcome(truncate(&e.to_string(), 500))),
                            Err(e) => Err(RuntimeError::Failed(format!(
                                "the plugin answered turn/run with error {}: {}", e.code, truncate(&e.message, 500)
                            ))),
                        };
                    }
                    Inbound::Response { .. } => {}
                    Inbound::Closed(v) => break Err(protocol_error(&v)),
                    Inbound::Notification { method, params } => {
                        if let Err(v) = apply_notification(peer, turn_id, host.as_ref(), method, params.as_deref()) {
                            break Err(protocol_error(&v));
                        }
                    }
                    Inbound::Request { method, params, reply } => {
                        debug_assert_eq!(method, methods::HOST_INVOKE_TOOL);
                        match check_invoke(turn_id, &abort, params.as_deref()) {
                            Err(err) => {
                                if let Err(v) = peer.count_violation("invalid_invoke_tool") {
                                    break Err(protocol_error(&v));
                                }
                                if let Err(v) = reply.error(&err).await {
                                    break Err(protocol_error(&v));
                                }
                            }
                            Ok(p) => {
                                next_call += 1;
                                pending.insert(next_call, reply);
                                let host = host.clone();
                                let n = next_call;
                                calls.push(Box::pin(async move { (n, host.invoke_tool(p.call, p.step).await) }));
                            }
                        }
                    }
                }
            }
            Some((n, result)) = calls.next(), if !calls.is_empty() => {
                let Some(reply) = pending.remove(&n) else { continue };
                let sent = match result {
                    // A ToolResult is always a result, refusals included.
                    Ok(tool_result) => reply.result(&tool_result).await,
                    Err(e) => reply.error(&host_call_error(&e)).await,
                };
                if let Err(v) = sent {
                    break Err(protocol_error(&v));
                }
            }
            _ = draining.raised(), if !drain_sent => {
                drain_sent = true;
                if let Err(v) = peer.notify(methods::TURN_DRAINING, &TurnDrainingParams { turn_id: turn_id.clone() }).await {
                    break Err(protocol_error(&v));
                }
            }
            v = &mut dead, if !dead_seen => {
                dead_seen = true;
                // A writer that hit a closed pipe means the plugin is gone;
                // what it wrote before (its outcome, say) may still be in
                // the reader's hands, so wait like for an exit.
                if v.reason != ViolationReason::PluginExited {
                    break Err(protocol_error(&v));
                }
                if exit_deadline.is_none() {
                    exit_deadline = Some((Instant::now() + EXIT_DRAIN_GRACE, v.detail.clone()));
                }
            }
            how = &mut exited, if exit_deadline.is_none() => {
                exit_deadline = Some((Instant::now() + EXIT_DRAIN_GRACE, how));
            }
            _ = exit_sleep => {
                let how = exit_deadline.as_ref().map(|(_, h)| h.clone()).unwrap_or_default();
                peer.fail(Violation::new(ViolationReason::PluginExited, how.clone()));
                break Err(RuntimeError::Protocol(format!("plugin_exited: {how}")));
            }
        }
    };
    // Tool calls still running are left to finish on the host side: the
    // executor accounts for the kernel's completion, not for our reply.
    if !calls.is_empty() {
        tokio::spawn(async move { while calls.next().await.is_some() {} });
    }
    ending
}

fn protocol_error(v: &Violation) -> RuntimeError {
    RuntimeError::Protocol(v.to_string())
}

/// Maps a `HostCallError` to the wire error (code from `ErrorKind::code()`).
pub fn host_call_error(e: &HostCallError) -> WireError {
    wire_error(&super::peer::rpc_error(e.kind, &truncate(&e.message, 1000)))
}

fn parse<T: DeserializeOwned>(params: Option<&RawValue>) -> Option<T> {
    serde_json::from_str(params?.get()).ok()
}

fn check_invoke(
    turn_id: &TurnId,
    abort: &Signal,
    params: Option<&RawValue>,
) -> Result<InvokeToolParams, WireError> {
    // The input is never echoed back: serde's message may quote it.
    let Some(p) = parse::<InvokeToolParams>(params) else {
        return Err(WireError::new(
            ErrorKind::InvalidParams,
            "host/invokeTool params do not match the contract",
        ));
    };
    if &p.turn_id != turn_id || abort.is_raised() {
        return Err(WireError::new(ErrorKind::TurnNotActive, "turn not active"));
    }
    Ok(p)
}

/// Applies one notification; a bad one is dropped and counted.
fn apply_notification(
    peer: &Peer,
    turn_id: &TurnId,
    host: &dyn RuntimeHost,
    method: &str,
    params: Option<&RawValue>,
) -> Result<(), Violation> {
    let applied = match method {
        methods::HOST_EMIT => match parse::<EmitParams>(params) {
            Some(p) if &p.turn_id == turn_id => host.emit(p.event).map_err(|_| "emit_rejected"),
            Some(_) => Err("notification_for_inactive_turn"),
            None => Err("invalid_emit"),
        },
        methods::HOST_ANNOTATE => match parse::<AnnotateParams>(params) {
            Some(p) if &p.turn_id == turn_id => host
                .annotate(&p.key, p.value)
                .map_err(|_| "annotate_rejected"),
            Some(_) => Err("notification_for_inactive_turn"),
            None => Err("invalid_annotate"),
        },
        _ => Err("unknown_notification"),
    };
    match applied {
        Ok(()) => Ok(()),
        Err(what) => peer.count_violation(what),
    }
}

/// The `turn/run` params.
pub fn turn_run_params(
    turn_id: &TurnId,
    request: RuntimeTurnRequest,
    limits: RuntimeLimits,
) -> TurnRunParams {
    TurnRunParams {
        turn_id: turn_id.clone(),
        request,
        limits,
    }
}

#[cfg(test)]
mod method_table {
    use sharedos_protocol::method::{Direction, received_by};

    /// The lists the peer is configured with are the protocol's
    /// plugin→host methods, split by kind, and nothing else.
    #[test]
    fn the_host_takes_exactly_the_plugin_to_host_methods_of_the_table() {
        let sent = |kind: &str| -> Vec<&str> {
            received_by(Direction::PluginToHost)
                .filter(|m| m.kind() == kind)
                .map(|m| m.name)
                .collect()
        };
        assert_eq!(super::REQUEST_METHODS, sent("request").as_slice());
        assert_eq!(super::NOTIFICATION_METHODS, sent("notification").as_slice());
    }
}
