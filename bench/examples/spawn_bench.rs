//! Spawn latency in one run: `/bin/true` directly, under bwrap, and through
//! the sandbox helper(s) given on the command line, round-robin.
//!
//! Usage: spawn_bench ITERATIONS HELPER [HELPER...]

use std::path::PathBuf;
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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args[0].parse().unwrap();
    let helpers: Vec<PathBuf> = args[1..].iter().map(PathBuf::from).collect();
    let ws = tempfile::tempdir().unwrap();
    let full = SandboxPolicy {
        min_level: SandboxLevel::Strong,
        ..SandboxPolicy::default()
    };
    let bwrap = PathBuf::from("/usr/bin/bwrap");
    let mut base = Vec::new();
    let mut bw = Vec::new();
    let mut sb: Vec<(Vec<Duration>, Vec<Duration>, Vec<Duration>)> =
        vec![Default::default(); helpers.len()];
    // The full sandbox with the helper executed per spawn (no fork server).
    let mut exec_each: Vec<Vec<Duration>> = vec![Vec::new(); helpers.len()];
    let full_exec = SandboxPolicy {
        fork_server: false,
        ..full.clone()
    };
    for _ in 0..n {
        let t = Instant::now();
        Command::new("/bin/true").status().unwrap();
        base.push(t.elapsed());
        if bwrap.exists() {
            let t = Instant::now();
            let st = Command::new(&bwrap)
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
            bw.push(t.elapsed());
        }
        for (i, h) in helpers.iter().enumerate() {
            let t = Instant::now();
            let mut c = spawn(&SpawnSpec {
                helper_exe: h.clone(),
                program: "/bin/true".into(),
                args: vec![],
                env: vec![],
                policy: full.clone(),
                workspace: Some(ws.path().to_path_buf()),
            })
            .unwrap();
            sb[i].0.push(t.elapsed());
            c.wait().unwrap();
            sb[i].1.push(t.elapsed());
            let t = Instant::now();
            let mut c = spawn(&SpawnSpec {
                helper_exe: h.clone(),
                program: "/bin/true".into(),
                args: vec![],
                env: vec![],
                policy: SandboxPolicy::unconfined(),
                workspace: Some(ws.path().to_path_buf()),
            })
            .unwrap();
            sb[i].2.push(t.elapsed());
            c.wait().unwrap();
            let t = Instant::now();
            let mut c = spawn(&SpawnSpec {
                helper_exe: h.clone(),
                program: "/bin/true".into(),
                args: vec![],
                env: vec![],
                policy: full_exec.clone(),
                workspace: Some(ws.path().to_path_buf()),
            })
            .unwrap();
            exec_each[i].push(t.elapsed());
            c.wait().unwrap();
        }
    }
    // Stage breakdown of the full sandbox (timings on), per helper.
    for h in &helpers {
        let mut stages: Vec<(String, Vec<u64>)> = Vec::new();
        for _ in 0..n {
            let mut c = spawn(&SpawnSpec {
                helper_exe: h.clone(),
                program: "/bin/true".into(),
                args: vec![],
                env: vec![],
                policy: SandboxPolicy {
                    timings: true,
                    ..full.clone()
                },
                workspace: Some(ws.path().to_path_buf()),
            })
            .unwrap();
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("n={n} loadavg {}", load.trim());
    let (_, b) = summary("fork+exec+wait /bin/true", base);
    let bwm = if bw.is_empty() {
        None
    } else {
        Some(summary("bwrap --unshare-all ... /bin/true (to exit)", bw).1)
    };
    for (h, ((e, t, u), x)) in helpers.iter().zip(sb.into_iter().zip(exec_each)) {
        let name = h.file_name().unwrap().to_string_lossy().to_string();
        let (_, xm) = summary(&format!("full [{name}] exec per spawn, to exec"), x);
        let (_, m) = summary(&format!("full [{name}] to exec"), e);
        let (_, mt) = summary(&format!("full [{name}] to exit"), t);
        summary(&format!("no layers [{name}] to exec"), u);
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
