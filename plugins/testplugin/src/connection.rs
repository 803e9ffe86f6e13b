//! The raw NDJSON connection to the host: what the testplugin binary
//! writes and reads, including the control notifications it reacts to.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Stdin, Stdout, Write};
use std::time::Duration;

use serde_json::{Map, Value, json};

pub struct Plugin {
    pub input: BufReader<Stdin>,
    pub out: Stdout,
    pub turn_id: Value,
    pub run_id: Value,
    pub next_id: u64,
    pub ignore_abort: bool,
    pub draining: bool,
    /// A `turn/abort` arrived while it was ignored.
    pub aborted: bool,
    pub outcome_sent: bool,
    pub results: Vec<Value>,
    /// What the shared steps measured (`callNs`, ...), merged into the
    /// turn's output.
    pub reports: Map<String, Value>,
    /// The trace id put on tool calls: `trace-testplugin`, or the turn's
    /// own when the payload says `"traceFromTurn": true`.
    pub trace: Value,
}

impl Plugin {
    pub fn write_raw(&mut self, bytes: &[u8]) {
        // A closed stdout means the host is gone: nothing left to do.
        if self
            .out
            .write_all(bytes)
            .and_then(|()| self.out.flush())
            .is_err()
        {
            std::process::exit(0);
        }
    }

    pub fn send(&mut self, v: &Value) {
        let mut line = v.to_string();
        line.push('\n');
        self.write_raw(line.as_bytes());
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc":"2.0","method":method,"params":params}));
    }

    /// Reads one host message; handles the control notifications. Exits
    /// on EOF.
    pub fn read(&mut self) -> Value {
        loop {
            if let Some(msg) = self.read_one() {
                return msg;
            }
        }
    }

    /// Reads one line: the message, or `None` for a control notification
    /// (handled here) or a line that is not JSON. Exits on EOF.
    pub fn read_one(&mut self) -> Option<Value> {
        let mut line = String::new();
        self.read_line_into(&mut line);
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            eprintln!("testplugin: host sent a non-JSON line");
            return None;
        };
        match msg.get("method").and_then(Value::as_str) {
            Some(method) if self.control(method) => None,
            _ => Some(msg),
        }
    }

    /// Reads one line into `line` (cleared first). Exits on EOF.
    pub fn read_line_into(&mut self, line: &mut String) {
        line.clear();
        match self.input.read_line(line) {
            Ok(0) | Err(_) => std::process::exit(0),
            Ok(_) => {}
        }
    }

    /// Acts on a control notification (`turn/abort`, `turn/draining`);
    /// whether `method` was one.
    pub fn control(&mut self, method: &str) -> bool {
        if matches!(method, "turn/abort" | "turn/draining") {
            log_signal(method);
        }
        match method {
            "turn/abort" if !self.ignore_abort => {
                eprintln!("testplugin: aborted, exiting");
                std::process::exit(0);
            }
            "turn/abort" => {
                eprintln!("testplugin: ignoring turn/abort");
                self.aborted = true;
            }
            "turn/draining" => self.draining = true,
            _ => return false,
        }
        true
    }

    /// Sends `host/invokeTool` and waits for its answer.
    pub fn call(&mut self, tool: &str, arguments: Value, step: Option<u64>) -> Value {
        self.call_as(None, tool, arguments, step)
    }

    /// The same with the call's own id (`call-<request id>` without).
    pub fn call_as(
        &mut self,
        call_id: Option<&str>,
        tool: &str,
        arguments: Value,
        step: Option<u64>,
    ) -> Value {
        let id = self.request_call_as(call_id, tool, arguments, step);
        loop {
            let msg = self.read();
            if msg.get("id") == Some(&json!(id)) {
                return msg;
            }
        }
    }

    pub fn request_call(&mut self, tool: &str, arguments: Value, step: Option<u64>) -> u64 {
        self.request_call_as(None, tool, arguments, step)
    }

    /// Sends `host/invokeTool` without waiting; its request id.
    pub fn request_call_as(
        &mut self,
        call_id: Option<&str>,
        tool: &str,
        arguments: Value,
        step: Option<u64>,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let call_id = call_id.map_or_else(|| format!("call-{id}"), str::to_owned);
        let mut params = json!({
            "turnId": self.turn_id,
            "call": {"id": call_id, "tool": tool, "arguments": arguments,
                     "traceId": self.trace, "requestedAt": "2026-01-01T00:00:00Z"}
        });
        if let Some(s) = step {
            params["step"] = json!(s);
        }
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":"host/invokeTool","params":params}));
        id
    }

    /// Whether a whole line from the host is already buffered (reading it
    /// needs no system call).
    pub fn line_buffered(&self) -> bool {
        self.input.buffer().contains(&b'\n')
    }

    pub fn outcome(&mut self, result: Value) {
        let run_id = self.run_id.clone();
        self.send(&json!({"jsonrpc":"2.0","id":run_id,"result":result}));
        self.outcome_sent = true;
    }
}

/// Appends `<method> <unix ms>` to `$SHAREDOS_TEST_SIGNAL_LOG`, if set.
pub fn log_signal(method: &str) {
    let Some(path) = std::env::var_os("SHAREDOS_TEST_SIGNAL_LOG") else {
        return;
    };
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{method} {ms}");
    }
}

/// `hold`: keeps reading (and ignoring) host messages; at stdin EOF it
/// sleeps forever.
pub fn hold(p: &mut Plugin) -> ! {
    loop {
        let mut line = String::new();
        match p.input.read_line(&mut line) {
            Ok(0) | Err(_) => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            Ok(_) => {
                let msg = serde_json::from_str::<Value>(&line).unwrap_or(Value::Null);
                if let Some(m @ ("turn/abort" | "turn/draining")) =
                    msg.get("method").and_then(Value::as_str)
                {
                    log_signal(m);
                }
                match msg.get("method").and_then(Value::as_str) {
                    Some("turn/abort") if !p.ignore_abort => std::process::exit(0),
                    Some("turn/abort") => eprintln!("testplugin: ignoring turn/abort"),
                    Some("turn/draining") => {
                        p.draining = true;
                        drain_busy();
                    }
                    _ => {}
                }
            }
        }
    }
}

/// With `SHAREDOS_TEST_DRAIN_BUSY_MS=<ms>`, keeps a CPU busy for that
/// long after `turn/draining` before reading on: a plugin still working,
/// or not yet scheduled on a loaded machine, when the `turn/abort` comes.
fn drain_busy() {
    if let Some(ms) = std::env::var("SHAREDOS_TEST_DRAIN_BUSY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let until = std::time::Instant::now() + Duration::from_millis(ms);
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}
