//! Live observation of a turn: every event, in order, as an immutable
//! value. Observation cannot change an outcome: the observer gets a copy,
//! and a panicking callback is contained.

use std::sync::Arc;

use sharedos_protocol::ExecutionEvent;
use sharedos_protocol::text::escape_text;
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
    let detail = match event.kind.as_str() {
        "turn.started" => format!(
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
        "tool.requested" => format!("{} ({})", s("tool"), s("callId")),
        "tool.completed" => {
            let code = s("code");
            if code.is_empty() {
                format!("{} → {}", s("tool"), s("status"))
            } else {
                format!("{} → {} {}", s("tool"), s("status"), code)
            }
        }
        "runtime.event" => format!("{} {}", s("type"), d["data"]),
        "turn.failed" => format!("{} (source {})", s("code"), s("source")),
        "turn.denied" => s("code"),
        "turn.escalated" => s("reason"),
        "egress.request" => {
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
        "egress.connection" => format!("{} {}", s("destination"), s("code")),
        "egress.budget_exceeded" => s("budget"),
        _ => String::new(),
    };
    escape_text(&format!(
        "[{:>3}] {:<16} {}",
        event.sequence,
        event.kind.as_str(),
        detail
    ))
}
