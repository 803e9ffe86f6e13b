//! Spawn latency in one run: `/bin/true` directly, under bwrap, and through
//! the sandbox helper(s) given on the command line, round-robin.
//!
//! Usage: spawn_bench ITERATIONS HELPER [HELPER...]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sharedos_sandbox::{SandboxLevel, SandboxPolicy, SpawnSpec, spawn};

fn summary(name: &str, mut v: Vec<Duration>) -> (String, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let med = us(v[v.len() / 2]);
    println!(
        "{name:<44} min {:>7.0} µs  median {:>7.0} µs  p90 {:>7.0} µs",
        us(v[0]),
        med,
        us(v[v.len() * 9 / 10])
    );
    (name.to_string(), med)
}

/// One round's samples of a helper: full sandbox (fork server) to exec and
/// to exit, no layers to exec, full sandbox with the helper executed per
/// spawn to exec.
#[derive(Clone, Default)]
struct HelperSamples {
    exec: Vec<Duration>,
    exit: Vec<Duration>,
    unconfined: Vec<Duration>,
    exec_each: Vec<Duration>,
}

fn true_spec(helper: &Path, policy: SandboxPolicy, ws: &Path) -> SpawnSpec {
    SpawnSpec {
        helper_exe: helper.to_path_buf(),
        program: "/bin/true".into(),
        args: vec![],
        env: vec![],
        policy,
        workspace: Some(ws.to_path_buf()),
    }
}

/// `/bin/true` under `bwrap --unshare-all`, to its exit.
fn bwrap_true(bwrap: &Path) -> Duration {
    let t = Instant::now();
    let st = Command::new(bwrap)
        .args([
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--",
            "/bin/true",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    t.elapsed()
}

/// One round through helper `h`: each of its configurations once.
fn helper_round(h: &Path, full: &SandboxPolicy, ws: &Path, out: &mut HelperSamples) {
    let t = Instant::now();
    let mut c = spawn(&true_spec(h, full.clone(), ws)).unwrap();
    out.exec.push(t.elapsed());
    c.wait().unwrap();
    out.exit.push(t.elapsed());
    let t = Instant::now();
    let mut c = spawn(&true_spec(h, SandboxPolicy::unconfined(), ws)).unwrap();
    out.unconfined.push(t.elapsed());
    c.wait().unwrap();
    let full_exec = SandboxPolicy {
        fork_server: false,
        ..full.clone()
    };
    let t = Instant::now();
    let mut c = spawn(&true_spec(h, full_exec, ws)).unwrap();
    out.exec_each.push(t.elapsed());
    c.wait().unwrap();
}

/// Stage breakdown of the full sandbox (timings on) through helper `h`.
fn print_stages(h: &Path, n: usize, full: &SandboxPolicy, ws: &Path) {
    let mut stages: Vec<(String, Vec<u64>)> = Vec::new();
    for _ in 0..n {
        let policy = SandboxPolicy {
            timings: true,
            ..full.clone()
        };
        let mut c = spawn(&true_spec(h, policy, ws)).unwrap();
        for t in &c.report.timings_us {
            let key = format!("{:<7} {}", t.process, t.stage);
            match stages.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(t.us),
                None => stages.push((key, vec![t.us])),
            }
        }
        c.wait().unwrap();
    }
    println!(
        "stages of the full sandbox with {} (median µs since spawn(), min, median step):",
        h.display()
    );
    let mut prev = 0;
    for (k, mut v) in stages {
        v.sort();
        let m = v[v.len() / 2];
        println!(
            "  {k:<46} {m:>6}  (min {:>6})  +{}",
            v[0],
            m as i64 - prev as i64
        );
        prev = m;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args[0].parse().unwrap();
    let helpers: Vec<PathBuf> = args[1..].iter().map(PathBuf::from).collect();
    let ws = tempfile::tempdir().unwrap();
    let full = SandboxPolicy {
        min_level: SandboxLevel::Isolated,
        ..SandboxPolicy::default()
    };
    let bwrap = PathBuf::from("/usr/bin/bwrap");
    let mut base = Vec::new();
    let mut bw = Vec::new();
    let mut sb = vec![HelperSamples::default(); helpers.len()];
    for _ in 0..n {
        let t = Instant::now();
        Command::new("/bin/true").status().unwrap();
        base.push(t.elapsed());
        if bwrap.exists() {
            bw.push(bwrap_true(&bwrap));
        }
        for (h, samples) in helpers.iter().zip(sb.iter_mut()) {
            helper_round(h, &full, ws.path(), samples);
        }
    }
    for h in &helpers {
        print_stages(h, n, &full, ws.path());
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("n={n} loadavg {}", load.trim());
    let (_, b) = summary("fork+exec+wait /bin/true", base);
    let bwm = if bw.is_empty() {
        None
    } else {
        Some(summary("bwrap --unshare-all ... /bin/true (to exit)", bw).1)
    };
    for (h, samples) in helpers.iter().zip(sb) {
        let name = h.file_name().unwrap().to_string_lossy().to_string();
        let (_, xm) = summary(
            &format!("full [{name}] exec per spawn, to exec"),
            samples.exec_each,
        );
        let (_, m) = summary(&format!("full [{name}] to exec"), samples.exec);
        let (_, mt) = summary(&format!("full [{name}] to exit"), samples.exit);
        summary(&format!("no layers [{name}] to exec"), samples.unconfined);
        println!(
            "   full/true {:.2}x   full(exec)/bwrap {:.2}x   full(exit)/bwrap {:.2}x   \
             exec-per-spawn/true {:.2}x   exec-per-spawn/bwrap {:.2}x",
            m / b,
            bwm.map_or(0.0, |w| m / w),
            bwm.map_or(0.0, |w| mt / w),
            xm / b,
            bwm.map_or(0.0, |w| xm / w)
        );
    }
}
