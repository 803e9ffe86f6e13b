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
//! or here, on the same JSON-RPC peer as the host's end
//! ([`sharedos_peer`], with [`PeerConfig::plugin`]): [`RemoteHost`]
//! implements `RuntimeHost` as messages (`invoke_tool` is a request,
//! `emit` and `annotate` are notifications checked locally first), and
//! `turn/draining` and `turn/abort` raise the two signals.

use std::io::{self, IsTerminal};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;
use serde_json::value::RawValue;
use sharedos_peer::{
    Peer, PeerConfig, PluginInbound as Inbound, PluginInbox, Replier, RequestParams, Violation,
    ViolationReason,
};
use sharedos_protocol::method::{Initialize, TurnAbort, TurnDraining, TurnRun, to_plugin};
use sharedos_protocol::{
    ErrorKind, InitializeResult, PLUGIN_COOKIE_ENV, PROTOCOL_VERSIONS, TurnId,
};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::host::RuntimePlugin;
use crate::remote::RemoteHost;
use crate::signal::SignalSource;

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

/// Why serving stopped with an error: the host broke the protocol (a
/// malformed line, an invalid envelope) or the pipes failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the host broke the protocol: {0}")]
    Protocol(Violation),
}

/// After stdin closes: how long the running turn may take to answer and
/// the writer to flush before `serve_io` returns.
const EOF_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

struct ActiveTurn {
    turn_id: TurnId,
    drain: SignalSource,
    abort: SignalSource,
    /// Set just before the outcome is queued: from then on a plugin with
    /// `turns: "many"` may be given the next turn.
    answered: Arc<AtomicBool>,
}

impl ActiveTurn {
    /// The hard signal implies the soft one.
    fn stop(&self) {
        self.drain.raise();
        self.abort.raise();
    }
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
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let (peer, mut inbox): (_, PluginInbox) = Peer::spawn(reader, writer, PeerConfig::plugin());
    let mut session = Session {
        plugin: Arc::new(plugin),
        peer: Arc::new(peer),
        initialized: false,
        many: false,
        turn: None,
        turn_task: None,
    };
    let result = loop {
        match inbox.recv().await {
            Some(Inbound::Request {
                method,
                params,
                reply,
            }) => {
                let params = params.as_ref().and_then(RequestParams::raw);
                session.request(method, params, reply).await
            }
            Some(Inbound::Notification { method, params }) => {
                session.notification(method, params.as_deref())
            }
            // The SDK's own requests are answered to their callers.
            Some(Inbound::Response { .. }) => {}
            Some(Inbound::Closed(v)) if v.reason == ViolationReason::PluginExited => break Ok(()),
            Some(Inbound::Closed(v)) => break Err(ServeError::Protocol(v)),
            None => break Ok(()),
        }
    };
    drop(inbox);
    session.finish().await;
    result
}

/// The plugin's side of one connection: the handshake's answer and the
/// turn it runs.
struct Session<P> {
    plugin: Arc<P>,
    peer: Arc<Peer>,
    initialized: bool,
    /// Both sides said `turns: "many"` in `initialize`.
    many: bool,
    turn: Option<ActiveTurn>,
    turn_task: Option<tokio::task::JoinHandle<()>>,
}

