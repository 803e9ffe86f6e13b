//! The hand-written readers and writers of the per-call path, each timed
//! against its reference (serde's derive, `serde_json`'s classifier, the
//! `time` crate, a plain trim and count) and, where a library does the same
//! job, against that library, on the same input in one run
//! (docs/BENCHMARKS.md, "Fast paths against their references").
//!
//! The fast and the reference reading of each row are the same functions
//! of two modules (`sharedos_protocol::per_call::{fast, reference}`,
//! `sharedos_kernel::audit::per_call::{fast, reference}`), so nothing here
//! names a type of the fast paths.
//!
//! The library is passed in ([`Library`]): `bench/examples/parsers.rs`
//! brings sonic-rs as a dev-dependency, so the shipped code never links it.
//! Every row's three readings are checked to agree on the input before
//! they are timed.

use std::hint::black_box;
use std::time::Instant;

use sharedos_kernel::AuditRecord;
use sharedos_kernel::audit::per_call as audit;
use sharedos_protocol::per_call::{fast, reference};
use sharedos_protocol::{InvokeToolParams, Text, Timestamp, ToolResult};

/// A general-purpose JSON library doing each row's job its own way.
pub trait Library {
    /// Its name in the table.
    fn name(&self) -> &'static str;
    /// A `host/invokeTool` request line to its params (`None`: not read).
    fn read_call(&self, line: &str) -> Option<InvokeToolParams>;
    /// A tool result's JSON to the value.
    fn read_tool_result(&self, text: &str) -> Option<ToolResult>;
    /// A tool result's compact JSON.
    fn write_tool_result(&self, result: &ToolResult) -> Vec<u8>;
    /// An audit record's compact JSON (no newline).
    fn write_record(&self, record: &AuditRecord) -> Vec<u8>;
    /// A string quoted and escaped.
    fn write_str(&self, s: &str) -> Vec<u8>;
}

/// One row: nanoseconds per operation for each reading.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: &'static str,
    pub fast: f64,
    pub reference: f64,
    pub library: Option<f64>,
}

/// The best of nine rounds of `iterations` calls, in ns per call (the
/// minimum: on a shared machine it is what stays put between runs).
fn time_ns(iterations: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..iterations / 10 {
        f();
    }
    (0..9)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(iterations)
        })
        .fold(f64::INFINITY, f64::min)
}

/// A plugin's tool call as it arrives (escapes and a nested argument).
pub const CALL_LINE: &str = r#"{"jsonrpc":"2.0","id":42,"method":"host/invokeTool","params":{"turnId":"t-7f3a","call":{"id":"c-000017","tool":"files.read","arguments":{"path":"notes/2026/\u00e9t\u00e9 \"draft\".md","offset":0,"limit":4096},"traceId":"trace-7f3a","requestedAt":"2026-12-05T21:14:39.123Z"},"step":3}}"#;

/// A succeeded tool result as the host answers it.
pub const TOOL_RESULT: &str = r#"{"status":"succeeded","callId":"c-000017","tool":"files.read","output":{"text":"line one\nline two\twith a tab and a \"quote\"","bytes":37,"truncated":false},"completedAt":"2026-12-05T21:14:39.123Z","metadata":{"cache":"miss"}}"#;

/// A `tool.invoked` record as the kernel writes it on every call.
pub const AUDIT_RECORD: &str = r#"{"id":"0190c3e2-0000-7000-8000-000000000001","type":"tool.invoked","outcome":"succeeded","at":"2026-12-05T21:14:39.123Z","traceId":"trace-7f3a","namespaceId":"acme","actor":{"kind":"agent","agentId":"agent-1"},"authority":{"kind":"service","serviceId":"svc"},"owner":{"kind":"human","userId":"user-1"},"purpose":"summarise the notes","source":"kernel","resource":{"namespace":"acme","path":["notes","2026"]},"action":"read","grantId":"g-12","operationId":"op-9","tool":"files.read"}"#;

/// A plugin's event text: mostly plain, one escape.
pub const EVENT_TEXT: &str = "Reading notes/2026/summary.md (4096 bytes) and the index \"all\"\n";

