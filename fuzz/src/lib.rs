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
