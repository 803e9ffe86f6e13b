//! The frames on the channel and the errors of a peer that breaks them.
//!
//! A frame is a 7-byte header (kind, stream id as a big-endian `u32`,
//! payload length as a big-endian `u16`) and its payload:
//!
//! - `OPEN` (1, empty): the guest accepted a connection as stream `id`;
//!   ids only go up.
//! - `DATA` (2, 1..=[`MAX_DATA`] bytes): bytes of stream `id`, never more
//!   than the receiver's window ([`WINDOW`]) not yet acknowledged.
//! - `ACK` (3, a big-endian `u32`): the receiver wrote that many bytes of
//!   stream `id` on; the sender may send that many more.
//! - `CLOSE` (4, empty): the sender will send no more bytes of stream `id`
//!   (its end of the stream reached end of file or failed).

use std::io::{self, Read};

/// The header's length.
pub const HEADER: usize = 7;
/// The largest payload of a `DATA` frame.
pub const MAX_DATA: usize = 16 * 1024;
/// The bytes of one stream a sender may have in flight (sent, not yet
/// acknowledged): what a receiver holds per stream at most.
pub const WINDOW: u32 = 64 * 1024;
/// The streams open at once (the guest refuses more connections; a peer
/// that opens more breaks the protocol).
pub const MAX_STREAMS: usize = 64;

const OPEN: u8 = 1;
const DATA: u8 = 2;
const ACK: u8 = 3;
const CLOSE: u8 = 4;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Open(u32),
    Data(u32, Vec<u8>),
    Ack(u32, u32),
    Close(u32),
}

/// Why the channel ended: its own I/O, or a peer that broke the protocol.
#[derive(Debug)]
pub enum MuxError {
    Io(io::Error),
    UnknownKind(u8),
    BadLength {
        kind: u8,
        len: usize,
    },
    /// An `OPEN` the receiver does not take: on the guest's side, or an id
    /// not above every id before it.
    UnexpectedOpen(u32),
    TooManyStreams(usize),
    /// `DATA` or `CLOSE` of a stream that is not open (or was closed).
    UnknownStream(u32),
    /// `DATA` past the window.
    OverWindow {
        id: u32,
        bytes: u32,
    },
    /// An `ACK` of more than was sent.
    OverCredit(u32),
}

impl std::fmt::Display for MuxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MuxError::Io(e) => write!(f, "the channel failed: {e}"),
            MuxError::UnknownKind(k) => write!(f, "a frame of unknown kind {k}"),
            MuxError::BadLength { kind, len } => {
                write!(f, "a frame of kind {kind} with a payload of {len} bytes")
            }
            MuxError::UnexpectedOpen(id) => write!(f, "an OPEN of stream {id} out of order"),
            MuxError::TooManyStreams(n) => {
                write!(f, "more than {n} streams open at once")
            }
            MuxError::UnknownStream(id) => write!(f, "a frame of stream {id}, which is not open"),
            MuxError::OverWindow { id, bytes } => write!(
                f,
                "stream {id} sent {bytes} bytes not yet acknowledged, more than the window of {WINDOW}"
            ),
            MuxError::OverCredit(id) => {
                write!(f, "stream {id} acknowledged more bytes than were sent")
            }
        }
    }
}

impl std::error::Error for MuxError {}

impl From<io::Error> for MuxError {
    fn from(e: io::Error) -> Self {
        MuxError::Io(e)
    }
}

impl Frame {
    /// The frame's bytes, appended to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (kind, id, payload): (u8, u32, &[u8]) = match self {
            Frame::Open(id) => (OPEN, *id, &[]),
            Frame::Data(id, bytes) => (DATA, *id, bytes),
            Frame::Ack(id, _) => (ACK, *id, &[]),
            Frame::Close(id) => (CLOSE, *id, &[]),
        };
        let ack;
        let payload = match self {
            Frame::Ack(_, n) => {
                ack = n.to_be_bytes();
                &ack[..]
            }
            _ => payload,
        };
        out.push(kind);
        out.extend_from_slice(&id.to_be_bytes());
        // A DATA payload is at most MAX_DATA (the senders cut there).
        out.extend_from_slice(&(payload.len().min(MAX_DATA) as u16).to_be_bytes());
        out.extend_from_slice(&payload[..payload.len().min(MAX_DATA)]);
    }
}

/// The next frame of `r`; `None` at end of file between frames. A header
/// or payload the protocol does not allow is an error before its payload
/// is read (nothing larger than [`MAX_DATA`] is ever buffered).
pub fn read_frame(r: &mut impl Read) -> Result<Option<Frame>, MuxError> {
    let mut head = [0u8; HEADER];
    let n = loop {
        match r.read(&mut head[..1]) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    if n == 0 {
        return Ok(None);
    }
    r.read_exact(&mut head[1..])?;
    let kind = head[0];
    let id = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    let len = usize::from(u16::from_be_bytes([head[5], head[6]]));
    let fits = match kind {
        OPEN | CLOSE => len == 0,
        ACK => len == 4,
        DATA => (1..=MAX_DATA).contains(&len),
        other => return Err(MuxError::UnknownKind(other)),
    };
    if !fits {
        return Err(MuxError::BadLength { kind, len });
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some(match kind {
        OPEN => Frame::Open(id),
        CLOSE => Frame::Close(id),
        ACK => Frame::Ack(
            id,
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]),
        ),
        _ => Frame::Data(id, payload),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_as_written() {
        let frames = [
            Frame::Open(7),
            Frame::Data(7, b"hello".to_vec()),
            Frame::Ack(7, 5),
            Frame::Close(7),
        ];
        let mut bytes = Vec::new();
        for f in &frames {
            f.encode(&mut bytes);
        }
        let mut r = &bytes[..];
        for f in &frames {
            assert_eq!(read_frame(&mut r).unwrap().as_ref(), Some(f));
        }
        assert!(read_frame(&mut r).unwrap().is_none());
    }

    #[test]
    fn a_header_the_protocol_does_not_allow_is_refused_before_its_payload() {
        let refused = |bytes: &[u8]| read_frame(&mut &bytes[..]).unwrap_err().to_string();
        assert!(refused(&[9, 0, 0, 0, 1, 0, 0]).contains("unknown kind 9"));
        // A DATA header announcing 65535 bytes: refused, nothing read.
        assert!(refused(&[2, 0, 0, 0, 1, 0xff, 0xff]).contains("65535 bytes"));
        assert!(refused(&[2, 0, 0, 0, 1, 0, 0]).contains("0 bytes"));
        assert!(refused(&[1, 0, 0, 0, 1, 0, 1, 0]).contains("kind 1"));
        // Cut inside a frame: an I/O error, not a frame.
        assert!(refused(&[2, 0, 0, 0, 1, 0, 4, b'a']).contains("channel failed"));
    }
}
