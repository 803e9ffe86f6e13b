//! The reader's framing: NDJSON lines of at most `max` bytes, valid
//! UTF-8, read straight into one buffer and handed out borrowed from it.
//!
//! The rules are `tokio_util`'s `LinesCodec` with a maximum length, as
//! [`sharedos_protocol::NdjsonCodec`] applies them (a trailing `\r` is
//! dropped, the last line may lack its `\n`, a line over the limit is an
//! error): the same lines and the same errors. What differs is the cost:
//! a line is classified where it lies in the buffer (no `String` per
//! line), and the first bytes of a line are kept for a violation's sample
//! only when there is a violation.

use std::future::Future;
use std::pin::Pin;

use sharedos_protocol::FrameError;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::bytes::{Buf, BytesMut};

use crate::violation::SAMPLE_BYTES;

/// The other end's output, as the reader holds it.
pub(crate) type BoxRead = Pin<Box<dyn AsyncRead + Send>>;

/// How much the buffer grows by when a read needs room.
const READ_CHUNK: usize = 8 << 10;

/// The lines of the other end's output.
pub(crate) struct Lines {
    reader: BoxRead,
    buf: BytesMut,
    max: usize,
    /// Where the search for the next `\n` resumes.
    next_index: usize,
    /// Skipping the rest of a line over the limit (after its error).
    discarding: bool,
    eof: bool,
    /// The bytes of the line handed out last, dropped on the next call.
    handed: usize,
    /// The first bytes of the line that broke the framing.
    pub(crate) sample: Vec<u8>,
}

/// Where the next line lies at the front of the buffer.
struct Frame {
    /// Its length, without `\n` and a trailing `\r`.
    len: usize,
    /// What it takes from the buffer, `\n` included.
    taken: usize,
}

impl Lines {
    pub(crate) fn new(reader: BoxRead, max: usize) -> Self {
        Self {
            reader,
            buf: BytesMut::with_capacity(READ_CHUNK),
            max,
            next_index: 0,
            discarding: false,
            eof: false,
            handed: 0,
            sample: Vec::new(),
        }
    }

    /// Waits for the next line; `None` at the end of the input. The line
    /// stays in the buffer until the next call. Cancel-safe: what was
    /// read stays in the buffer, and a line is taken from it only when the
    /// next one is asked for.
    pub(crate) async fn next(&mut self) -> Option<Result<&str, FrameError>> {
        self.buf.advance(std::mem::take(&mut self.handed));
        loop {
            let found = if self.eof {
                self.decode_eof()
            } else {
                self.decode()
            };
            match found {
                Ok(Some(frame)) => {
                    // Taken from the buffer on the next call, valid or not.
                    self.handed = frame.taken;
                    // Checked here, once: the line is handed out as the
                    // `&str` the check gives.
                    return Some(match std::str::from_utf8(&self.buf[..frame.len]) {
                        Ok(line) => Ok(line),
                        Err(_) => {
                            keep_sample(&self.buf, &mut self.sample);
                            Err(FrameError::InvalidUtf8)
                        }
                    });
                }
                Err(e) => return Some(Err(e)),
                Ok(None) if self.eof => return None,
                Ok(None) => {}
            }
            self.buf.reserve(READ_CHUNK);
            match self.reader.read_buf(&mut self.buf).await {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) => return Some(Err(FrameError::Io(e))),
            }
        }
    }

    /// A complete line at the front of the buffer, as `LinesCodec::decode`.
    fn decode(&mut self) -> Result<Option<Frame>, FrameError> {
        loop {
            let read_to = self.max.saturating_add(1).min(self.buf.len());
            let newline = find_newline(&self.buf[self.next_index..read_to]);
            match (self.discarding, newline) {
                (true, Some(offset)) => {
                    self.buf.advance(offset + self.next_index + 1);
                    self.discarding = false;
                    self.next_index = 0;
                }
                (true, None) => {
                    self.buf.advance(read_to);
                    self.next_index = 0;
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                }
                (false, Some(offset)) => {
                    let at = offset + self.next_index;
                    self.next_index = 0;
                    return Ok(Some(self.frame(at, at + 1)));
                }
                (false, None) if self.buf.len() > self.max => {
                    self.keep_sample();
                    self.discarding = true;
                    return Err(FrameError::TooLarge { limit: self.max });
                }
                (false, None) => {
                    self.next_index = read_to;
                    return Ok(None);
                }
            }
        }
    }

    /// As `LinesCodec::decode_eof`: the last line may lack its `\n`.
    fn decode_eof(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(frame) = self.decode()? {
            return Ok(Some(frame));
        }
        self.next_index = 0;
        if self.buf.is_empty() || self.buf[..] == b"\r"[..] {
            return Ok(None);
        }
        let all = self.buf.len();
        Ok(Some(self.frame(all, all)))
    }

    /// The line of `end` bytes (its `\r` dropped), `taken` bytes in all.
    /// Whether it is UTF-8 is checked when it is handed out.
    fn frame(&self, end: usize, taken: usize) -> Frame {
        let len = if self.buf[..end].ends_with(b"\r") {
            end - 1
        } else {
            end
        };
        Frame { len, taken }
    }

    fn keep_sample(&mut self) {
        keep_sample(&self.buf, &mut self.sample);
    }
}

/// What the reader makes of `chunks`, each arriving as one read, with
/// lines of at most `max` bytes: every line, up to and with the first
/// error, where the peer stops reading. The reader's face for a check
/// against [`sharedos_protocol::NdjsonCodec`] on the same bytes (the fuzz
/// target `frame_lines`): the same list, as `frame/tests.rs` holds it over
/// generated streams.
pub fn read_lines(chunks: &[&[u8]], max: usize) -> Vec<Result<String, FrameError>> {
    /// Hands out one chunk a read; never pending.
    struct Chunks(std::collections::VecDeque<Vec<u8>>);
    impl AsyncRead for Chunks {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if let Some(chunk) = self.0.pop_front() {
                buf.put_slice(&chunk);
            }
            std::task::Poll::Ready(Ok(()))
        }
    }
    let chunks = chunks.iter().map(|c| c.to_vec()).collect();
    let mut lines = Lines::new(Box::pin(Chunks(chunks)), max);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut out = Vec::new();
    loop {
        // The reads are never pending, so one poll settles each line.
        let next = match std::pin::pin!(lines.next()).poll(&mut cx) {
            std::task::Poll::Ready(next) => next.map(|r| r.map(str::to_owned)),
            std::task::Poll::Pending => None,
        };
        match next {
            Some(Ok(line)) => out.push(Ok(line)),
            Some(Err(e)) => {
                out.push(Err(e));
                return out;
            }
            None => return out,
        }
    }
}

/// The first bytes of the line at the front of `buf`, up to its `\n`:
/// what a framing violation shows.
fn keep_sample(buf: &[u8], sample: &mut Vec<u8>) {
    let head = &buf[..buf.len().min(SAMPLE_BYTES + 1)];
    let line = head
        .iter()
        .position(|b| *b == b'\n')
        .map_or(head, |nl| &head[..nl]);
    sample.clear();
    sample.extend_from_slice(line);
}

/// The index of the first `\n` in `bytes`, eight bytes at a time while
/// there is none (a JSON line is mostly long runs without one).
fn find_newline(bytes: &[u8]) -> Option<usize> {
    sharedos_protocol::json::find_byte(bytes, b'\n')
}

#[cfg(test)]
mod tests;
