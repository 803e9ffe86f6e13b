//! `--only durable`: the durable path measured from outside, through a
//! real `sharedos run` (the product binary next to this one) with its
//! `fsync`'d JSONL audit trail, the test plugin issuing `files.read` calls
//! one after the other and 64 in flight, direct and in the full sandbox.
//!
//! Per run it reports calls/s and per-call latency (the plugin's own
//! clock, in its outcome), the host process's CPU per call (utime + stime
//! of `/proc/<host>/stat`, read while the plugin sleeps before and after
//! its calls), and records per `fsync`: the JSONL sink counts the records
//! and the commits (one `write` and one `fsync` each) it made, and
//! `sharedos run` logs both at the end of the turn (`SHAREDOS_LOG=
//! sharedos::audit=debug`), over the whole run. In the same run it measures the
//! physical floor: a bare append + `fsync` on the same disk, and the
//! ceiling it sets for 64 calls in flight, each needing two syncs one
//! after the other (its decision before the read, its outcome before the
//! answer): 64 calls per two sync latencies.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const AGENT: &str = "bench-agent";
const NAMESPACE: &str = "bench";
/// The file every call reads (256 bytes).
const DATA_FILE: &str = "data.txt";
/// The goals of issue 31 for 64 calls in flight and the CPU per call.
const GOAL_CALLS_PER_S: f64 = 50_000.0;
const GOAL_CPU_US: f64 = 20.0;
/// How long the plugin sleeps before its calls (the host is idle then:
/// the CPU before the calls is read in it) and after them.
const SLEEP_BEFORE_MS: u64 = 600;
const SLEEP_AFTER_MS: u64 = 800;

/// How the calls are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One call after the other (`timed_calls`).
    Sequential,
    /// `n` calls, this many unanswered at a time (`parallel_calls`).
    InFlight(u64),
}

/// What one `sharedos run` measured.
#[derive(Debug, Clone)]
pub struct DurableRun {
    pub launcher: &'static str,
    pub shape: Shape,
    pub calls: u64,
    /// The plugin's clock: all its calls.
    pub wall: Duration,
    /// Sequential only: each call's latency, sorted.
    pub latencies_ns: Vec<u64>,
    /// The host process's utime + stime over the calls.
    pub host_cpu: Duration,
    /// Audit records and commits (one `fsync` each) over the whole run.
    pub records: u64,
    pub syncs: u64,
}

impl DurableRun {
    pub fn calls_per_s(&self) -> f64 {
        self.calls as f64 / self.wall.as_secs_f64().max(1e-9)
    }
    pub fn cpu_us_per_call(&self) -> f64 {
        self.host_cpu.as_secs_f64() * 1e6 / self.calls.max(1) as f64
    }
    pub fn records_per_sync(&self) -> f64 {
        self.records as f64 / self.syncs.max(1) as f64
    }
    /// The `q` quantile of the sequential latencies, in µs.
    pub fn latency_us(&self, q: f64) -> f64 {
        let n = self.latencies_ns.len();
        if n == 0 {
            return self.wall.as_secs_f64() * 1e6 / self.calls.max(1) as f64;
        }
        let i = ((n as f64 - 1.0) * q).round() as usize;
        self.latencies_ns.get(i).copied().unwrap_or_default() as f64 / 1e3
    }
}

/// The binaries a run needs: `sharedos` and `sharedos-testplugin`, next to
/// `exe`.
fn sibling(exe: &Path, name: &str) -> Result<PathBuf, String> {
    let path = exe
        .parent()
        .map(|d| d.join(name))
        .ok_or_else(|| format!("{} has no directory", exe.display()))?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing (build it: cargo build --release -p sharedos-cli -p sharedos-testplugin)",
            path.display()
        ))
    }
}

fn host_toml(testplugin: &Path, launcher: &str) -> String {
    format!(
        r#"[host]
defaultTimeoutMs = 600000
defaultMaxSteps = 64
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "sharedos-testplugin"
version = "0.1.0"
program = "{program}"
args = ["normal"]
launcher = "{launcher}"

[[agents]]
agentId = "{AGENT}"
runtime = "sharedos-testplugin"

[[kernel.grants]]
id = "bench-admission"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "bench-host" }}
namespaceId = "{NAMESPACE}"
[[kernel.grants.capabilities]]
namespace = "sharedos.execution"
path = ["agent", "{AGENT}"]
scope = "exact"
actions = ["invoke"]

[[kernel.grants]]
id = "bench-files"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "bench-host" }}
namespaceId = "{NAMESPACE}"
[[kernel.grants.capabilities]]
namespace = "files"
path = ["{AGENT}"]
scope = "descendants"
actions = ["read"]
"#,
        program = testplugin.display(),
    )
}

