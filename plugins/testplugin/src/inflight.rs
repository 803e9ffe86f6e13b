//! `parallel_calls` over the wire: the bench's client of the envelope's
//! calls in flight. Per call it does the same little as the bench's client
//! of other servers (bench/src/calls.rs): a request written from a template
//! into a buffer that goes out in one write once no answer is left to read
//! without waiting, and an answer read for its id and whether it is an
//! error, not built into a tree.

use std::collections::HashSet;
use std::io::Write;
use std::time::Instant;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::connection::Plugin;

/// An answer as the client checks it.
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    id: Option<u64>,
    #[serde(default)]
    method: Option<String>,
    /// Whether the answer is an error (its text is read again to report it).
    #[serde(default, deserialize_with = "present")]
    error: bool,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    <serde::de::IgnoredAny as Deserialize>::deserialize(d).map(|_| true)
}

/// A `host/invokeTool` request of `tool` with `arguments`, the parts
/// around its request id and its call's number serialized once.
struct Template {
    /// From `,"method"` to the call id's opening quote and `p`.
    middle: Vec<u8>,
    /// From the call id's closing quote to the end of the line, cut at
    /// each `{n}` of the arguments (where the call's number goes).
    end: Vec<Vec<u8>>,
}

impl Template {
    fn new(p: &Plugin, tool: &str, arguments: &Value) -> Self {
        let middle = format!(
            r#","method":"host/invokeTool","params":{{"turnId":{},"call":{{"id":"p"#,
            p.turn_id
        );
        let end = format!(
            r#"","tool":{},"arguments":{},"traceId":{},"requestedAt":"2026-01-01T00:00:00Z"}}}}}}"#,
            json!(tool),
            if arguments.is_null() {
                json!({})
            } else {
                arguments.clone()
            },
            p.trace
        );
        let end = format!("{end}\n")
            .split("{n}")
            .map(|part| part.as_bytes().to_vec())
            .collect();
        Self {
            middle: middle.into_bytes(),
            end,
        }
    }

    /// Appends the request `id` for the call `p<number>`.
    fn write(&self, out: &mut Vec<u8>, id: u64, number: u64) {
        // Writing into a `Vec` cannot fail.
        let _ = write!(out, r#"{{"jsonrpc":"2.0","id":{id}"#);
        out.extend_from_slice(&self.middle);
        let _ = write!(out, "{number}");
        for (i, part) in self.end.iter().enumerate() {
            if i > 0 {
                let _ = write!(out, "{number}");
            }
            out.extend_from_slice(part);
        }
    }
}

/// `n` calls of `tool` with `arguments` (null: none; each `{n}` in them
/// is the call's number, from 0), at most `inflight` unanswered at a time; reports the nanoseconds they took as
/// `parallelNs`. An error says why the calls stopped (the turn is then
/// failed with it).
pub fn parallel_calls(
    p: &mut Plugin,
    tool: &str,
    n: u64,
    inflight: u64,
    arguments: &Value,
) -> Result<(), String> {
    let template = Template::new(p, tool, arguments);
    let t = Instant::now();
    let mut pending = HashSet::new();
    let mut sent = 0;
    let mut batch = Vec::new();
    let mut line = String::new();
    while sent < n || !pending.is_empty() {
        while sent < n && (pending.len() as u64) < inflight.max(1) {
            let id = p.next_id;
            p.next_id += 1;
            template.write(&mut batch, id, sent);
            pending.insert(id);
            sent += 1;
        }
        if !batch.is_empty() {
            p.write_raw(&batch);
            batch.clear();
        }
        loop {
            p.read_line_into(&mut line);
            let Ok(answer) = serde_json::from_str::<Answer>(&line) else {
                return Err(format!("not an answer: {}", line.trim_end()));
            };
            if let Some(method) = &answer.method {
                p.control(method);
            } else if let Some(id) = answer.id
                && pending.remove(&id)
                && answer.error
            {
                return Err(format!("uncaught: {}", line.trim_end()));
            }
            if !p.line_buffered() {
                break;
            }
        }
    }
    p.reports
        .insert("parallelNs".into(), json!(t.elapsed().as_nanos() as u64));
    Ok(())
}