impl<P: RuntimePlugin + 'static> Session<P> {
    async fn request(
        &mut self,
        method: to_plugin::Request,
        params: Option<&RawValue>,
        reply: Replier,
    ) {
        // The peer delivers only the host→plugin requests of the table
        // (others are answered `-32601` by the peer itself).
        let answered = match method {
            to_plugin::Request::Initialize => self.initialize(params, reply).await,
            to_plugin::Request::TurnRun => self.run(params, reply),
        };
        if let Err(v) = answered {
            tracing::debug!("cannot answer the host: {v}");
        }
    }

    async fn initialize(
        &mut self,
        params: Option<&RawValue>,
        reply: Replier,
    ) -> Result<(), Violation> {
        let Some(p) = sharedos_peer::params::<Initialize>(params) else {
            let invalid =
                sharedos_peer::error(ErrorKind::InvalidParams, "invalid initialize params");
            return reply.error(&invalid).await;
        };
        let common = p.protocol_versions.iter().copied();
        let Some(version) = common.filter(|v| PROTOCOL_VERSIONS.contains(v)).max() else {
            let mut data = serde_json::Map::new();
            data.insert("supported".into(), Value::from(PROTOCOL_VERSIONS.to_vec()));
            let unsupported = sharedos_peer::error_with(
                ErrorKind::UnsupportedProtocolVersion,
                "no common protocol version",
                data,
            );
            return reply.error(&unsupported).await;
        };
        let limit = usize::try_from(p.limits.max_message_bytes).unwrap_or(usize::MAX);
        self.peer.set_max_message_bytes(limit);
        self.many =
            self.plugin.many_turns() && sharedos_protocol::offers_many_turns(&p.capabilities);
        self.initialized = true;
        let result = InitializeResult {
            protocol_version: version,
            manifest: self.plugin.manifest(),
            sdk: Some(SDK_NAME.into()),
            capabilities: turns_capability(self.plugin.many_turns()),
        };
        reply.answer::<Initialize>(&result).await
    }

    /// `turn/run`: starts the turn in its own task, which answers when the
    /// plugin's `run` returns.
    fn run(&mut self, params: Option<&RawValue>, reply: Replier) -> Result<(), Violation> {
        if let Some(refusal) = self.refuse_turn() {
            reply.try_error(&refusal);
            return Ok(());
        }
        let Some(p) = sharedos_peer::params::<TurnRun>(params) else {
            reply.try_error(&sharedos_peer::error(
                ErrorKind::InvalidParams,
                "invalid turn/run params",
            ));
            return Ok(());
        };
        let active = ActiveTurn {
            turn_id: p.turn_id.clone(),
            drain: SignalSource::new(),
            abort: SignalSource::new(),
            answered: Arc::new(AtomicBool::new(false)),
        };
        let answered = active.answered.clone();
        let host = Arc::new(RemoteHost::new(
            self.peer.clone(),
            p.turn_id,
            p.limits,
            active.drain.signal(),
            active.abort.signal(),
        ));
        let abort = active.abort.signal();
        self.turn = Some(active);
        let plugin = self.plugin.clone();
        self.turn_task = Some(tokio::spawn(async move {
            let ended = plugin.run(p.request, host.clone(), abort).await;
            // The turn is closed once it answered (envelope.md B.2-B.4):
            // calls and emits are refused from now on, annotations
            // silently dropped.
            host.close();
            answered.store(true, Ordering::SeqCst);
            let sent = match ended {
                Ok(outcome) => reply.answer::<TurnRun>(&outcome).await,
                Err(e) => {
                    let failed = sharedos_peer::error(ErrorKind::Internal, e.to_string());
                    reply.error(&failed).await
                }
            };
            if let Err(v) = sent {
                tracing::debug!("cannot answer turn/run: {v}");
            }
        }));
        Ok(())
    }

    /// Why a `turn/run` cannot start now, if it cannot. A plugin with
    /// `turns: "many"` takes the next turn once the previous one answered;
    /// the old turn's signals are raised so nothing of it keeps running.
    fn refuse_turn(&mut self) -> Option<sharedos_peer::ErrorObjectOwned> {
        if !self.initialized {
            return Some(sharedos_peer::error(
                ErrorKind::NotInitialized,
                "initialize first",
            ));
        }
        let many = self.many;
        if let Some(t) = self
            .turn
            .take_if(|t| many && t.answered.load(Ordering::SeqCst))
        {
            t.stop();
        }
        self.turn
            .as_ref()
            .map(|_| sharedos_peer::error(ErrorKind::NotInitialized, "a turn is already running"))
    }

    /// `turn/draining` and `turn/abort` for the running turn; unknown or
    /// mismatched host notifications are ignored (B.7).
    fn notification(&mut self, method: to_plugin::Notification, params: Option<&RawValue>) {
        let Some(t) = &self.turn else { return };
        match method {
            to_plugin::Notification::TurnDraining => {
                if sharedos_peer::params::<TurnDraining>(params)
                    .is_some_and(|p| p.turn_id == t.turn_id)
                {
                    t.drain.raise();
                }
            }
            to_plugin::Notification::TurnAbort => {
                if sharedos_peer::params::<TurnAbort>(params)
                    .is_some_and(|p| p.turn_id == t.turn_id)
                {
                    t.stop();
                    self.peer.cancel_calls("the turn was aborted");
                }
            }
        }
    }

    /// Stdin closed: the host is gone or done. Stop the turn, let it
    /// answer (it sees the abort) and the writer flush, briefly.
    async fn finish(self) {
        if let Some(t) = &self.turn {
            t.stop();
        }
        self.peer.cancel_calls("the turn was aborted");
        if let Some(task) = self.turn_task
            && tokio::time::timeout(EOF_GRACE, task).await.is_err()
        {
            tracing::debug!("the turn did not end within the EOF grace");
        }
        self.peer.close(EOF_GRACE).await;
    }
}