/// The time a call's context carries.
pub const TIMESTAMP: &str = "2026-12-05T21:14:39.123+01:00";

fn text_reference(s: &str) -> Option<&str> {
    let t = s.trim();
    (1..=512).contains(&t.chars().count()).then_some(t)
}

type Lib<'a> = Option<&'a dyn Library>;

fn same(name: &str, ok: bool) -> Result<(), String> {
    ok.then_some(())
        .ok_or(format!("{name}: the readings differ"))
}

/// Every row, fast against reference against `library`; each reading
/// checked equal first. `Err` names a row whose readings differ.
pub fn rows(iterations: u32, library: Lib<'_>) -> Result<Vec<Row>, String> {
    Ok(vec![
        call_line(iterations, library)?,
        tool_result_read(iterations, library)?,
        tool_result_write(iterations, library)?,
        audit_line(iterations, library)?,
        string_write(iterations, library)?,
        timestamp(iterations)?,
        bounded_text(iterations)?,
    ])
}

/// The call line: `classify_call` (the hand reader first) against
/// `classify` and serde on the params.
fn call_line(iterations: u32, library: Lib<'_>) -> Result<Row, String> {
    let read = fast::read_call(CALL_LINE);
    same(
        "call line",
        read.is_some() && read == reference::read_call(CALL_LINE),
    )?;
    if let Some(l) = library {
        same("call line (library)", l.read_call(CALL_LINE) == read)?;
    }
    Ok(Row {
        name: "call line read (`classify_call`)",
        fast: time_ns(iterations, || {
            drop(black_box(fast::read_call(black_box(CALL_LINE))))
        }),
        reference: time_ns(iterations, || {
            drop(black_box(reference::read_call(black_box(CALL_LINE))))
        }),
        library: library.map(|l| time_ns(iterations, || drop(black_box(l.read_call(CALL_LINE))))),
    })
}

/// A tool result read: `from_json` against the derive.
fn tool_result_read(iterations: u32, library: Lib<'_>) -> Result<Row, String> {
    let result = fast::read_tool_result(TOOL_RESULT).map_err(|e| e.to_string())?;
    same(
        "tool result read",
        reference::read_tool_result(TOOL_RESULT).ok().as_ref() == Some(&result),
    )?;
    if let Some(l) = library {
        same(
            "tool result read (library)",
            l.read_tool_result(TOOL_RESULT).as_ref() == Some(&result),
        )?;
    }
    Ok(Row {
        name: "tool result read (`ToolResult::from_json`)",
        fast: time_ns(iterations, || {
            drop(black_box(fast::read_tool_result(black_box(TOOL_RESULT))))
        }),
        reference: time_ns(iterations, || {
            drop(black_box(reference::read_tool_result(black_box(
                TOOL_RESULT,
            ))))
        }),
        library: library.map(|l| {
            time_ns(iterations, || {
                drop(black_box(l.read_tool_result(TOOL_RESULT)))
            })
        }),
    })
}

/// A tool result written: `WriteJson` against the derive.
fn tool_result_write(iterations: u32, library: Lib<'_>) -> Result<Row, String> {
    let result = reference::read_tool_result(TOOL_RESULT).map_err(|e| e.to_string())?;
    let written = reference::write_tool_result(&result).map_err(|e| e.to_string())?;
    same(
        "tool result write",
        fast::write_tool_result(&result).ok().as_ref() == Some(&written),
    )?;
    if let Some(l) = library {
        same(
            "tool result write (library)",
            l.write_tool_result(&result) == written,
        )?;
    }
    Ok(Row {
        name: "tool result write (`WriteJson`)",
        fast: time_ns(iterations, || {
            drop(black_box(fast::write_tool_result(black_box(&result))))
        }),
        reference: time_ns(iterations, || {
            drop(black_box(reference::write_tool_result(black_box(&result))))
        }),
        library: library
            .map(|l| time_ns(iterations, || drop(black_box(l.write_tool_result(&result))))),
    })
}

