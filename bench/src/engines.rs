//! The engines side by side (issue 30): for each, the time from the
//! launch until `initialize` is answered and until a zero-call turn's
//! `complete` is in, and the memory the idle plugin's whole tree holds,
//! all in one run, round by round, with the goals' ratios computed from
//! the same run.
//!
//! The plugin is `sharedos-testplugin` (next to this binary) with an empty
//! script, driven by the raw client of this module over the launch's
//! pipes: one `initialize` line, one `turn/run` line, each answer read
//! before the next is written. The engines are bwrap launching the binary
//! as `--only whole-turn` does (the floor), the namespace sandbox
//! (`SandboxLauncher`, default policy) cold and with one sandbox prepared
//! (`warm = 1`), gVisor (`GvisorLauncher`, default policy) cold and with
//! one container prepared, and the microVM (`MicrovmLauncher`, 256 MiB, 1
//! vCPU) cold and with one VM booted ahead. A prepared launch is timed
//! from the take; after it, the bench waits (untimed) until the
//! replacement is ready, so every timed launch finds one, as a turn does
//! that comes longer than one preparation after the last. Teardown (kill
//! and reap) is timed apart and is in neither figure.
//!
//! The idle plugin's memory is read after the turn's answer, before the
//! teardown: the proportional (PSS) and resident (RSS) sizes summed over
//! the launched process and every descendant (`/proc/*/stat` parents):
//! bwrap and the plugin; the sandbox's helper, its pid 1 and the plugin;
//! `runsc run`, gVisor's sandbox and gofer; QEMU. A prepared engine also
//! holds one more such tree for the next turn; that is not added.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_host::process::{
    GvisorLauncher, LaunchSpec, LaunchedChild, Launcher, MicrovmLauncher, ProcessTree,
};
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_sandbox::SandboxPolicy;

use super::Figure;
use super::wholeturn::{INITIALIZE, bwrap_command, turn_run_line};

/// How long a prepared launcher's replacement may take (a TCG boot on a
/// loaded machine takes tens of seconds).
const REFILL_WAIT: Duration = Duration::from_secs(180);

/// The microVM's RAM, as the microVM tests run it.
const VM_MIB: u64 = 256;

/// One engine of the run.
struct Engine {
    name: &'static str,
    kind: Kind,
    /// Rounds this engine runs in (the microVM cold one runs in fewer).
    rounds: usize,
    init: Vec<Duration>,
    turn: Vec<Duration>,
    teardown: Vec<Duration>,
    pss_kib: Vec<u64>,
    rss_kib: Vec<u64>,
    /// The processes of the idle tree, by name, from the last sample.
    tree: String,
    error: Option<String>,
}

enum Kind {
    Bwrap(PathBuf),
    Launcher {
        launcher: Arc<dyn Launcher>,
        /// Waits until a prepared launcher's replacement is ready.
        refill: Option<Box<dyn Fn() + Send + Sync>>,
    },
}

/// A launched plugin: its pipes and how to end it.
struct Running {
    stdin: std::fs::File,
    stdout: BufReader<std::fs::File>,
    root: u32,
    end: Box<dyn FnOnce() -> std::io::Result<()>>,
}

/// What `kind` needs built before the timed launch: bwrap's command line
/// (its binds come from `ldd`, outside the timing as in `--only
/// whole-turn`).
fn before_launch(kind: &Kind, plugin: &Path) -> Result<Option<Command>, String> {
    match kind {
        Kind::Bwrap(bwrap) => bwrap_command(bwrap, plugin)
            .map(Some)
            .map_err(|e| format!("bwrap's binds: {e}")),
        Kind::Launcher { .. } => Ok(None),
    }
}