/// The turn: a sleep, the calls, a sleep.
fn request(shape: Shape, calls: u64) -> Value {
    let agent = json!({"kind": "agent", "agentId": AGENT});
    let purpose = "Measure the durable path";
    let arguments = json!({"path": DATA_FILE});
    let step = match shape {
        Shape::Sequential => {
            json!({"op": "timed_calls", "tool": "files.read", "n": calls, "arguments": arguments})
        }
        Shape::InFlight(k) => json!({"op": "parallel_calls", "tool": "files.read", "n": calls,
            "inflight": k, "arguments": arguments}),
    };
    let script = json!([
        {"op": "sleep", "ms": SLEEP_BEFORE_MS},
        step,
        {"op": "sleep", "ms": SLEEP_AFTER_MS},
    ]);
    json!({
        "version": "1",
        "executionId": "durable-bench",
        "agent": agent,
        "context": {
            "namespaceId": NAMESPACE,
            "actor": agent,
            "authority": {"kind": "service", "serviceId": "bench-host"},
            "owner": {"kind": "human", "userId": "operator"},
            "purpose": purpose,
            "traceId": "trace-durable",
            "enabledToolNamespaces": ["files"],
            "now": "2026-12-05T12:00:00Z"
        },
        "message": {
            "version": "1", "id": "msg-1",
            "sender": {"kind": "human", "userId": "operator"},
            "receiver": agent,
            "purpose": purpose,
            "payload": {"script": script, "traceFromTurn": true},
            "traceId": "trace-durable",
            "createdAt": "2026-12-05T12:00:00Z"
        },
        "tools": [{"name": "files.read", "description": "read a file", "namespace": "files",
            "source": "request", "readWrite": "read", "inputSchema": {},
            "requiredCapability": {"resource": {"namespace": "files", "path": []}, "action": "read"}}],
        "options": {"timeoutMs": 600_000, "maxSteps": 64,
            "maxToolCalls": sharedos_protocol::MAX_EXECUTION_TOOL_CALLS}
    })
}

/// utime + stime of a process (every thread), from `/proc/<pid>/stat`.
fn process_cpu(pid: u32) -> Result<Duration, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    // The fields after the command name (which may hold spaces).
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or("a /proc stat line without its command")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks = |i: usize| -> Result<u64, String> {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| format!("/proc/{pid}/stat: no field {}", i + 3))
    };
    let total = ticks(11)? + ticks(12)?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|hz| *hz > 0)
        .unwrap_or(100);
    Ok(Duration::from_secs_f64(total as f64 / hz as f64))
}

/// `(records, commits)` from the host's log line (`sharedos::audit` at
/// debug): the JSONL sink's own counters over the whole run.
fn committed(stderr: &str) -> Option<(u64, u64)> {
    let line = stderr
        .lines()
        .find(|l| l.contains("the audit trail committed "))?;
    let rest = &line[line.find("committed ")? + "committed ".len()..];
    let mut words = rest.split_whitespace();
    let records = words.next()?.parse().ok()?;
    let commits = words.nth(2)?.parse().ok()?;
    Some((records, commits))
}

/// Follows the audit file as it grows: lines, and `tool.invoked` records.
struct Tail {
    file: std::fs::File,
    at: u64,
    lines: u64,
    outcomes: u64,
    /// `tool.invoked` records of calls that did not succeed.
    unsuccessful: u64,
    partial: Vec<u8>,
}

