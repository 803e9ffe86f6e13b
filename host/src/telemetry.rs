//! One span per turn, `sharedos.turn`, carrying the request's trace id
//! (docs/SERVE.md, "Traces"). The span is a `tracing` span: any subscriber
//! sees it. With the `otel` feature (the `sharedos` binary turns it on),
//! the span is placed in an OpenTelemetry trace whose id is the request's
//! `traceId` when that is a W3C trace id (32 hex digits, not all zero), and
//! otherwise the first 16 bytes of the SHA-256 of the `traceId`, so every
//! turn of one trace lands in one OpenTelemetry trace either way. The
//! exporter is the binary's choice (`cli/src/telemetry.rs`).

use sharedos_protocol::{ExecutionRequest, ExecutionResult};
use tracing::field::Empty;

/// The span of one turn, before it starts. `session`: the session the
/// turn runs in, when it has one.
pub(crate) fn turn_span(request: &ExecutionRequest, session: Option<&str>) -> tracing::Span {
    let span = tracing::info_span!(
        "sharedos.turn",
        otel.name = "sharedos.turn",
        otel.status_code = Empty,
        sharedos.execution_id = %request.execution_id,
        sharedos.trace_id = %request.context.trace_id,
        sharedos.agent = ?request.agent,
        sharedos.session_id = session.unwrap_or(""),
        sharedos.status = Empty,
        sharedos.code = Empty,
    );
    #[cfg(feature = "otel")]
    otel::place(&span, request.context.trace_id.as_str());
    span
}

/// Records how the turn ended on its span.
pub(crate) fn record_end<E>(span: &tracing::Span, result: &Result<ExecutionResult, E>) {
    match result {
        Ok(r) => {
            span.record("sharedos.status", tracing::field::debug(&r.status));
            if let Some(code) = r.code() {
                span.record("sharedos.code", code);
            }
            let ok = matches!(
                r.status,
                sharedos_protocol::ExecutionStatus::Succeeded
                    | sharedos_protocol::ExecutionStatus::Escalated
            );
            span.record("otel.status_code", if ok { "OK" } else { "ERROR" });
        }
        Err(_) => {
            span.record("sharedos.status", "rejected");
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// The 16 bytes of the OpenTelemetry trace id for a request's `traceId`.
pub fn otel_trace_id(trace_id: &str) -> [u8; 16] {
    let hex = trace_id.as_bytes();
    if hex.len() == 32 && hex.iter().all(u8::is_ascii_hexdigit) {
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            out[i] = digit(pair[0]) << 4 | digit(pair[1]);
        }
        if out != [0u8; 16] {
            return out;
        }
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(trace_id.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// Puts `span` in the OpenTelemetry trace of `trace_id`: its parent is
    /// a remote span context of that trace (the caller's side of the
    /// turn, whose span id is derived from the same digest, so it is the
    /// same for every turn of the trace).
    pub(super) fn place(span: &tracing::Span, trace_id: &str) {
        let id = super::otel_trace_id(trace_id);
        let mut parent = [0u8; 8];
        parent.copy_from_slice(&id[8..]);
        if parent == [0u8; 8] {
            parent[7] = 1;
        }
        let context = SpanContext::new(
            TraceId::from_bytes(id),
            SpanId::from_bytes(parent),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let cx = opentelemetry::Context::new().with_remote_span_context(context);
        if let Err(e) = span.set_parent(cx) {
            tracing::debug!(error = %e, "the turn's span could not join its trace");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::otel_trace_id;

    #[test]
    fn a_w3c_trace_id_is_kept_and_any_other_is_digested() {
        let w3c = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            otel_trace_id(w3c),
            [
                0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
                0x47, 0x36
            ]
        );
        // All zero is not a valid W3C id: digested like any other text.
        let zero = "0".repeat(32);
        assert_ne!(otel_trace_id(&zero), [0u8; 16]);
        assert_eq!(otel_trace_id("trace-1"), otel_trace_id("trace-1"));
        assert_ne!(otel_trace_id("trace-1"), otel_trace_id("trace-2"));
        assert_ne!(otel_trace_id("trace-1"), [0u8; 16]);
    }
}
