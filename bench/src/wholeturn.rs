//! A whole zero-call turn near its spawn (issue 31): the plugin binary
//! alone, bwrap launching the same binary, and a whole `sharedos run`,
//! direct and in the full sandbox, interleaved round by round in one run.
//!
//! The plugin is `sharedos-testplugin` (next to this binary), with an
//! empty script: `initialize`, one `turn/run` answered `complete` at once,
//! then end of input. "Alone" and "bwrap" drive it with the raw client of
//! this module (one buffered line, one `write` a message); the two
//! `sharedos run`s are the shipped binary (next to this one) as a user
//! runs it, with `SHAREDOS_TIMINGS=1`, so each run also reports its stages
//! (cli/src/timings.rs) and the breakdown comes from the same runs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::Figure;
use super::served::{AGENT, NAMESPACE};

/// The flags bwrap gets (before the binds of the binary and its libraries):
/// every namespace ours has (user, mount, pid, net, ipc, uts, cgroup), the
/// plugin killed with its parent and in a session of its own, an empty
/// environment, a fresh `/proc`, a minimal `/dev`, and tmpfs `/tmp` as its
/// working directory. No seccomp filter, no Landlock, no cgroup, no rlimits:
/// ours has all four, so bwrap here is the cheaper of the two.
pub const BWRAP_FLAGS: [&str; 14] = [
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--clearenv",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "--chdir",
    "/tmp",
    "--cap-drop",
    "ALL",
];

/// The libraries `program` loads (from `ldd`), the program itself, and
/// each path's target when it is a symlink: what bwrap binds read-only.
fn binds(program: &Path) -> std::io::Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(program).output()?;
    let mut paths = vec![program.to_path_buf()];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            paths.push(PathBuf::from(p));
        }
    }
    let mut all = Vec::new();
    for p in paths {
        if let Ok(real) = std::fs::canonicalize(&p)
            && real != p
        {
            all.push(real);
        }
        all.push(p);
    }
    all.dedup();
    Ok(all)
}

/// bwrap's whole command line for `program` (`bwrap` resolved on PATH).
pub fn bwrap_command(bwrap: &Path, program: &Path) -> std::io::Result<Command> {
    let mut c = Command::new(bwrap);
    c.args(BWRAP_FLAGS);
    for p in binds(program)? {
        c.arg("--ro-bind").arg(&p).arg(&p);
    }
    c.arg("--").arg(program);
    Ok(c)
}

/// The `turn/run` request of a zero-call turn (the testplugin's empty script).
pub(crate) fn turn_run_line() -> String {
    json!({"jsonrpc": "2.0", "id": 2, "method": "turn/run", "params": {
        "turnId": "t-bench",
        "request": {"message": {"payload": {"script": []}}, "context": {"traceId": "trace-bench"}, "tools": []},
        "limits": {"maxSteps": 16, "maxToolCalls": 64, "timeoutMs": 20000}}})
    .to_string()
}

pub(crate) const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersions":[1],"host":{"name":"sharedos-bench","version":"1"},"limits":{"maxMessageBytes":8388608,"maxInflightToolCalls":64,"maxConcurrentTurns":1},"capabilities":{}}}"#;

/// One zero-call turn over `command`'s stdio with the raw client: spawn,
/// `initialize`, `turn/run`, the outcome, end of input, exit. Returns the
/// time from before the spawn until the process was reaped.
pub fn raw_turn(mut command: Command) -> std::io::Result<Duration> {
    let run = turn_run_line();
    let start = Instant::now();
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let no = |what: &str| std::io::Error::other(format!("no {what}"));
    let mut stdin = child.stdin.take().ok_or_else(|| no("stdin"))?;
    let mut stdout = BufReader::new(child.stdout.take().ok_or_else(|| no("stdout"))?);
    let mut line = String::new();
    for (request, id) in [(INITIALIZE, 1), (run.as_str(), 2)] {
        stdin.write_all(format!("{request}\n").as_bytes())?;
        line.clear();
        if stdout.read_line(&mut line)? == 0 {
            let status = child.wait()?;
            return Err(std::io::Error::other(format!(
                "the plugin closed its stdout before answering request {id} ({status})"
            )));
        }
        let answer: Value = serde_json::from_str(&line).map_err(std::io::Error::other)?;
        if answer["id"] != json!(id) || answer.get("result").is_none() {
            return Err(std::io::Error::other(format!(
                "unexpected answer to request {id}: {}",
                line.trim_end()
            )));
        }
        if id == 2 && answer["result"]["type"] != "complete" {
            return Err(std::io::Error::other(format!(
                "the turn did not complete: {}",
                line.trim_end()
            )));
        }
    }
    drop(stdin);
    let status = child.wait()?;
    let took = start.elapsed();
    if !status.success() {
        return Err(std::io::Error::other(format!("the plugin exited {status}")));
    }
    Ok(took)
}

