//! Live observation of a turn: every event, in order, as an immutable
//! value. Observation cannot change an outcome: the observer gets a copy,
//! and a panicking callback is contained.

use std::sync::Arc;

use sharedos_protocol::text::escape_text;
use sharedos_protocol::{EventKind, ExecutionEvent};
use tokio::sync::mpsc;

use crate::executor::OnEvent;

/// An `on_event` callback that forwards every event into a stream.
///
/// ```
/// # async fn f() {
/// let (on_event, mut events) = sharedos_host::observe::event_stream();
/// // pass `on_event` in `ExecuteOptions`, then:
/// while let Some(event) = events.recv().await {
///     println!("{} {}", event.sequence, event.kind);
/// }
/// # }
/// ```
pub fn event_stream() -> (OnEvent, mpsc::UnboundedReceiver<ExecutionEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let cb: OnEvent = Arc::new(move |e: &ExecutionEvent| {
        let _ = tx.send(e.clone());
    });
    (cb, rx)
}

/// One readable line for a terminal. Everything in it may come from the
/// plugin (an emitted event, a reason), so the line is escaped
/// ([`escape_text`]): no control, format or bidi character reaches the
/// terminal raw.
pub fn describe(event: &ExecutionEvent) -> String {
    let d = &event.data;
    let s = |k: &str| d.get(k).and_then(|v| v.as_str()).unwrap_or("").to_owned();
    // A kind this build does not know (a log of another host) has no detail.
    let detail = match EventKind::from_name(event.kind.as_str()) {
        Some(EventKind::TurnStarted) => format!(
            "runtime {} {}, tools [{}]",
            d["runtime"]["id"].as_str().unwrap_or(""),
            d["runtime"]["version"].as_str().unwrap_or(""),
            d["visibleTools"]
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(|v| v.as_str())
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ),
        Some(EventKind::ToolRequested) => format!("{} ({})", s("tool"), s("callId")),
        Some(EventKind::ToolCompleted) => {
            let code = s("code");
            if code.is_empty() {
                format!("{} → {}", s("tool"), s("status"))
            } else {
                format!("{} → {} {}", s("tool"), s("status"), code)
            }
        }
        Some(EventKind::RuntimeEvent) => format!("{} {}", s("type"), d["data"]),
        Some(EventKind::TurnFailed) => format!("{} (source {})", s("code"), s("source")),
        Some(EventKind::TurnDenied) => s("code"),
        Some(EventKind::TurnEscalated) => s("reason"),
        Some(EventKind::EgressRequest) => {
            let outcome = match (d["status"].as_u64(), d["code"].as_str()) {
                (_, Some(code)) => code.to_owned(),
                (Some(status), None) => status.to_string(),
                (None, None) => String::new(),
            };
            let mut line = format!("{} → {outcome}", s("route"));
            if let (Some(i), Some(o)) = (d["inputTokens"].as_u64(), d["outputTokens"].as_u64()) {
                line.push_str(&format!(", {i}+{o} tokens"));
            }
            line
        }
        Some(EventKind::EgressConnection) => format!("{} {}", s("destination"), s("code")),
        Some(EventKind::EgressBudgetExceeded) => s("budget"),
        Some(
            EventKind::TurnCompleted | EventKind::TurnCancelled | EventKind::EgressModelFailing,
        )
        | None => String::new(),
    };
    escape_text(&format!(
        "[{:>3}] {:<16} {}",
        event.sequence,
        event.kind.as_str(),
        detail
    ))
}
