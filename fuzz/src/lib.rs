//! The bodies of the fuzz targets: each takes arbitrary bytes, runs one
//! parser of untrusted input and checks the invariants it promises. The
//! `fuzz_targets/` binaries hand them libFuzzer's inputs; the stable test
//! `tests/tests/fuzz_seeds.rs` includes this file and feeds it the seeds in
//! `fuzz/seeds/`, so every body runs in the normal suite. A panic is a
//! finding.

use std::path::Path;

use bytes::BytesMut;
use sharedos_protocol::jsonrpc::{Incoming, RequestId, classify};
use sharedos_protocol::{FrameError, NdjsonCodec};
use tokio_util::codec::Decoder;

/// The NDJSON decoder, fed in chunks whose sizes come from the input:
/// every line it yields is at most the limit, holds no `\n` and was valid
/// UTF-8; a too-long line or invalid UTF-8 is an error, never a panic.
pub fn ndjson(data: &[u8]) {
    let Some((&knobs, rest)) = data.split_first() else {
        return;
    };
    let max = 1 + usize::from(knobs & 0x3f);
    let chunk = 1 + usize::from(knobs >> 6) * 7;
    let mut codec = NdjsonCodec::new(max);
    let mut buf = BytesMut::new();
    let check = |line: &str| {
        assert!(line.len() <= max, "a line of {} bytes > {max}", line.len());
        assert!(!line.contains('\n'));
    };
    for piece in rest.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(line)) => check(&line),
                Ok(None) => break,
                Err(FrameError::TooLarge { limit }) => {
                    assert_eq!(limit, max);
                    return;
                }
                Err(FrameError::InvalidUtf8) => return,
                Err(FrameError::Io(e)) => panic!("i/o error from a buffer: {e}"),
            }
        }
    }
    while let Ok(Some(line)) = codec.decode_eof(&mut buf) {
        check(&line);
    }
}

/// The peer's hand-written line reader (`peer/src/frame.rs`, what reads a
/// plugin's output) against the codec it is held to ([`NdjsonCodec`]):
/// the input cut into reads whose size and the line limit come from its
/// first byte, the same lines and the same first error from both.
pub fn frame_lines(data: &[u8]) {
    let Some((&knobs, rest)) = data.split_first() else {
        return;
    };
    let max = 1 + usize::from(knobs & 0x3f);
    let chunk = 1 + usize::from(knobs >> 6) * 7;
    let chunks: Vec<&[u8]> = rest.chunks(chunk).collect();
    let seen = |r: Result<String, FrameError>| r.map_err(|e| e.to_string());
    let mut codec = NdjsonCodec::new(max);
    let mut buf = BytesMut::new();
    let mut reference = Vec::new();
    'read: {
        for piece in &chunks {
            buf.extend_from_slice(piece);
            loop {
                match codec.decode(&mut buf) {
                    Ok(Some(line)) => reference.push(Ok(line)),
                    Ok(None) => break,
                    Err(e) => {
                        reference.push(Err(e));
                        break 'read;
                    }
                }
            }
        }
        loop {
            match codec.decode_eof(&mut buf) {
                Ok(Some(line)) => reference.push(Ok(line)),
                Ok(None) => break 'read,
                Err(e) => {
                    reference.push(Err(e));
                    break 'read;
                }
            }
        }
    }
    let fast: Vec<_> = sharedos_peer::read_lines(&chunks, max)
        .into_iter()
        .map(seen)
        .collect();
    let reference: Vec<_> = reference.into_iter().map(seen).collect();
    assert_eq!(
        fast, reference,
        "the peer's reader differs on {rest:?}, max {max}"
    );
}

/// The JSON-RPC classifier: whatever the line, one verdict; an accepted
/// id is a string of at most 64 bytes or an integer below 2^53.
pub fn jsonrpc(data: &[u8]) {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let id_ok = |id: &RequestId| match id {
        RequestId::String(s) => s.len() <= 64,
        RequestId::Number(n) => *n < (1u64 << 53),
    };
    match classify(line) {
        Ok(Incoming::Request { id, method, .. }) => {
            assert!(id_ok(&id), "{id:?}");
            assert!(!method.is_empty() || line.contains("\"method\""));
        }
        Ok(Incoming::Response { id, .. }) => assert!(id_ok(&id), "{id:?}"),
        Ok(Incoming::Notification { .. }) | Err(_) => {}
    }
}

/// The host.toml loader: any text is a configuration or a typed error
/// naming the file; never a panic.
pub fn host_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = sharedos_host::config::HostConfig::parse(text, "fuzz.toml", Path::new("/")) {
        assert_eq!(e.file, "fuzz.toml");
        assert!(!e.message.is_empty());
    }
}