/// What one `sharedos run` took: its wall time (spawn until reaped), the
/// time from the spawn until its `main` (from its `mainUnixNs`), and its
/// own stages in order.
pub struct RunTiming {
    pub wall: Duration,
    pub to_main: Duration,
    pub stages: Vec<(String, Duration)>,
}

/// One directory set up for `sharedos run` of the testplugin: its
/// `host.toml`, the request, the audit and files it writes, and its own
/// `XDG_RUNTIME_DIR` (the state directory, kept across runs as a user's is).
pub struct RunDir {
    dir: tempfile::TempDir,
    runtime_dir: tempfile::TempDir,
    sharedos: PathBuf,
}

impl RunDir {
    /// `launcher` is `direct` or `sandbox`.
    pub fn new(sharedos: &Path, testplugin: &Path, launcher: &str) -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("sharedos-bench-run-")
            .tempdir()?;
        let runtime_dir = tempfile::Builder::new()
            .prefix("sharedos-bench-xdg-")
            .tempdir()?;
        let config = super::served::testplugin_config(testplugin, 20_000, "", launcher, "");
        std::fs::write(dir.path().join("host.toml"), config)?;
        Ok(Self {
            dir,
            runtime_dir,
            sharedos: sharedos.to_path_buf(),
        })
    }

    fn request(&self, n: usize) -> std::io::Result<PathBuf> {
        let request = json!({
            "version": "1",
            "executionId": format!("bench-run-{n}"),
            "agent": {"kind": "agent", "agentId": AGENT},
            "context": {
                "namespaceId": NAMESPACE,
                "actor": {"kind": "agent", "agentId": AGENT},
                "authority": {"kind": "service", "serviceId": "bench"},
                "owner": {"kind": "human", "userId": "operator"},
                "purpose": "a zero-call turn",
                "traceId": format!("trace-bench-{n}"),
                "enabledToolNamespaces": [],
                "now": "2026-12-05T12:00:00Z"
            },
            "message": {
                "version": "1",
                "id": format!("msg-{n}"),
                "sender": {"kind": "human", "userId": "operator"},
                "receiver": {"kind": "agent", "agentId": AGENT},
                "purpose": "a zero-call turn",
                "payload": {"script": []},
                "traceId": format!("trace-bench-{n}"),
                "createdAt": "2026-12-05T12:00:00Z"
            },
            "tools": []
        });
        let path = self.dir.path().join("turn.json");
        std::fs::write(&path, request.to_string())?;
        Ok(path)
    }

    /// One `sharedos run` of a zero-call turn (the `n`th), which must succeed.
    pub fn run(&self, n: usize) -> std::io::Result<RunTiming> {
        let request = self.request(n)?;
        let mut command = Command::new(&self.sharedos);
        command
            .arg("run")
            .arg("--config")
            .arg(self.dir.path().join("host.toml"))
            .arg("--request")
            .arg(&request)
            .env("XDG_RUNTIME_DIR", self.runtime_dir.path())
            .env("SHAREDOS_TIMINGS", "1")
            .env_remove("SHAREDOS_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawned_unix = unix_ns();
        let start = Instant::now();
        let out = command.output()?;
        let wall = start.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "sharedos run exited {}: {}",
                out.status,
                stderr.trim_end()
            )));
        }
        let timings = stderr
            .lines()
            .find_map(|l| l.strip_prefix("sharedos timings: "))
            .ok_or_else(|| std::io::Error::other("sharedos run printed no timings"))?;
        let timings: Value = serde_json::from_str(timings).map_err(std::io::Error::other)?;
        let main = timings["mainUnixNs"].as_u64().unwrap_or(0) as u128;
        let to_main = Duration::from_nanos(main.saturating_sub(spawned_unix) as u64);
        let stages = timings["stagesUs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| {
                        let name = s.get(0)?.as_str()?.to_owned();
                        Some((name, Duration::from_micros(s.get(1)?.as_u64()?)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(RunTiming {
            wall,
            to_main,
            stages,
        })
    }
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The figures of one run of [`measure`].
pub struct WholeTurn {
    pub alone: Figure,
    pub bwrap: Option<Figure>,
    pub direct: Figure,
    pub sandboxed: Figure,
    /// Per mode (`direct`, `sandboxed`): each stage's median, in order,
    /// `start` (spawn until `main`) first and `exit` (the last stamp until
    /// reaped) last.
    pub stages: Vec<(&'static str, Vec<(String, f64)>)>,
}

/// The medians of each stage over the runs, in the first run's order.
fn stage_medians(runs: &[RunTiming]) -> Vec<(String, f64)> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let mut names: Vec<String> = vec!["start".into()];
    names.extend(first.stages.iter().map(|(n, _)| n.clone()));
    names.push("exit".into());
    names
        .into_iter()
        .map(|name| {
            let mut v: Vec<f64> = runs
                .iter()
                .map(|r| {
                    let us = |d: Duration| d.as_secs_f64() * 1e6;
                    match name.as_str() {
                        "start" => us(r.to_main),
                        "exit" => {
                            let inside: Duration = r.stages.iter().map(|(_, d)| *d).sum();
                            us(r.wall.saturating_sub(r.to_main + inside))
                        }
                        _ => r
                            .stages
                            .iter()
                            .find(|(n, _)| *n == name)
                            .map(|(_, d)| us(*d))
                            .unwrap_or(0.0),
                    }
                })
                .collect();
            v.sort_by(f64::total_cmp);
            (name, v.get(v.len() / 2).copied().unwrap_or(f64::NAN))
        })
        .collect()
}

/// `n` interleaved rounds (after 3 discarded ones) of the four: the binary
/// alone, bwrap launching it (when installed), `sharedos run` direct and
/// sandboxed. Blocking: run it off the async runtime.
pub fn measure(sharedos: &Path, testplugin: &Path, n: usize) -> Result<WholeTurn, String> {
    for (what, p) in [("sharedos", sharedos), ("sharedos-testplugin", testplugin)] {
        if !p.is_file() {
            return Err(format!(
                "{what} is not built at {} (cargo build --release -p sharedos-cli -p sharedos-testplugin)",
                p.display()
            ));
        }
    }
    let bwrap = super::process::find_bwrap();
    let e = |e: std::io::Error| e.to_string();
    let direct_dir = RunDir::new(sharedos, testplugin, "direct").map_err(e)?;
    let sandbox_dir = RunDir::new(sharedos, testplugin, "sandbox").map_err(e)?;
    let (mut alone, mut bw, mut direct, mut sandboxed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..n + 3 {
        let a = raw_turn(Command::new(testplugin)).map_err(|e| format!("alone: {e}"))?;
        let b = match &bwrap {
            Some(bwrap) => Some(
                raw_turn(bwrap_command(bwrap, testplugin).map_err(e)?)
                    .map_err(|e| format!("bwrap: {e}"))?,
            ),
            None => None,
        };
        let d = direct_dir
            .run(round)
            .map_err(|e| format!("sharedos run, direct: {e}"))?;
        let s = sandbox_dir
            .run(round)
            .map_err(|e| format!("sharedos run, sandboxed: {e}"))?;
        if round >= 3 {
            alone.push(a);
            bw.extend(b);
            direct.push(d);
            sandboxed.push(s);
        }
    }
    let stages = vec![
        ("direct", stage_medians(&direct)),
        ("sandboxed", stage_medians(&sandboxed)),
    ];
    Ok(WholeTurn {
        alone: Figure::from_samples("the plugin binary alone (raw client)", alone),
        bwrap: (!bw.is_empty())
            .then(|| Figure::from_samples("bwrap launching the same binary (raw client)", bw)),
        direct: Figure::from_samples(
            "sharedos run, direct",
            direct.iter().map(|r| r.wall).collect(),
        ),
        sandboxed: Figure::from_samples(
            "sharedos run, full sandbox",
            sandboxed.iter().map(|r| r.wall).collect(),
        ),
        stages,
    })
}

/// Prints [`measure`]'s figures, ratios and breakdown; `false` when it
/// could not be measured.
pub async fn print(n: usize) -> bool {
    let sharedos = super::soak::sibling("sharedos");
    let testplugin = super::soak::sibling("sharedos-testplugin");
    println!("== A whole zero-call turn against its spawn ({n} interleaved rounds)");
    if super::process::find_bwrap().is_none() {
        println!(
            "    (bwrap is not installed: no bwrap comparison; `apt-get install -y bubblewrap`)"
        );
    } else {
        println!(
            "    bwrap flags: {}, --ro-bind of the binary and each library ldd lists (and their targets)",
            BWRAP_FLAGS.join(" ")
        );
    }
    let measured = tokio::task::spawn_blocking(move || measure(&sharedos, &testplugin, n)).await;
    let w = match measured {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            println!("    (not measured: {e})");
            return false;
        }
        Err(e) => {
            println!("    (not measured: {e})");
            return false;
        }
    };
    for f in [
        Some(&w.alone),
        w.bwrap.as_ref(),
        Some(&w.direct),
        Some(&w.sandboxed),
    ]
    .into_iter()
    .flatten()
    {
        println!("{}", f.line());
    }
    let ratio = |a: &Figure, b: &Figure| a.median_us / b.median_us.max(f64::MIN_POSITIVE);
    if let Some(b) = &w.bwrap {
        println!(
            "    sandboxed / bwrap: {:.2}× (goal ≤ 1.5×)",
            ratio(&w.sandboxed, b)
        );
    }
    println!(
        "    direct / binary alone: {:.2}× (goal ≤ 2×)",
        ratio(&w.direct, &w.alone)
    );
    for (mode, stages) in &w.stages {
        let parts: Vec<String> = stages
            .iter()
            .map(|(s, us)| format!("{s} {:.0}", us))
            .collect();
        println!(
            "    sharedos run, {mode}, stage medians (µs): {}",
            parts.join(", ")
        );
    }
    true
}
