//! One launch of the plugin under test, spoken to line by line: a reader
//! thread per output stream, blocking sends, and a tree killed on drop.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::ExitStatus;
use std::rc::Rc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sharedos_protocol::text::escape_for_operator;

use sharedos_host::process::{LaunchSpec, LaunchedChild, Launcher, ProcessTree};

/// What the plugin wrote on stdout, one line at a time.
#[derive(Debug)]
pub enum Line {
    /// A JSON-RPC 2.0 object, and the length of its line in bytes.
    Message(Value),
    /// A line the host would end the turn over, and why.
    Invalid(String),
    /// End of stdout.
    Eof,
}

/// What `recv` saw.
#[derive(Debug)]
pub enum Recv {
    Message(Value),
    Invalid(String),
    Eof,
    Timeout,
}

/// The last lines of the plugin's stderr and how much it wrote.
#[derive(Debug, Default)]
pub struct StderrLog {
    pub bytes: usize,
    pub last: Vec<String>,
    /// The reader saw the end of the pipe: nothing more will come.
    pub ended: bool,
}

use sharedos_host::limits::MAX_CONFORMANCE_READ_LINE as MAX_READ_LINE;
/// The stderr lines kept for a report, and the most bytes of one line.
pub(super) const KEPT_STDERR_LINES: usize = 20;
const STDERR_LINE_BYTES: usize = 4096;

pub struct Session {
    tree: Box<dyn ProcessTree>,
    stdin: Option<File>,
    lines: Receiver<Line>,
    pub stderr: Arc<Mutex<StderrLog>>,
    pub sandbox_report: Option<Value>,
    exited: Option<ExitStatus>,
    /// Where the processes that outlive this launch are counted.
    leftovers: Rc<Cell<usize>>,
    /// Where the stderr tail is left when the launch ends.
    last_stderr: Rc<RefCell<Vec<String>>>,
}

impl Session {
    pub fn launch(
        launcher: &dyn Launcher,
        spec: &LaunchSpec,
        leftovers: &Rc<Cell<usize>>,
        last_stderr: &Rc<RefCell<Vec<String>>>,
    ) -> Result<Self, String> {
        let LaunchedChild {
            stdin,
            stdout,
            stderr,
            tree,
            report,
            ..
        } = launcher.launch(spec).map_err(|e| e.to_string())?;
        let (tx, lines) = mpsc::channel();
        let out = File::from(stdout);
        std::thread::spawn(move || read_stdout(out, tx));
        let log = Arc::new(Mutex::new(StderrLog::default()));
        let sink = log.clone();
        let err = File::from(stderr);
        std::thread::spawn(move || read_stderr(err, sink));
        Ok(Self {
            tree,
            stdin: Some(File::from(stdin)),
            lines,
            stderr: log,
            sandbox_report: report,
            exited: None,
            leftovers: leftovers.clone(),
            last_stderr: last_stderr.clone(),
        })
    }