fn launch(
    kind: &Kind,
    command: Option<Command>,
    plugin: &Path,
    round: usize,
) -> Result<Running, String> {
    match (kind, command) {
        (Kind::Bwrap(_), Some(mut command)) => {
            let mut child = command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("bwrap: {e}"))?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                let _ = child.kill();
                let _ = child.wait();
                return Err("a stdio pipe of bwrap is missing".into());
            };
            Ok(Running {
                stdin: std::fs::File::from(std::os::fd::OwnedFd::from(stdin)),
                stdout: BufReader::new(std::fs::File::from(std::os::fd::OwnedFd::from(stdout))),
                root: child.id(),
                end: Box::new(move || {
                    let _ = child.kill();
                    child.wait().map(drop)
                }),
            })
        }
        (Kind::Bwrap(_), None) => Err("bwrap's command line was not built".into()),
        (Kind::Launcher { launcher, .. }, _) => {
            let spec = LaunchSpec {
                program: plugin.to_path_buf(),
                args: vec![],
                env: vec![],
                program_sha256: None,
                runtime_id: "sharedos-testplugin".into(),
                execution_id: format!("bench-engines-{round}"),
                turn_id: "t-bench".into(),
            };
            let LaunchedChild {
                stdin,
                stdout,
                stderr,
                tree,
                ..
            } = launcher.launch(&spec).map_err(|e| e.to_string())?;
            // The plugin's (or the VM's) stderr, drained so it never
            // blocks on a full pipe.
            let drain = std::thread::spawn(move || {
                let _ = std::io::copy(&mut std::fs::File::from(stderr), &mut std::io::sink());
            });
            let root = tree.pid();
            Ok(Running {
                stdin: std::fs::File::from(stdin),
                stdout: BufReader::new(std::fs::File::from(stdout)),
                root,
                end: Box::new(move || {
                    let r = end_tree(tree);
                    let _ = drain.join();
                    r
                }),
            })
        }
    }
}

fn end_tree(mut tree: Box<dyn ProcessTree>) -> std::io::Result<()> {
    tree.start_kill();
    tree.kill_tree()
}

/// Writes `request` and reads one answer, which must be the result of
/// request `id`.
fn exchange(r: &mut Running, request: &str, id: u64) -> Result<Value, String> {
    r.stdin
        .write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("writing request {id}: {e}"))?;
    let mut line = String::new();
    match r.stdout.read_line(&mut line) {
        Ok(0) => {
            return Err(format!(
                "the plugin closed its stdout before answering {id}"
            ));
        }
        Ok(_) => {}
        Err(e) => return Err(format!("reading the answer to {id}: {e}")),
    }
    let answer: Value = serde_json::from_str(&line)
        .map_err(|e| format!("the answer to {id} is not JSON ({e}): {}", line.trim_end()))?;
    if answer["id"] != json!(id) || answer.get("result").is_none() {
        return Err(format!(
            "unexpected answer to request {id}: {}",
            line.trim_end()
        ));
    }
    Ok(answer)
}

/// One sample of `e`: launch, `initialize`, the turn, the idle tree's
/// memory, the teardown.
fn sample(e: &mut Engine, plugin: &Path, round: usize, keep: bool) -> Result<(), String> {
    let run = turn_run_line();
    let command = before_launch(&e.kind, plugin)?;
    let start = Instant::now();
    let mut r = launch(&e.kind, command, plugin, round)?;
    let answered = exchange(&mut r, INITIALIZE, 1).map(|_| start.elapsed());
    let turned = answered.and_then(|init| {
        let answer = exchange(&mut r, &run, 2)?;
        let turn = start.elapsed();
        if answer["result"]["type"] != "complete" {
            return Err(format!("the turn did not complete: {answer}"));
        }
        Ok((init, turn))
    });
    let memory = turned.is_ok().then(|| tree_memory(r.root));
    let Running { stdin, end, .. } = r;
    drop(stdin);
    let ending = Instant::now();
    let ended = end();
    let teardown = ending.elapsed();
    let (init, turn) = turned?;
    ended.map_err(|e| format!("the teardown: {e}"))?;
    if let Kind::Launcher {
        refill: Some(wait), ..
    } = &e.kind
    {
        wait();
    }
    if keep {
        e.init.push(init);
        e.turn.push(turn);
        e.teardown.push(teardown);
        if let Some((pss, rss, names)) = memory {
            e.pss_kib.push(pss);
            e.rss_kib.push(rss);
            e.tree = names;
        }
    }
    Ok(())
}

