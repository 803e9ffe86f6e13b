//! Draining a plugin's stderr into `tracing`: always read (the plugin
//! never blocks on it), lines capped and escaped (log injection, terminal
//! escapes), prefixed with the runtime and turn ids, a byte budget per turn
//! after which lines are read and dropped (protocol.md D #45, #46).

use futures_util::StreamExt;
use sharedos_protocol::codec::escaped_sample;
use tokio::io::AsyncRead;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

/// Limits of the stderr drain.
#[derive(Debug, Clone, Copy)]
pub struct StderrLimits {
    /// One logged line, in bytes (longer ones are cut with a marker).
    pub line_bytes: usize,
    /// Bytes logged per turn; the rest is read and dropped.
    pub budget_bytes: u64,
    /// Bytes logged per second (a token bucket with one second of burst);
    /// lines over the rate are read and dropped.
    pub rate_bytes_per_sec: u64,
}

impl Default for StderrLimits {
    fn default() -> Self {
        Self {
            line_bytes: 64 << 10,
            budget_bytes: 16 << 20,
            rate_bytes_per_sec: 1 << 20,
        }
    }
}

/// One line of the drain: the plugin's (escaped before it is logged) or
/// the host's own note about it.
enum Line {
    Plugin(String),
    Host(&'static str),
}

/// The last lines a plugin wrote on stderr, escaped and bounded: what a
/// result says about a plugin that died (`metadata.runtime.process`).
#[derive(Debug, Default)]
pub struct StderrTail {
    /// Raw (cut to `TAIL_LINE_BYTES`): escaped only when read, so a flood
    /// costs a copy per line, never an escape.
    lines: std::collections::VecDeque<Vec<u8>>,
}

/// Lines kept in a [`StderrTail`], and bytes of one kept line.
pub const TAIL_LINES: usize = 20;
pub const TAIL_LINE_BYTES: usize = 512;

impl StderrTail {
    fn push(&mut self, line: &[u8]) {
        if self.lines.len() == TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines
            .push_back(line[..line.len().min(TAIL_LINE_BYTES + 1)].to_vec());
    }

    /// The kept lines, oldest first, escaped and cut.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .iter()
            .map(|l| escaped_sample(l, TAIL_LINE_BYTES))
            .collect()
    }
}

/// A tail shared between the drain and whoever reports the turn.
pub type SharedTail = std::sync::Arc<std::sync::Mutex<StderrTail>>;

/// Reads `stderr` to EOF, logging within the limits.
pub async fn drain_stderr<R: AsyncRead + Unpin>(
    stderr: R,
    runtime: String,
    turn: String,
    limits: StderrLimits,
) {
    drain_stderr_with_tail(stderr, runtime, turn, limits, SharedTail::default()).await
}