/// The file tools' path parsing: an accepted path is relative, joins back
/// to itself, and every segment is a plain name (no `/`, `\`, `.`, `..`,
/// temp prefix, control, format or bidi character).
pub fn file_path(data: &[u8]) {
    let Some((&flag, rest)) = data.split_first() else {
        return;
    };
    let Ok(path) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(segments) = sharedos_kernel::tools::files::parse_path(path, flag & 1 == 1) else {
        return;
    };
    assert_eq!(segments.join("/"), path);
    for s in &segments {
        assert!(!s.is_empty() && s != "." && s != "..", "{s:?}");
        assert!(!s.contains('/') && !s.contains('\\'), "{s:?}");
        assert!(!s.starts_with(".sharedos-tmp-"), "{s:?}");
        assert!(
            sharedos_protocol::text::first_unsafe_in_name(s).is_none(),
            "{s:?}"
        );
    }
}

/// What a consumer of a call line ends up with, whichever reading made
/// it: the verdict, and a tool call's params parsed (or `None` when they
/// do not parse), any other params as their text.
#[derive(Debug, PartialEq)]
enum CallSeen {
    Refused(sharedos_protocol::jsonrpc::EnvelopeError),
    Request(RequestId, String, Option<CallBody>),
    Notification(String, Option<CallBody>),
    Response(RequestId, String),
}

#[derive(Debug, PartialEq)]
enum CallBody {
    Call(Option<Box<sharedos_protocol::InvokeToolParams>>),
    Text(String),
}

fn call_body(method: &str, raw: &serde_json::value::RawValue) -> CallBody {
    if method == sharedos_protocol::methods::HOST_INVOKE_TOOL {
        CallBody::Call(serde_json::from_str(raw.get()).ok().map(Box::new))
    } else {
        CallBody::Text(raw.get().to_owned())
    }
}

/// The reference reading: `classify`, then the consumer's own serde parse
/// of a tool call's raw params.
fn call_reference(line: &str) -> CallSeen {
    match classify(line) {
        Err(e) => CallSeen::Refused(e),
        Ok(Incoming::Request { id, method, params }) => {
            let b = params.map(|p| call_body(&method, p));
            CallSeen::Request(id, method.into_owned(), b)
        }
        Ok(Incoming::Notification { method, params }) => {
            let b = params.map(|p| call_body(&method, p));
            CallSeen::Notification(method.into_owned(), b)
        }
        Ok(Incoming::Response { id, result }) => {
            CallSeen::Response(id, format!("{:?}", result.map(|r| r.get())))
        }
    }
}

/// A reading that yields [`sharedos_protocol::jsonrpc::Params`] (the one
/// pass of `classify_call`, or the hand reader alone), as a consumer sees it.
fn call_fast(
    answer: Result<
        Incoming<'_, sharedos_protocol::jsonrpc::Params<'_>>,
        sharedos_protocol::jsonrpc::EnvelopeError,
    >,
) -> CallSeen {
    use sharedos_protocol::jsonrpc::Params;
    let body = |method: &str, p: Params<'_>| match p {
        Params::InvokeTool(call) => CallBody::Call(Some(call)),
        Params::Raw(raw) => call_body(method, raw),
    };
    match answer {
        Err(e) => CallSeen::Refused(e),
        Ok(Incoming::Request { id, method, params }) => {
            let b = params.map(|p| body(&method, p));
            CallSeen::Request(id, method.into_owned(), b)
        }
        Ok(Incoming::Notification { method, params }) => {
            let b = params.map(|p| body(&method, p));
            CallSeen::Notification(method.into_owned(), b)
        }
        Ok(Incoming::Response { id, result }) => {
            CallSeen::Response(id, format!("{:?}", result.map(|r| r.get())))
        }
    }
}

/// A plugin's call line, read the three ways the host can read it: the
/// one pass production uses (`classify_call`) and the hand-written reader
/// it tries first (`classify_call_by_hand`) must each end exactly where
/// the reference reading ends, error or value.
pub fn call_line(data: &[u8]) {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let reference = call_reference(line);
    let one_pass = call_fast(sharedos_protocol::jsonrpc::classify_call(line));
    assert_eq!(one_pass, reference, "classify_call differs on {line:?}");
    if let Some(by_hand) = sharedos_protocol::jsonrpc::classify_call_by_hand(line) {
        assert_eq!(
            call_fast(Ok(by_hand)),
            reference,
            "the hand reader differs on {line:?}"
        );
    }
}

/// A plugin's RFC 3339 time (a tool call's context, an event's time):
/// the hand check that takes the common shape must take exactly what the
/// `time` crate takes.
pub fn timestamp(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let fast = sharedos_protocol::Timestamp::parse(text).is_ok();
    let reference =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).is_ok();
    assert_eq!(
        fast, reference,
        "Timestamp::parse differs from time on {text:?}"
    );
}