/// Every live process's parent, from `/proc/*/stat`.
fn parents() -> HashMap<u32, (u32, String)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_owned();
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        out.insert(pid, (ppid, name));
    }
    out
}

/// A `kB` field of a `/proc/<pid>` file.
fn kib(pid: u32, file: &str, field: &str) -> u64 {
    let mut text = String::new();
    let read = std::fs::File::open(format!("/proc/{pid}/{file}"))
        .and_then(|mut f| f.read_to_string(&mut text));
    if read.is_err() {
        return 0;
    }
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// PSS and RSS (KiB) of `root` and all its descendants, and their names.
fn tree_memory(root: u32) -> (u64, u64, String) {
    let all = parents();
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(
            all.iter()
                .filter(|(_, (ppid, _))| *ppid == p)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    let (mut pss, mut rss) = (0, 0);
    let mut names: Vec<String> = Vec::new();
    for pid in &tree {
        pss += kib(*pid, "smaps_rollup", "Pss:");
        rss += kib(*pid, "status", "VmRSS:");
        if let Some((_, n)) = all.get(pid) {
            names.push(n.clone());
        }
    }
    (pss, rss, names.join(", "))
}

fn median_kib(v: &[u64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).map(|k| *k as f64 / 1024.0)
}

fn ms(us: f64) -> f64 {
    us / 1000.0
}

/// A prepared launcher and how the bench waits for its replacement.
fn prepared_kind<L: Launcher + 'static>(l: Arc<L>, wait: fn(&L, Duration) -> usize) -> Kind {
    let w = l.clone();
    Kind::Launcher {
        launcher: l,
        refill: Some(Box::new(move || {
            wait(&w, REFILL_WAIT);
        })),
    }
}

/// The engines, in the order they run in each round.
fn engines(exe: &Path, n: usize, vm_cold: usize) -> (Vec<Engine>, Vec<String>) {
    let mut notes = Vec::new();
    let warm = SandboxPolicy {
        warm: 1,
        ..Default::default()
    };
    let mut out = Vec::new();
    match super::process::find_bwrap() {
        Some(b) => out.push(engine("bwrap (the floor)", Kind::Bwrap(b), n)),
        None => {
            notes.push("bwrap is not installed: no floor (`apt-get install -y bubblewrap`)".into())
        }
    }
    out.push(engine(
        "namespace sandbox, cold",
        launcher(Arc::new(SandboxLauncher::new(
            exe.to_path_buf(),
            SandboxPolicy::default(),
        ))),
        n,
    ));
    let ns_warm = Arc::new(SandboxLauncher::new(exe.to_path_buf(), warm.clone()));
    out.push(engine(
        "namespace sandbox, prepared",
        prepared_kind(ns_warm, SandboxLauncher::wait_warm),
        n,
    ));
    gvisor_engines(exe, n, &warm, &mut out, &mut notes);
    microvm_engines(n, vm_cold, &warm, &mut out, &mut notes);
    (out, notes)
}

/// An engine to measure `rounds` times, nothing measured yet.
fn engine(name: &'static str, kind: Kind, rounds: usize) -> Engine {
    Engine {
        name,
        kind,
        rounds,
        init: Vec::new(),
        turn: Vec::new(),
        teardown: Vec::new(),
        pss_kib: Vec::new(),
        rss_kib: Vec::new(),
        tree: String::new(),
        error: None,
    }
}

/// A cold launcher's engine kind (no spare to wait for).
fn launcher(l: Arc<dyn Launcher>) -> Kind {
    Kind::Launcher {
        launcher: l,
        refill: None,
    }
}

/// gVisor cold and prepared, or the note why not.
fn gvisor_engines(
    exe: &Path,
    n: usize,
    warm: &SandboxPolicy,
    out: &mut Vec<Engine>,
    notes: &mut Vec<String>,
) {
    let gvisor = |policy: SandboxPolicy| {
        GvisorLauncher::new(policy, None).map(|l| Arc::new(l.with_helper_exe(exe.to_path_buf())))
    };
    match (gvisor(SandboxPolicy::default()), gvisor(warm.clone())) {
        (Ok(cold), Ok(prepared)) => {
            let platform = sharedos_host::process::gvisor::platform(cold.runsc());
            notes.push(format!(
                "gVisor: {} ({}), platform {} ({})",
                cold.runsc().version,
                cold.runsc().path.display(),
                platform.name,
                platform.why
            ));
            out.push(engine("gVisor, cold", launcher(cold), n));
            out.push(engine(
                "gVisor, prepared",
                prepared_kind(prepared, GvisorLauncher::wait_warm),
                n,
            ));
        }
        (Err(e), _) | (_, Err(e)) => notes.push(format!("gVisor not measured: {e}")),
    }
}

/// The microVM cold (`vm_cold` rounds) and warm, or the note why not.
fn microvm_engines(
    n: usize,
    vm_cold: usize,
    warm: &SandboxPolicy,
    out: &mut Vec<Engine>,
    notes: &mut Vec<String>,
) {
    let settings = sharedos_host::process::microvm::MicrovmSettings {
        qemu: None,
        kernel: None,
        init: Some(super::soak::sibling("sharedos-guest-init")),
        memory_mib: VM_MIB,
        vcpus: 1,
        mkfs: None,
        harness_cli: None,
    };
    let vm = |policy: SandboxPolicy| MicrovmLauncher::new(policy, &settings).map(Arc::new);
    match (vm(SandboxPolicy::default()), vm(warm.clone())) {
        (Ok(cold), Ok(prepared)) => {
            let accel = cold.accel();
            notes.push(format!(
                "microVM: {}; accelerator {} ({})",
                cold.summary(),
                accel.name.to_uppercase(),
                accel.why
            ));
            out.push(engine("microVM, cold", launcher(cold), vm_cold));
            out.push(engine(
                "microVM, warm",
                prepared_kind(prepared, MicrovmLauncher::wait_warm),
                n,
            ));
        }
        (Err(e), _) | (_, Err(e)) => notes.push(format!("microVM not measured: {e}")),
    }
}

/// A prepared engine's first launch: its spare is started now (as at
/// seating) and awaited, so the first round is not a cold one.
fn prewarm(e: &Engine, plugin: &Path) {
    if let Kind::Launcher {
        launcher,
        refill: Some(wait),
    } = &e.kind
    {
        launcher.prewarm(&LaunchSpec {
            program: plugin.to_path_buf(),
            args: vec![],
            env: vec![],
            program_sha256: None,
            runtime_id: "sharedos-testplugin".into(),
            execution_id: "bench-engines-prewarm".into(),
            turn_id: "t-bench".into(),
        });
        wait();
    }
}

/// Runs every engine `n` rounds after 2 discarded ones (the microVM cold
/// `vm_cold` after 1) and prints the table and the goals; `false` when an
/// engine could not be measured. Blocking: run it off the async runtime.
pub fn run(exe: &Path, n: usize, vm_cold: usize) -> bool {
    let plugin = super::soak::sibling("sharedos-testplugin");
    if !plugin.is_file() {
        println!(
            "    (not measured: sharedos-testplugin is not built at {}; cargo build -p sharedos-testplugin -p sharedos-guest-init)",
            plugin.display()
        );
        return false;
    }
    let (mut engines, notes) = engines(exe, n, vm_cold);
    for note in &notes {
        println!("    {note}");
    }
    for e in &engines {
        prewarm(e, &plugin);
    }
    let discard = |e: &Engine| if e.rounds < n { 1 } else { 2 };
    let most = engines
        .iter()
        .map(|e| e.rounds + discard(e))
        .max()
        .unwrap_or(0);
    for round in 0..most {
        for e in engines.iter_mut() {
            let skip = discard(e);
            if e.error.is_some() || round >= e.rounds + skip {
                continue;
            }
            if let Err(err) = sample(e, &plugin, round, round >= skip) {
                e.error = Some(err);
            }
        }
    }
    print(&engines, &notes)
}

/// The table and the goals; `false` when an engine was not measured.
fn print(engines: &[Engine], notes: &[String]) -> bool {
    let (ok, figures) = print_table(engines);
    print_goals(engines, &figures, notes);
    ok
}

/// Each engine's row; its launch → `initialize` and zero-call turn figures.
fn print_table(engines: &[Engine]) -> (bool, HashMap<&'static str, (Figure, Figure)>) {
    let mut ok = true;
    println!(
        "    {:<30} {:>4} {:>21} {:>21} {:>10} {:>16}",
        "engine", "n", "→ initialize ms", "zero-call turn ms", "teardown", "idle PSS / RSS"
    );
    println!(
        "    {:<30} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7} {:>8}",
        "", "", "median", "p90", "median", "p90", "median ms", "MiB", "MiB"
    );
    let mut figures: HashMap<&'static str, (Figure, Figure)> = HashMap::new();
    for e in engines {
        if let Some(err) = &e.error {
            println!("    {:<30} not measured: {err}", e.name);
            ok = false;
            continue;
        }
        let init = Figure::from_samples(e.name, e.init.clone());
        let turn = Figure::from_samples(e.name, e.turn.clone());
        let teardown = Figure::from_samples(e.name, e.teardown.clone());
        let mem = |v: &[u64]| {
            median_kib(v)
                .map(|m| format!("{m:.1}"))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "    {:<30} {:>4} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>7} {:>8}",
            e.name,
            init.iterations,
            ms(init.median_us),
            ms(init.p90_us),
            ms(turn.median_us),
            ms(turn.p90_us),
            ms(teardown.median_us),
            mem(&e.pss_kib),
            mem(&e.rss_kib),
        );
        figures.insert(e.name, (init, turn));
    }
    (ok, figures)
}

/// The idle trees and the goals, each taken within this run.
fn print_goals(
    engines: &[Engine],
    figures: &HashMap<&'static str, (Figure, Figure)>,
    notes: &[String],
) {
    for e in engines.iter().filter(|e| e.error.is_none()) {
        println!("    idle tree of {}: {}", e.name, e.tree);
    }
    // Each goal on both axes, or (`turn_only`) on the zero-call turn.
    let goal = |what: &str, a: &str, b: &str, bound: f64, turn_only: bool| {
        let (Some(a), Some(b)) = (figures.get(a), figures.get(b)) else {
            println!("    {what}: not computed (an engine is missing)");
            return;
        };
        let axes = [("→ initialize", &a.0, &b.0), ("zero-call turn", &a.1, &b.1)];
        for (axis, x, y) in axes.into_iter().skip(usize::from(turn_only)) {
            let r = x.median_us / y.median_us.max(f64::MIN_POSITIVE);
            println!(
                "    {what}, {axis}: {r:.2}× ({:.2} / {:.2} ms; goal ≤ {bound}×: {})",
                ms(x.median_us),
                ms(y.median_us),
                if r <= bound { "met" } else { "NOT met" }
            );
        }
    };
    goal(
        "gVisor cold / bwrap",
        "gVisor, cold",
        "bwrap (the floor)",
        2.0,
        false,
    );
    goal(
        "gVisor prepared / namespace sandbox prepared",
        "gVisor, prepared",
        "namespace sandbox, prepared",
        1.5,
        false,
    );
    let accel = notes
        .iter()
        .find_map(|n| n.split("accelerator ").nth(1))
        .and_then(|a| a.split_whitespace().next())
        .unwrap_or("?");
    goal(
        &format!("microVM warm ({accel}) / namespace sandbox prepared"),
        "microVM, warm",
        "namespace sandbox, prepared",
        1.5,
        true,
    );
}
