//! The bounded NDJSON codec: one compact JSON-RPC object per `\n`-terminated
//! UTF-8 line, at most `max` bytes a line (8 MiB by default).
//!
//! A line over the limit or invalid UTF-8 is an error; the caller treats
//! either as fatal on the plugin's stdout. Memory stays at about the limit
//! plus one read chunk, whatever the peer sends.

use bytes::{BufMut, BytesMut};
use tokio_util::codec::{Decoder, Encoder, LinesCodec, LinesCodecError};

/// 8 MiB, the default limit of one line in either direction.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// A framing violation.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("a line exceeded {limit} bytes")]
    TooLarge { limit: usize },
    #[error("a line is not valid UTF-8")]
    InvalidUtf8,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// NDJSON framing over `LinesCodec::new_with_max_length`.
#[derive(Debug)]
pub struct NdjsonCodec {
    lines: LinesCodec,
    max: usize,
}

impl NdjsonCodec {
    pub fn new(max: usize) -> Self {
        Self {
            lines: LinesCodec::new_with_max_length(max),
            max,
        }
    }
    pub fn max_length(&self) -> usize {
        self.max
    }
}

impl Default for NdjsonCodec {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_MESSAGE_BYTES)
    }
}

fn map_err(e: LinesCodecError, limit: usize) -> FrameError {
    match e {
        LinesCodecError::MaxLineLengthExceeded => FrameError::TooLarge { limit },
        LinesCodecError::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
            FrameError::InvalidUtf8
        }
        LinesCodecError::Io(io) => FrameError::Io(io),
    }
}

impl Decoder for NdjsonCodec {
    type Item = String;
    type Error = FrameError;
    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<String>, FrameError> {
        self.lines.decode(src).map_err(|e| map_err(e, self.max))
    }
    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<String>, FrameError> {
        self.lines.decode_eof(src).map_err(|e| map_err(e, self.max))
    }
}

impl<T: AsRef<str>> Encoder<T> for NdjsonCodec {
    type Error = FrameError;
    fn encode(&mut self, line: T, dst: &mut BytesMut) -> Result<(), FrameError> {
        let line = line.as_ref();
        if line.len() > self.max {
            return Err(FrameError::TooLarge { limit: self.max });
        }
        debug_assert!(
            !line.contains('\n'),
            "compact JSON never holds a raw newline"
        );
        dst.reserve(line.len() + 1);
        dst.put(line.as_bytes());
        dst.put_u8(b'\n');
        Ok(())
    }
}

/// Escapes a sample of hostile bytes for a log line: at most `max` bytes,
/// control, format and bidi characters and non-UTF-8 escaped
/// ([`crate::text::escape_for_operator`], the one escaping function).
pub fn escaped_sample(bytes: &[u8], max: usize) -> String {
    crate::text::escape_for_operator(bytes, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_limits() {
        let mut c = NdjsonCodec::new(8);
        let mut buf = BytesMut::from(&b"{\"a\":1}\r\n"[..]);
        assert_eq!(c.decode(&mut buf).unwrap().as_deref(), Some("{\"a\":1}"));
        let mut buf = BytesMut::from(&b"123456789012"[..]);
        assert!(matches!(
            c.decode(&mut buf),
            Err(FrameError::TooLarge { limit: 8 })
        ));
        let mut c = NdjsonCodec::new(64);
        let mut buf = BytesMut::from(&b"\xff\xfe\n"[..]);
        assert!(matches!(c.decode(&mut buf), Err(FrameError::InvalidUtf8)));
    }

    #[test]
    fn encode_appends_newline_and_bounds() {
        let mut c = NdjsonCodec::new(4);
        let mut dst = BytesMut::new();
        c.encode("abc", &mut dst).unwrap();
        assert_eq!(&dst[..], b"abc\n");
        assert!(c.encode("abcdef", &mut dst).is_err());
    }

    #[test]
    fn samples_are_escaped() {
        assert_eq!(escaped_sample(b"a\x1b[31m\xff", 200), "a\\u{1b}[31m\\xff");
        assert_eq!(escaped_sample(b"abcdef", 3), "abc…");
    }
}