/// A tool result read by the SDKs (`ToolResult::from_json`, one pass for
/// the host's status-first shape): the same value, or the same error, as
/// serde's derive; both through `sharedos_protocol::per_call`'s two faces.
pub fn tool_result(data: &[u8]) {
    use sharedos_protocol::per_call::{fast, reference};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let read = fast::read_tool_result(text).map_err(|e| e.to_string());
    let want = reference::read_tool_result(text);
    assert_eq!(
        read,
        want.as_ref().map_err(|e| e.to_string()).cloned(),
        "ToolResult::from_json differs on {text:?}"
    );
    // The hand writer the host answers every call with writes what the
    // derive writes for the result just read.
    if let Ok(result) = want {
        assert_eq!(
            fast::write_tool_result(&result).ok(),
            reference::write_tool_result(&result).ok(),
            "ToolResult::write_json differs on {text:?}"
        );
    }
}

/// The hand-written JSON text primitives (`sharedos_protocol::json`) on
/// a plugin's bytes: a string quoted and escaped, and its length, exactly
/// as `serde_json` writes it; the byte search a line reader uses, exactly
/// where the first such byte is; a number as `u64::to_string` writes it.
pub fn json_text(data: &[u8]) {
    use sharedos_protocol::json;
    let Some((&byte, rest)) = data.split_first() else {
        return;
    };
    assert_eq!(
        json::find_byte(rest, byte),
        rest.iter().position(|&b| b == byte),
        "find_byte({byte}) differs on {rest:?}"
    );
    if let Some(word) = rest.first_chunk::<8>() {
        let n = u64::from_le_bytes(*word) >> (byte % 64);
        let mut out = Vec::new();
        json::write_u64(&mut out, n);
        assert_eq!(out, n.to_string().into_bytes());
    }
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let reference = serde_json::to_string(text).unwrap_or_default();
    let mut written = b"prefix".to_vec();
    json::write_str(&mut written, text);
    assert_eq!(
        String::from_utf8_lossy(&written[6..]),
        reference,
        "write_str differs on {text:?}"
    );
    assert_eq!(json::str_len(text), reference.len(), "str_len on {text:?}");
}

/// Any JSON value a plugin sends (a tool's arguments, a result's output),
/// written back by the hand writers: `tool_json::write_value`, and the
/// peer's request line built without serde (`request_line_written`), each
/// exactly what serde writes for the same value.
pub fn json_value(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let mut written = Vec::new();
    sharedos_protocol::tool_json::write_value(&mut written, &value);
    let reference = serde_json::to_string(&value).unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(&written),
        reference,
        "write_value differs on {value:?}"
    );
    let id = data.len() as u64 * 7919;
    let method = value
        .as_object()
        .and_then(|o| o.keys().next().cloned())
        .unwrap_or_else(|| "host/invokeTool".to_owned());
    let fast = sharedos_peer::request_line_written(id, &method, &value);
    let serde_line = sharedos_peer::request_line(id, &method, &value).unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(&fast),
        serde_line,
        "the written request line differs on {value:?}"
    );
}

/// An audit record as JSON (the shape the JSONL sink and the stores keep;
/// its strings come from plugins, grants and configuration): the line the
/// kernel writes by hand is exactly the derive's line and a newline.
pub fn audit_line(data: &[u8]) {
    let Ok(record) = serde_json::from_slice::<sharedos_kernel::AuditRecord>(data) else {
        return;
    };
    let Ok(mut reference) = serde_json::to_vec(&record) else {
        return;
    };
    reference.push(b'\n');
    match record.to_json_line() {
        Ok(line) => assert_eq!(
            String::from_utf8_lossy(&line),
            String::from_utf8_lossy(&reference),
            "to_json_line differs on {record:?}"
        ),
        Err(e) => panic!("serde writes {record:?} but to_json_line refuses it: {e}"),
    }
}

/// The contracts' bounded text (`Text<MIN, MAX>`), which skips trimming
/// and counting where the ends and the byte length already decide: the
/// same verdict and the same kept text as trimming and counting every
/// character.
pub fn bounded_text(data: &[u8]) {
    use sharedos_protocol::Text;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    fn reference<const MIN: usize, const MAX: usize>(s: &str) -> Option<String> {
        let t = s.trim();
        let n = t.chars().count();
        (MIN..=MAX).contains(&n).then(|| t.to_owned())
    }
    fn check<const MIN: usize, const MAX: usize>(s: &str) {
        let fast = Text::<MIN, MAX>::new(s).ok().map(Text::into_string);
        assert_eq!(
            fast,
            reference::<MIN, MAX>(s),
            "Text<{MIN}, {MAX}> differs on {s:?}"
        );
    }
    check::<1, 4>(text);
    check::<2, 8>(text);
    check::<1, 16>(text);
    check::<1, 256>(text);
}
