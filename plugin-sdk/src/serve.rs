//! [`serve`]: makes a binary a runtime plugin over its stdin/stdout.
//!
//! ```no_run
//! # use sharedos_plugin_sdk::*;
//! # struct MyRuntime;
//! # #[async_trait::async_trait]
//! # impl RuntimePlugin for MyRuntime {
//! #     fn manifest(&self) -> RuntimeManifest { RuntimeManifest::new("mine", "1").unwrap() }
//! #     async fn run(&self, _: RuntimeTurnRequest, _: std::sync::Arc<dyn RuntimeHost>, _: Signal)
//! #         -> Result<RuntimeTurnOutcome, RuntimeError> { Ok(RuntimeTurnOutcome::complete(serde_json::Value::Null)) }
//! # }
//! fn main() -> std::process::ExitCode {
//!     sharedos_plugin_sdk::serve(MyRuntime)
//! }
//! ```
//!
//! The same `RuntimePlugin` runs in process (the host calls it directly)
//! or here, where [`RemoteHost`] implements `RuntimeHost` as JSON-RPC
//! messages: `invoke_tool` is a request, `emit` and `annotate` are
//! notifications checked locally first, `turn/draining` and `turn/abort`
//! raise the two signals.

use std::collections::HashMap;
use std::io::{self, IsTerminal};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;
use sharedos_protocol::jsonrpc::{self, Incoming, RequestId, WireError};
use sharedos_protocol::{
    AnnotateParams, DEFAULT_MAX_MESSAGE_BYTES, EmitParams, ErrorKind, InitializeParams,
    InitializeResult, NdjsonCodec, PLUGIN_COOKIE_ENV, PROTOCOL_VERSIONS, RpcErrorCode,
    RuntimeEvent, RuntimeLimits, ToolCall, ToolResult, TurnAbortParams, TurnDrainingParams, TurnId,
    TurnRunParams, methods,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, oneshot};
use tokio_util::codec::FramedRead;

use crate::host::{HostCallError, RuntimeHost, RuntimePlugin, check_annotation};
use crate::signal::{Signal, SignalSource};

/// The SDK's name and version, sent in the `initialize` result.
pub const SDK_NAME: &str = concat!("sharedos-rust/", env!("CARGO_PKG_VERSION"));

type BoxRead = Pin<Box<dyn AsyncRead + Send>>;
type BoxWrite = Pin<Box<dyn AsyncWrite + Send>>;