/// An audit record's line: `to_json_line` against the derive.
fn audit_line(iterations: u32, library: Lib<'_>) -> Result<Row, String> {
    let record: AuditRecord = serde_json::from_str(AUDIT_RECORD).map_err(|e| e.to_string())?;
    let line = audit::reference::record_line(&record).map_err(|e| e.to_string())?;
    if let Some(l) = library {
        let mut written = l.write_record(&record);
        written.push(b'\n');
        same("audit line (library)", written == line)?;
    }
    same(
        "audit line",
        audit::fast::record_line(&record).ok().as_ref() == Some(&line),
    )?;
    Ok(Row {
        name: "audit record line (`to_json_line`)",
        fast: time_ns(iterations, || {
            drop(black_box(audit::fast::record_line(black_box(&record))))
        }),
        reference: time_ns(iterations, || {
            drop(black_box(audit::reference::record_line(black_box(&record))))
        }),
        library: library.map(|l| time_ns(iterations, || drop(black_box(l.write_record(&record))))),
    })
}

/// A string quoted: `json::write_str` against `serde_json`.
fn string_write(iterations: u32, library: Lib<'_>) -> Result<Row, String> {
    let quoted = reference::write_str(EVENT_TEXT).map_err(|e| e.to_string())?;
    same(
        "string write",
        fast::write_str(EVENT_TEXT).ok().as_ref() == Some(&quoted),
    )?;
    if let Some(l) = library {
        same("string write (library)", l.write_str(EVENT_TEXT) == quoted)?;
    }
    Ok(Row {
        name: "string quoted (`json::write_str`)",
        fast: time_ns(iterations, || {
            drop(black_box(fast::write_str(black_box(EVENT_TEXT))))
        }),
        reference: time_ns(iterations, || {
            drop(black_box(reference::write_str(black_box(EVENT_TEXT))))
        }),
        library: library.map(|l| time_ns(iterations, || drop(black_box(l.write_str(EVENT_TEXT))))),
    })
}

/// A timestamp checked: the hand check against the `time` crate (which
/// `Timestamp::parse` falls back to).
fn timestamp(iterations: u32) -> Result<Row, String> {
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    same(
        "timestamp",
        Timestamp::parse(TIMESTAMP).is_ok()
            && time::OffsetDateTime::parse(TIMESTAMP, rfc3339).is_ok(),
    )?;
    Ok(Row {
        name: "timestamp checked (`Timestamp::parse`)",
        fast: time_ns(iterations, || {
            drop(black_box(Timestamp::parse(black_box(TIMESTAMP))))
        }),
        reference: time_ns(iterations, || {
            black_box(time::OffsetDateTime::parse(black_box(TIMESTAMP), rfc3339).is_ok());
            drop(black_box(std::sync::Arc::<str>::from(TIMESTAMP)));
        }),
        library: None,
    })
}

/// Bounded text: the byte-length shortcut against trimming and counting.
fn bounded_text(iterations: u32) -> Result<Row, String> {
    same(
        "bounded text",
        Text::<1, 512>::new(EVENT_TEXT)
            .ok()
            .as_ref()
            .map(Text::as_str)
            == text_reference(EVENT_TEXT),
    )?;
    Ok(Row {
        name: "bounded text (`Text::new`)",
        fast: time_ns(iterations, || {
            drop(black_box(Text::<1, 512>::new(black_box(EVENT_TEXT))))
        }),
        reference: time_ns(iterations, || {
            drop(black_box(
                text_reference(black_box(EVENT_TEXT)).map(std::sync::Arc::<str>::from),
            ))
        }),
        library: None,
    })
}

/// The rows as a Markdown table (ns per operation, and the reference's
/// time over the fast path's).
pub fn table(rows: &[Row], library: Option<&str>) -> String {
    let lib = library.unwrap_or("library");
    let mut out = format!(
        "| fast path | fast ns | reference ns | {lib} ns | reference / fast |\n|---|---:|---:|---:|---:|\n"
    );
    for r in rows {
        let l = r.library.map_or("–".to_owned(), |n| format!("{n:.0}"));
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {l} | {:.2}× |\n",
            r.name,
            r.fast,
            r.reference,
            r.reference / r.fast
        ));
    }
    out
}