impl Tail {
    fn open(path: &Path, until: Instant) -> Result<Self, String> {
        loop {
            if let Ok(file) = std::fs::File::open(path) {
                return Ok(Self {
                    file,
                    at: 0,
                    lines: 0,
                    outcomes: 0,
                    unsuccessful: 0,
                    partial: Vec::new(),
                });
            }
            if Instant::now() > until {
                return Err(format!("{} never appeared", path.display()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn poll(&mut self) -> Result<(), String> {
        self.file
            .seek(SeekFrom::Start(self.at))
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        self.file.read_to_end(&mut buf).map_err(|e| e.to_string())?;
        self.at += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        let Some(last) = self.partial.iter().rposition(|b| *b == b'\n') else {
            return Ok(());
        };
        for line in self.partial[..last].split(|b| *b == b'\n') {
            self.lines += 1;
            if contains(line, br#""type":"tool.invoked""#) {
                self.outcomes += 1;
                if !contains(line, br#""outcome":"succeeded""#) {
                    self.unsuccessful += 1;
                }
            }
        }
        self.partial.drain(..=last);
        Ok(())
    }

    /// Polls until `done` holds.
    fn wait(
        &mut self,
        host: &mut Child,
        until: Instant,
        what: &str,
        done: impl Fn(&Self) -> bool,
    ) -> Result<(), String> {
        loop {
            self.poll()?;
            if done(self) {
                return Ok(());
            }
            if let Ok(Some(status)) = host.try_wait() {
                return Err(format!("sharedos run ended ({status}) before {what}"));
            }
            if Instant::now() > until {
                return Err(format!("timed out waiting for {what}"));
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The plugin's figures from the printed result: its outcome's output.
fn plugin_output(result: &Value) -> Option<&Value> {
    result
        .get("output")
        .filter(|o| o.get("parallelNs").is_some() || o.get("callNs").is_some())
        .or_else(|| result.pointer("/outcome/output"))
}

/// One `sharedos run` of `calls` calls shaped `shape`, in `dir`.
pub fn one_run(
    exe: &Path,
    dir: &Path,
    launcher: &'static str,
    shape: Shape,
    calls: u64,
) -> Result<DurableRun, String> {
    let sharedos = sibling(exe, "sharedos")?;
    let testplugin = sibling(exe, "sharedos-testplugin")?;
    let err = |e: std::io::Error| e.to_string();
    let _ = std::fs::remove_dir_all(dir);
    let agent_dir = dir.join("files").join(NAMESPACE).join(AGENT);
    std::fs::create_dir_all(&agent_dir).map_err(err)?;
    std::fs::write(agent_dir.join(DATA_FILE), [b'x'; 256]).map_err(err)?;
    std::fs::write(dir.join("host.toml"), host_toml(&testplugin, launcher)).map_err(err)?;
    std::fs::write(dir.join("turn.json"), request(shape, calls).to_string()).map_err(err)?;
    let stdout = std::fs::File::create(dir.join("stdout")).map_err(err)?;
    let stderr = std::fs::File::create(dir.join("stderr")).map_err(err)?;
    let mut host = Command::new(&sharedos)
        .arg("run")
        .arg("--config")
        .arg(dir.join("host.toml"))
        .arg("--request")
        .arg(dir.join("turn.json"))
        .env("SHAREDOS_LOG", "warn,sharedos::audit=debug")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("{}: {e}", sharedos.display()))?;
    let pid = host.id();
    let measured = measure(&mut host, pid, dir, calls);
    if measured.is_err() {
        let _ = host.kill();
    }
    let status = host.wait().map_err(err)?;
    let cpu = measured?;
    let stderr_text = || std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    if !status.success() {
        return Err(format!("sharedos run failed ({status}): {}", stderr_text()));
    }
    let (records, commits) = committed(&stderr_text())
        .ok_or("the host did not log its audit commits (sharedos::audit)")?;
    let printed = std::fs::read(dir.join("stdout")).map_err(err)?;
    let result: Value = serde_json::from_slice(&printed)
        .map_err(|e| format!("the printed result does not parse: {e}"))?;
    let output = plugin_output(&result)
        .ok_or_else(|| format!("no plugin figures in the result: {}", stderr_text()))?;
    let (wall, latencies_ns) = match shape {
        Shape::InFlight(_) => {
            let ns = output["parallelNs"].as_u64().ok_or("no parallelNs")?;
            (Duration::from_nanos(ns), Vec::new())
        }
        Shape::Sequential => {
            let mut ns: Vec<u64> = output["callNs"]
                .as_array()
                .ok_or("no callNs")?
                .iter()
                .filter_map(Value::as_u64)
                .collect();
            let wall = Duration::from_nanos(ns.iter().sum());
            ns.sort_unstable();
            (wall, ns)
        }
    };
    Ok(DurableRun {
        launcher,
        shape,
        calls,
        wall,
        latencies_ns,
        host_cpu: cpu,
        records,
        syncs: commits,
    })
}

/// The host's CPU over the calls.
fn measure(host: &mut Child, pid: u32, dir: &Path, calls: u64) -> Result<Duration, String> {
    let until = Instant::now() + Duration::from_secs(300);
    let mut tail = Tail::open(&dir.join("audit.jsonl"), until)?;
    // The turn's opening records (authority, admission, catalog) are
    // written before the plugin's first step; the plugin then sleeps.
    tail.wait(host, until, "the turn's opening records", |t| t.lines >= 3)?;
    std::thread::sleep(Duration::from_millis(SLEEP_BEFORE_MS / 2));
    tail.poll()?;
    let cpu0 = process_cpu(pid)?;
    if tail.outcomes > 0 {
        return Err("the calls started before the host was measured at rest".into());
    }
    // Each outcome record is durable before its answer: once all are on
    // disk the calls are done but for their answers' last bytes.
    tail.wait(host, until, "every call's outcome record", |t| {
        t.outcomes >= calls || t.unsuccessful > 0
    })?;
    if tail.unsuccessful > 0 {
        return Err(format!(
            "{} calls did not succeed (see {})",
            tail.unsuccessful,
            dir.join("audit.jsonl").display()
        ));
    }
    Ok(process_cpu(pid)?.saturating_sub(cpu0))
}

/// The bare durable append on the same disk: one line written and
/// `fsync`ed, as the sink does, `n` times; the median, and the CPU one
/// append took on average (this thread's utime + stime).
pub fn bare_append_fsync(dir: &Path, n: usize) -> Result<(Duration, Duration), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let path = dir.join("bare.jsonl");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| e.to_string())?;
    let line = [b'x'; 400];
    let mut samples = Vec::with_capacity(n);
    let cpu0 = thread_cpu()?;
    for _ in 0..n.max(1) {
        let t = Instant::now();
        file.write_all(&line).map_err(|e| e.to_string())?;
        file.sync_all().map_err(|e| e.to_string())?;
        samples.push(t.elapsed());
    }
    let cpu = thread_cpu()?.saturating_sub(cpu0) / n.max(1) as u32;
    let _ = std::fs::remove_file(&path);
    samples.sort();
    Ok((samples[samples.len() / 2], cpu))
}

/// This thread's utime + stime.
fn thread_cpu() -> Result<Duration, String> {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_THREAD).map_err(|e| e.to_string())?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::new(
            u64::try_from(t.tv_sec()).unwrap_or(0),
            u32::try_from(t.tv_usec()).unwrap_or(0) * 1000,
        )
    };
    Ok(tv(usage.user_time()) + tv(usage.system_time()))
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**not met**" }
}

/// `--only durable`: sequential and 64 in flight, direct and sandboxed,
/// with the floor measured in the same run. False when a figure could
/// not be measured.
pub fn print(exe: &Path, sequential: u64, in_flight_calls: u64) -> bool {
    let base = std::env::temp_dir().join(format!("sharedos-bench-durable-{}", std::process::id()));
    let ok = print_in(exe, &base, sequential, in_flight_calls);
    if std::env::var_os("SHAREDOS_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    ok
}

fn print_in(exe: &Path, base: &Path, sequential: u64, in_flight_calls: u64) -> bool {
    println!(
        "== The durable path through `sharedos run` (fsync'd JSONL audit, files.read), in {}",
        base.display()
    );
    let (fsync, fsync_cpu) = match bare_append_fsync(&base.join("floor"), 200) {
        Ok((d, cpu)) => (d.as_secs_f64() * 1e6, cpu.as_secs_f64() * 1e6),
        Err(e) => {
            println!("    (the bare append + fsync not measured: {e})");
            return false;
        }
    };
    let ceiling = 64.0 / (2.0 * fsync / 1e6);
    println!(
        "    floor: one bare append + fsync on the same disk, median {fsync:.0} µs ({fsync_cpu:.1} µs CPU each)"
    );
    println!(
        "    ceiling for 64 in flight (64 calls per two sync latencies): {ceiling:.0} calls/s"
    );
    let mut ok = true;
    for launcher in ["direct", "sandbox"] {
        for shape in [Shape::Sequential, Shape::InFlight(64)] {
            let n = match shape {
                Shape::Sequential => sequential,
                Shape::InFlight(_) => in_flight_calls,
            };
            let dir = base.join(format!("{launcher}-{}", n));
            match one_run(exe, &dir, launcher, shape, n) {
                Ok(run) => println!("{}", line(&run, fsync)),
                Err(e) => {
                    println!("    ({launcher} {shape:?} not measured: {e})");
                    ok = false;
                }
            }
        }
    }
    ok
}

/// One run's line, with its goals.
fn line(run: &DurableRun, fsync_us: f64) -> String {
    let head = match run.shape {
        Shape::Sequential => format!("{:<8} sequential", run.launcher),
        Shape::InFlight(k) => format!("{:<8} {k} in flight", run.launcher),
    };
    let common = format!(
        "{:>9.0} calls/s  host CPU {:>6.1} µs/call  {:>5.1} records/fsync ({} records, {} fsyncs, {} calls)",
        run.calls_per_s(),
        run.cpu_us_per_call(),
        run.records_per_sync(),
        run.records,
        run.syncs,
        run.calls
    );
    let goals = match run.shape {
        Shape::Sequential => {
            let bound = 2.0 * fsync_us + 50.0;
            format!(
                "median {:.0} µs p99 {:.0} µs; goal ≤ 2 syncs + 50 µs = {bound:.0} µs: {}",
                run.latency_us(0.5),
                run.latency_us(0.99),
                verdict(run.latency_us(0.5) <= bound)
            )
        }
        Shape::InFlight(_) => format!(
            "goal ≥ {GOAL_CALLS_PER_S:.0} calls/s: {}; CPU ≤ {GOAL_CPU_US:.0} µs: {}",
            verdict(run.calls_per_s() >= GOAL_CALLS_PER_S),
            verdict(run.cpu_us_per_call() <= GOAL_CPU_US)
        ),
    };
    format!("    {head:<22} {common}\n        {goals}")
}