/// Runs `plugin` over this process's stdin/stdout until stdin closes.
///
/// Refuses to run (exit code 2) unless `SHAREDOS_PLUGIN` is set and stdin
/// is not a terminal: the binary is meant to be started by a sharedos host,
/// not by hand. After taking
/// its own handle on stdout it points fd 1 at stderr, so a stray
/// `println!` in plugin code lands in the log instead of breaking the
/// protocol.
pub fn serve(plugin: impl RuntimePlugin + 'static) -> ExitCode {
    if std::env::var_os(PLUGIN_COOKIE_ENV).is_none() || io::stdin().is_terminal() {
        eprintln!(
            "This binary is a sharedos runtime plugin. It is meant to be run by a sharedos host, \
             which talks to it over stdin/stdout; it is not meant to be executed directly."
        );
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sharedos plugin: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let (reader, writer) = match stdio() {
            Ok(pair) => pair,
            Err(e) => {
                eprintln!("sharedos plugin: cannot open stdio: {e}");
                return ExitCode::FAILURE;
            }
        };
        match serve_io(plugin, reader, writer).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sharedos plugin: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Epoll-driven pipes on dup'd fds 0 and 1 when they are pipes (protocol.md
/// C.4); a blocking-thread file handle otherwise (a file, a socket, a
/// terminal).
fn stdio() -> io::Result<(BoxRead, BoxWrite)> {
    let stdin = io::stdin().as_fd().try_clone_to_owned()?;
    let reader: BoxRead = match stdin
        .try_clone()
        .and_then(tokio::net::unix::pipe::Receiver::from_owned_fd)
    {
        Ok(r) => Box::pin(r),
        Err(_) => Box::pin(tokio::fs::File::from_std(std::fs::File::from(stdin))),
    };
    let stdout = io::stdout().as_fd().try_clone_to_owned()?;
    let writer: BoxWrite = match stdout
        .try_clone()
        .and_then(tokio::net::unix::pipe::Sender::from_owned_fd)
    {
        Ok(w) => Box::pin(w),
        Err(_) => Box::pin(tokio::fs::File::from_std(std::fs::File::from(stdout))),
    };
    // Protocol bytes go through our handle only; fd 1 now reaches stderr.
    let _ = rustix::stdio::dup2_stdout(io::stderr().as_fd());
    Ok((reader, writer))
}

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the host sent a malformed line: {0}")]
    Framing(#[from] sharedos_protocol::FrameError),
    #[error("the host sent an invalid message: {0}")]
    Envelope(#[from] jsonrpc::EnvelopeError),
}

type Pending = Mutex<HashMap<u64, oneshot::Sender<Result<Box<RawValue>, WireError>>>>;

/// The lines waiting for the writer, as bytes: a message is serialized
/// straight into it (no string of its own, no queue node), and the writer
/// takes everything queued with one write.
#[derive(Default)]
struct Outbox {
    queued: Mutex<Vec<u8>>,
    ready: Notify,
    closing: AtomicBool,
}

impl Outbox {
    /// Appends one compact JSON message and its newline, unless it would
    /// exceed `max` bytes: then nothing is queued and `false` returned.
    fn push(&self, max: usize, message: &impl Serialize) -> Result<bool, serde_json::Error> {
        {
            let mut queued = lock(&self.queued);
            let start = queued.len();
            if let Err(e) = serde_json::to_writer(&mut *queued, message) {
                queued.truncate(start);
                return Err(e);
            }
            if queued.len() - start > max {
                queued.truncate(start);
                return Ok(false);
            }
            queued.push(b'\n');
        }
        self.ready.notify_one();
        Ok(true)
    }

    /// Lets the writer end once it has written what is queued.
    fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.ready.notify_one();
    }

    /// Writes what is queued, in as few writes as the pipe takes, until
    /// closed or the pipe is gone.
    async fn write_to(&self, mut writer: impl AsyncWrite + Unpin) {
        let mut batch = Vec::new();
        loop {
            self.ready.notified().await;
            std::mem::swap(&mut batch, &mut *lock(&self.queued));
            if !batch.is_empty() {
                if writer.write_all(&batch).await.is_err() || writer.flush().await.is_err() {
                    return;
                }
                batch.clear();
            }
            if self.closing.load(Ordering::SeqCst) && lock(&self.queued).is_empty() {
                return;
            }
        }
    }
}

/// The wire form of a JSON-RPC message the plugin sends, borrowing its
/// parts (the same members, in the same order, as `jsonrpc`'s lines).
#[derive(Serialize)]
struct OutMessage<'a, P: Serialize, E: Serialize> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a RequestId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a P>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a P>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a E>,
}

impl<'a, P: Serialize> OutMessage<'a, P, WireError> {
    fn request(id: Option<&'a RequestId>, method: &'a str, params: &'a P) -> Self {
        Self {
            jsonrpc: "2.0",
            id,
            method: Some(method),
            params: Some(params),
            result: None,
            error: None,
        }
    }
    fn response(id: &'a RequestId, result: &'a P) -> Self {
        Self {
            jsonrpc: "2.0",
            id: Some(id),
            method: None,
            params: None,
            result: Some(result),
            error: None,
        }
    }
}

fn error_message<'a>(id: &'a RequestId, error: &'a WireError) -> OutMessage<'a, (), WireError> {
    OutMessage {
        jsonrpc: "2.0",
        id: Some(id),
        method: None,
        params: None,
        result: None,
        error: Some(error),
    }
}

struct Conn {
    out: Arc<Outbox>,
    pending: Pending,
    next_id: AtomicU64,
    max_message_bytes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Conn {
    fn max(&self) -> usize {
        usize::try_from(self.max_message_bytes.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }
    fn respond(&self, id: &RequestId, result: &impl Serialize) {
        match self.out.push(self.max(), &OutMessage::response(id, result)) {
            Ok(true) => {}
            Ok(false) => self.fail(
                id,
                WireError::new(
                    ErrorKind::MessageTooLarge,
                    "the response exceeds maxMessageBytes",
                )
                .with("limit", Value::from(self.max() as u64)),
            ),
            Err(e) => self.fail(id, WireError::new(ErrorKind::Internal, e.to_string())),
        }
    }
    fn fail(&self, id: &RequestId, error: WireError) {
        // An error object always serializes and is small; the limit is
        // not applied to it (as `jsonrpc::error_response` never did).
        let _ = self.out.push(usize::MAX, &error_message(id, &error));
    }
    fn cancel_pending(&self) {
        for (_, tx) in lock(&self.pending).drain() {
            let _ = tx.send(Err(WireError::new(
                ErrorKind::Cancelled,
                "the turn was aborted",
            )));
        }
    }
}

struct ActiveTurn {
    turn_id: TurnId,
    drain: SignalSource,
    abort: SignalSource,
    /// Set just before the outcome is queued: from then on a plugin with
    /// `turns: "many"` may be given the next turn.
    answered: Arc<AtomicBool>,
}

/// The `initialize` result's capabilities: `turns: "many"` when the
/// plugin says it may serve several turns.
fn turns_capability(many: bool) -> sharedos_protocol::JsonObject {
    let mut caps = sharedos_protocol::JsonObject::new();
    if many {
        caps.insert(
            sharedos_protocol::CAPABILITY_TURNS.into(),
            Value::from(sharedos_protocol::TURNS_MANY),
        );
    }
    caps
}

/// Serves `plugin` over any reader/writer pair (a child's stdio, or
/// `tokio::io::duplex` in tests) until the reader reaches EOF.
pub async fn serve_io<P, R, W>(plugin: P, reader: R, writer: W) -> Result<(), ServeError>
where
    P: RuntimePlugin + 'static,
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let plugin = Arc::new(plugin);
    let outbox = Arc::new(Outbox::default());
    let writer_task = tokio::spawn({
        let outbox = outbox.clone();
        async move { outbox.write_to(writer).await }
    });
    let conn = Arc::new(Conn {
        out: outbox.clone(),
        pending: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        max_message_bytes: AtomicU64::new(DEFAULT_MAX_MESSAGE_BYTES as u64),
    });
    let mut lines = FramedRead::new(reader, NdjsonCodec::new(DEFAULT_MAX_MESSAGE_BYTES));
    let mut initialized = false;
    // Both sides said `turns: "many"` in `initialize`.
    let mut many = false;
    let mut turn: Option<ActiveTurn> = None;
    let mut turn_task: Option<tokio::task::JoinHandle<()>> = None;
    let result = loop {
        let line = match lines.next().await {
            None => break Ok(()),
            Some(Err(e)) => break Err(ServeError::Framing(e)),
            Some(Ok(line)) if line.trim().is_empty() => continue,
            Some(Ok(line)) => line,
        };
        let msg = match jsonrpc::classify(&line) {
            Ok(m) => m,
            Err(e) => break Err(ServeError::Envelope(e)),
        };
        match msg {
            Incoming::Request { id, method, params } => match method.as_ref() {
                methods::INITIALIZE => {
                    let Some(p) = parse::<InitializeParams>(params) else {
                        conn.fail(
                            &id,
                            WireError::new(ErrorKind::InvalidParams, "invalid initialize params"),
                        );
                        continue;
                    };
                    let Some(version) = p
                        .protocol_versions
                        .iter()
                        .copied()
                        .filter(|v| PROTOCOL_VERSIONS.contains(v))
                        .max()
                    else {
                        conn.fail(
                            &id,
                            WireError::new(
                                ErrorKind::UnsupportedProtocolVersion,
                                "no common protocol version",
                            )
                            .with("supported", Value::from(PROTOCOL_VERSIONS.to_vec())),
                        );
                        continue;
                    };
                    conn.max_message_bytes
                        .store(p.limits.max_message_bytes, Ordering::Relaxed);
                    many = plugin.many_turns()
                        && sharedos_protocol::offers_many_turns(&p.capabilities);
                    initialized = true;
                    conn.respond(
                        &id,
                        &InitializeResult {
                            protocol_version: version,
                            manifest: plugin.manifest(),
                            sdk: Some(SDK_NAME.into()),
                            capabilities: turns_capability(plugin.many_turns()),
                        },
                    );
                }
                methods::TURN_RUN => {
                    if !initialized {
                        conn.fail(
                            &id,
                            WireError::new(ErrorKind::NotInitialized, "initialize first"),
                        );
                        continue;
                    }
                    // A plugin with `turns: "many"` takes the next turn
                    // once the previous one answered; the old turn's
                    // signals are raised so nothing of it keeps running.
                    if let Some(t) = turn.take_if(|t| many && t.answered.load(Ordering::SeqCst)) {
                        t.drain.raise();
                        t.abort.raise();
                    }
                    if turn.is_some() {
                        conn.fail(
                            &id,
                            WireError::new(ErrorKind::NotInitialized, "a turn is already running"),
                        );
                        continue;
                    }
                    let Some(p) = parse::<TurnRunParams>(params) else {
                        conn.fail(
                            &id,
                            WireError::new(ErrorKind::InvalidParams, "invalid turn/run params"),
                        );
                        continue;
                    };
                    let active = ActiveTurn {
                        turn_id: p.turn_id.clone(),
                        drain: SignalSource::new(),
                        abort: SignalSource::new(),
                        answered: Arc::new(AtomicBool::new(false)),
                    };
                    let answered = active.answered.clone();
                    let host = Arc::new(RemoteHost {
                        conn: conn.clone(),
                        turn_id: p.turn_id,
                        limits: p.limits,
                        draining: active.drain.signal(),
                        abort: active.abort.signal(),
                        closed: AtomicBool::new(false),
                    });
                    let abort = active.abort.signal();
                    let seat = host.clone();
                    turn = Some(active);
                    let plugin = plugin.clone();
                    let conn = conn.clone();
                    turn_task = Some(tokio::spawn(async move {
                        let ended = plugin.run(p.request, host, abort).await;
                        // The turn is closed once it answered (envelope.md
                        // B.2-B.4): calls and emits are refused from now on,
                        // annotations silently dropped.
                        seat.closed.store(true, Ordering::Relaxed);
                        answered.store(true, Ordering::SeqCst);
                        match ended {
                            Ok(outcome) => conn.respond(&id, &outcome),
                            Err(e) => {
                                conn.fail(&id, WireError::new(ErrorKind::Internal, e.to_string()))
                            }
                        }
                    }));
                }
                _ => conn.fail(
                    &id,
                    WireError::new(ErrorKind::MethodNotFound, "method not found"),
                ),
            },
            Incoming::Notification { method, params } => match (method.as_ref(), &turn) {
                (methods::TURN_DRAINING, Some(t))
                    if parse::<TurnDrainingParams>(params)
                        .is_some_and(|p| p.turn_id == t.turn_id) =>
                {
                    t.drain.raise();
                }
                (methods::TURN_ABORT, Some(t))
                    if parse::<TurnAbortParams>(params).is_some_and(|p| p.turn_id == t.turn_id) =>
                {
                    // The hard signal implies the soft one.
                    t.drain.raise();
                    t.abort.raise();
                    conn.cancel_pending();
                }
                // Unknown host notifications are ignored (B.7).
                _ => {}
            },
            Incoming::Response {
                id: RequestId::Number(n),
                result,
            } => {
                if let Some(tx) = lock(&conn.pending).remove(&n) {
                    let _ = tx.send(result.map(RawValue::to_owned));
                }
            }
            Incoming::Response { .. } => {}
        }
    };
    // Stdin closed: the host is gone or done. Stop the turn.
    if let Some(t) = &turn {
        t.drain.raise();
        t.abort.raise();
    }
    conn.cancel_pending();
    // Let the turn answer (it sees the abort) and the writer flush what is
    // queued, briefly; then stop.
    if let Some(task) = turn_task
        && tokio::time::timeout(EOF_GRACE, task).await.is_err()
    {
        tracing::debug!("the turn did not end within the EOF grace");
    }
    drop(conn);
    outbox.close();
    let abort_writer = writer_task.abort_handle();
    if tokio::time::timeout(EOF_GRACE, writer_task).await.is_err() {
        abort_writer.abort();
    }
    result
}

/// After stdin closes: how long the running turn may take to answer and
/// the writer to flush before `serve_io` returns.
const EOF_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

fn parse<T: serde::de::DeserializeOwned>(params: Option<&RawValue>) -> Option<T> {
    serde_json::from_str(params?.get()).ok()
}

/// `InvokeToolParams`, borrowed: the same members, serialized the same way.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InvokeToolRef<'a> {
    turn_id: &'a TurnId,
    call: &'a ToolCall,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<u64>,
}

/// `RuntimeHost` over the wire, for one turn.
pub struct RemoteHost {
    conn: Arc<Conn>,
    turn_id: TurnId,
    limits: RuntimeLimits,
    draining: Signal,
    abort: Signal,
    closed: AtomicBool,
}

impl RemoteHost {
    fn is_closed(&self) -> bool {
        self.abort.is_raised() || self.closed.load(Ordering::Relaxed)
    }

    fn notify(&self, method: &str, params: &impl Serialize) -> Result<(), HostCallError> {
        let message = OutMessage::request(None, method, params);
        match self.conn.out.push(self.conn.max(), &message) {
            Ok(true) => Ok(()),
            Ok(false) => Err(HostCallError::new(
                ErrorKind::MessageTooLarge,
                "the message exceeds maxMessageBytes",
            )),
            Err(e) => Err(HostCallError::invalid(e.to_string())),
        }
    }
}

fn kind_of(e: &WireError) -> ErrorKind {
    if let Some(k) = e.kind() {
        return k;
    }
    match i32::try_from(e.code).ok().and_then(RpcErrorCode::from_code) {
        Some(RpcErrorCode::InvalidRequest) => ErrorKind::InvalidRequest,
        Some(RpcErrorCode::MethodNotFound) => ErrorKind::MethodNotFound,
        Some(RpcErrorCode::InvalidParams) => ErrorKind::InvalidParams,
        Some(RpcErrorCode::Cancelled) => ErrorKind::Cancelled,
        Some(RpcErrorCode::UnsupportedProtocolVersion) => ErrorKind::UnsupportedProtocolVersion,
        Some(RpcErrorCode::NotInitialized) => ErrorKind::NotInitialized,
        Some(RpcErrorCode::TurnNotActive) => ErrorKind::TurnNotActive,
        Some(RpcErrorCode::Overloaded) => ErrorKind::Overloaded,
        Some(RpcErrorCode::MessageTooLarge) => ErrorKind::MessageTooLarge,
        Some(RpcErrorCode::Internal) | None => ErrorKind::Internal,
    }
}

#[async_trait]
impl RuntimeHost for RemoteHost {
    fn limits(&self) -> RuntimeLimits {
        self.limits
    }

    async fn invoke_tool(
        &self,
        call: ToolCall,
        step: Option<u64>,
    ) -> Result<ToolResult, HostCallError> {
        if self.is_closed() {
            return Err(HostCallError::closed());
        }
        let id = self.conn.next_id.fetch_add(1, Ordering::Relaxed);
        let params = InvokeToolRef {
            turn_id: &self.turn_id,
            call: &call,
            step,
        };
        let (tx, rx) = oneshot::channel();
        // Pending before it is queued: the answer can only come after.
        lock(&self.conn.pending).insert(id, tx);
        let wire_id = RequestId::Number(id);
        let request = OutMessage::request(Some(&wire_id), methods::HOST_INVOKE_TOOL, &params);
        let queued = self.conn.out.push(self.conn.max(), &request);
        if !matches!(queued, Ok(true)) {
            lock(&self.conn.pending).remove(&id);
        }
        match queued {
            Ok(true) => {}
            Ok(false) => {
                return Err(HostCallError::new(
                    ErrorKind::MessageTooLarge,
                    "the tool call exceeds maxMessageBytes",
                ));
            }
            Err(e) => return Err(HostCallError::invalid(e.to_string())),
        }
        let answer = tokio::select! {
            a = rx => a,
            _ = self.abort.raised() => {
                lock(&self.conn.pending).remove(&id);
                return Err(HostCallError::new(ErrorKind::Cancelled, "the turn was aborted"));
            }
        };
        match answer {
            Ok(Ok(raw)) => serde_json::from_str(raw.get()).map_err(|_| {
                HostCallError::new(
                    ErrorKind::Internal,
                    "the host returned an invalid tool result",
                )
            }),
            Ok(Err(e)) => Err(HostCallError::new(kind_of(&e), e.message)),
            Err(_) => Err(HostCallError::closed()),
        }
    }

    fn emit(&self, event: RuntimeEvent) -> Result<(), HostCallError> {
        if self.is_closed() {
            return Err(HostCallError::closed());
        }
        self.notify(
            methods::HOST_EMIT,
            &EmitParams {
                turn_id: self.turn_id.clone(),
                event,
            },
        )
    }

    fn annotate(&self, key: &str, value: Value) -> Result<(), HostCallError> {
        check_annotation(key)?;
        if self.closed.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.notify(
            methods::HOST_ANNOTATE,
            &AnnotateParams {
                turn_id: self.turn_id.clone(),
                key: key.to_owned(),
                value,
            },
        )
    }

    fn draining(&self) -> Signal {
        self.draining.clone()
    }
}