    /// Writes one message; an error means the plugin closed its stdin.
    pub fn send(&mut self, message: &Value) -> Result<(), String> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err("stdin is already closed".into());
        };
        let mut line = message.to_string();
        line.push('\n');
        stdin
            .write_all(line.as_bytes())
            .map_err(|e| format!("cannot write to the plugin's stdin: {e}"))
    }

    pub fn recv(&self, timeout: Duration) -> Recv {
        match self.lines.recv_timeout(timeout) {
            Ok(Line::Message(v)) => Recv::Message(v),
            Ok(Line::Invalid(why)) => Recv::Invalid(why),
            Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => Recv::Eof,
            Err(RecvTimeoutError::Timeout) => Recv::Timeout,
        }
    }

    /// Waits up to `timeout` for the launched process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        loop {
            if self.exited.is_none() {
                self.exited = self.tree.try_wait().ok().flatten();
            }
            if self.exited.is_some() || Instant::now() >= end {
                return self.exited;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The launched process has exited, or its stdout has ended (the
    /// program is going or gone).
    pub fn has_ended(&mut self) -> bool {
        self.wait_exit(Duration::from_millis(500)).is_some()
    }

    /// Waits up to `timeout` for the stderr reader to reach the end of the
    /// pipe, so a line written just before exit is in the tail: the reader
    /// is a thread of its own and may lag behind the exit under load.
    pub fn wait_stderr_end(&self, timeout: Duration) {
        let end = Instant::now() + timeout;
        while Instant::now() < end && !self.stderr.lock().unwrap_or_else(|p| p.into_inner()).ended {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The last stderr lines, for a report.
    pub fn stderr_tail(&self) -> String {
        let log = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        if log.last.is_empty() {
            return "(nothing on stderr)".into();
        }
        log.last.join(" | ")
    }

    /// The kept stderr lines, whole and escaped.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last
            .clone()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.tree.kill_tree();
        // The tree is gone, so the pipe ends at once; the bound only
        // covers a reader slowed by load.
        self.wait_stderr_end(Duration::from_secs(1));
        *self.last_stderr.borrow_mut() = self.stderr_lines();
        let left = super::sweep::sweep();
        self.leftovers.set(self.leftovers.get() + left);
    }
}

fn read_stdout(out: File, tx: mpsc::Sender<Line>) {
    let mut reader = BufReader::with_capacity(1 << 16, out);
    loop {
        let mut buf = Vec::new();
        let n = match (&mut reader)
            .take(MAX_READ_LINE)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let line = classify(&buf[..n]);
        if tx.send(line).is_err() {
            return;
        }
    }
    let _ = tx.send(Line::Eof);
}

/// The checks the host's reader makes on a line (docs/PROTOCOL.md, 2-3).
fn classify(raw: &[u8]) -> Line {
    let body = raw.strip_suffix(b"\n").unwrap_or(raw);
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    let shown = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
    let Ok(text) = std::str::from_utf8(body) else {
        return Line::Invalid(format!("a line that is not UTF-8: {shown:?}"));
    };
    // The host's own classifier: its id rules, no batches, no null id.
    if let Err(e) = sharedos_protocol::jsonrpc::classify(text) {
        return Line::Invalid(format!(
            "a line the host refuses, {e} ({}): {shown:?}",
            e.reason()
        ));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.get("jsonrpc") == Some(&Value::from("2.0")) && v.is_object() => Line::Message(v),
        Ok(_) => Line::Invalid(format!("JSON that is not a JSON-RPC 2.0 object: {shown:?}")),
        Err(_) => Line::Invalid(format!("a line that is not JSON: {shown:?}")),
    }
}

fn read_stderr(err: File, log: Arc<Mutex<StderrLog>>) {
    let mut reader = BufReader::new(err);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match (&mut reader).take(1 << 20).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => {
                log.lock().unwrap_or_else(|p| p.into_inner()).ended = true;
                return;
            }
            Ok(n) => {
                let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
                l.bytes += n;
                let text = stderr_line(&buf);
                if !text.is_empty() {
                    l.last.push(text);
                    if l.last.len() > KEPT_STDERR_LINES {
                        l.last.remove(0);
                    }
                }
            }
        }
    }
}

/// One stderr line for a report: whole up to 4 KiB (then `…`), control
/// characters and bytes that are not UTF-8 escaped.
fn stderr_line(raw: &[u8]) -> String {
    let body = raw.strip_suffix(b"\n").unwrap_or(raw);
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    escape_for_operator(body, STDERR_LINE_BYTES)
        .trim_end()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scripted turns read lines with the host's classifier: what the
    /// real host refuses is refused here too, with its reason.
    #[test]
    fn a_line_the_host_refuses_is_invalid_with_its_reason() {
        let refused = [
            (
                r#"{"jsonrpc":"2.0","id":null,"method":"host/invokeTool","params":{}}"#,
                "invalid_envelope",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"host/invokeTool","params":{}}"#,
                "invalid_envelope",
            ),
            (
                r#"[{"jsonrpc":"2.0","method":"host/emit"}]"#,
                "batch_not_supported",
            ),
            ("not json", "invalid_json"),
        ];
        for (line, reason) in refused {
            match classify(line.as_bytes()) {
                Line::Invalid(why) => assert!(why.contains(reason), "{line}: {why}"),
                other => panic!("{line} was accepted: {other:?}"),
            }
        }
        let ok = r#"{"jsonrpc":"2.0","id":7,"method":"host/invokeTool","params":{}}"#;
        assert!(matches!(classify(ok.as_bytes()), Line::Message(..)));
    }

    #[test]
    fn a_stderr_line_is_whole_and_escaped() {
        let long = "x".repeat(STDERR_LINE_BYTES + 10);
        let line = stderr_line(format!("{long}\n").as_bytes());
        assert!(
            line.starts_with(&"x".repeat(STDERR_LINE_BYTES)) && line.ends_with('…'),
            "{line}"
        );
        let line = stderr_line(b"bad \x1b[31m \xff end\r\n");
        assert!(!line.contains('\u{1b}') && line.contains("end"), "{line}");
    }
}