/// [`drain_stderr`], keeping every line read (logged or not) in `tail`.
pub async fn drain_stderr_with_tail<R: AsyncRead + Unpin>(
    stderr: R,
    runtime: String,
    turn: String,
    limits: StderrLimits,
    tail: SharedTail,
) {
    let mut framed = FramedRead::new(stderr, LinesCodec::new_with_max_length(limits.line_bytes));
    let mut used: u64 = 0;
    let mut exhausted = false;
    let mut after_error = false;
    let rate = limits.rate_bytes_per_sec as f64;
    let mut tokens = rate;
    let mut last = std::time::Instant::now();
    let mut rate_dropped: u64 = 0;
    loop {
        let next = framed.next().await;
        let was_error = std::mem::replace(&mut after_error, matches!(next, Some(Err(_))));
        // Escaped only once it is known to be logged: a flood past the
        // budget or the rate costs a read, never an escape.
        let (text, cost) = match next {
            Some(Ok(line)) => {
                tail.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(line.as_bytes());
                let cost = line.len() as u64 + 1;
                (Line::Plugin(line), cost)
            }
            Some(Err(LinesCodecError::MaxLineLengthExceeded)) => (
                Line::Host("[line longer than the stderr line limit, truncated]"),
                limits.line_bytes as u64,
            ),
            Some(Err(LinesCodecError::Io(e))) if e.kind() == std::io::ErrorKind::InvalidData => {
                (Line::Host("[a line that is not UTF-8, dropped]"), 64)
            }
            Some(Err(LinesCodecError::Io(_))) => return,
            // After a decoder error `FramedRead` yields `None` once, then
            // resumes (tokio #3976); a `None` right after an error is not EOF.
            None if was_error => continue,
            None => return,
        };
        used = used.saturating_add(cost);
        if used > limits.budget_bytes {
            if !exhausted {
                exhausted = true;
                tracing::warn!(
                    target: "sharedos::plugin",
                    runtime = %runtime,
                    turn = %turn,
                    "stderr budget of {} bytes exhausted; further output is dropped",
                    limits.budget_bytes
                );
            }
            continue;
        }
        let now = std::time::Instant::now();
        tokens = (tokens + now.duration_since(last).as_secs_f64() * rate).min(rate);
        last = now;
        if (cost as f64) > tokens {
            if rate_dropped == 0 {
                tracing::warn!(
                    target: "sharedos::plugin",
                    runtime = %runtime,
                    turn = %turn,
                    "stderr faster than {} bytes/s; lines are dropped",
                    limits.rate_bytes_per_sec
                );
            }
            rate_dropped = rate_dropped.saturating_add(cost);
            continue;
        }
        tokens -= cost as f64;
        let text = match text {
            Line::Plugin(line) => escaped_sample(line.as_bytes(), limits.line_bytes),
            Line::Host(note) => note.to_owned(),
        };
        tracing::info!(target: "sharedos::plugin", runtime = %runtime, turn = %turn, "{text}");
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tokio::io::AsyncWriteExt;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn stderr_is_drained_escaped_capped_and_budgeted() {
        let captured = Captured::default();
        let sink = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let (mut w, r) = tokio::io::duplex(1024);
        let limits = StderrLimits {
            line_bytes: 64,
            budget_bytes: 4096,
            rate_bytes_per_sec: 1 << 20,
        };
        let drain = tokio::spawn(drain_stderr(r, "rt-1".into(), "t-9".into(), limits));
        w.write_all(b"hello\n\x1b[31m[ERROR] host: forged\n")
            .await
            .unwrap();
        w.write_all(&[b'x'; 200]).await.unwrap();
        w.write_all(b"\nafter the long line\n\xff\xfe\nafter invalid utf8\n")
            .await
            .unwrap();
        // Far past the budget: still read to the end, never blocking.
        for _ in 0..200 {
            w.write_all(&[b'y'; 63]).await.unwrap();
            w.write_all(b"\n").await.unwrap();
        }
        drop(w);
        tokio::time::timeout(std::time::Duration::from_secs(5), drain)
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains("runtime=rt-1") && text.contains("turn=t-9"),
            "{text}"
        );
        assert!(text.contains("hello"));
        assert!(
            text.contains("\\u{1b}[31m[ERROR] host: forged"),
            "escape sequences are escaped: {text}"
        );
        assert!(!text.contains('\x1b'));
        assert!(text.contains("truncated"));
        assert!(text.contains("after the long line"));
        assert!(text.contains("not UTF-8"));
        assert!(text.contains("after invalid utf8"));
        assert!(text.contains("budget of 4096 bytes exhausted"));
        assert!(
            text.matches(&"y".repeat(63)).count() < 100,
            "output past the budget is dropped"
        );
    }
}

#[cfg(test)]
mod rate_tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn stderr_over_the_rate_is_dropped() {
        let captured = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || SinkWriter(sink.clone()))
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let (mut w, r) = tokio::io::duplex(1024);
        let limits = StderrLimits {
            line_bytes: 1024,
            budget_bytes: 1 << 20,
            rate_bytes_per_sec: 100,
        };
        let drain = tokio::spawn(drain_stderr(r, "rt".into(), "t".into(), limits));
        for i in 0..10 {
            w.write_all(format!("line-{i}-{}\n", "z".repeat(40)).as_bytes())
                .await
                .unwrap();
        }
        drop(w);
        drain.await.unwrap();
        let text = String::from_utf8(captured.lock().unwrap().clone()).unwrap();
        assert!(text.contains("line-0-"));
        assert!(!text.contains("line-9-"), "{text}");
        assert!(text.contains("faster than 100 bytes/s"));
    }

    struct SinkWriter(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for SinkWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
