//! Real work for the seccomp allowlist test as a static binary (as the
//! Codex CLI is): threads, a subprocess, file I/O in the working directory
//! (the workspace) and /tmp, a sleep, a Unix socket pair, the environment.
//! Prints one JSON line; exits 0. Built by the test with crt-static.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn main() {
    let sums: Vec<u64> = (0..4u64)
        .map(|i| std::thread::spawn(move || (0..1000u64).map(|x| x * i).sum()))
        .map(|h| h.join().unwrap())
        .collect();
    let sh = Command::new("/bin/sh").args(["-c", "echo sub:$((6*7))"]).output().unwrap();
    std::fs::write("rs-out.txt", "ws-ok").unwrap();
    let ws = std::fs::read_to_string("rs-out.txt").unwrap();
    let tmp_path = std::env::temp_dir().join("rs-tmp");
    std::fs::write(&tmp_path, "tmp-ok").unwrap();
    let tmp = std::fs::read_to_string(&tmp_path).unwrap();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(20));
    let slept = t0.elapsed() >= Duration::from_millis(20);
    let (mut a, mut b) = UnixStream::pair().unwrap();
    a.write_all(b"ping").unwrap();
    drop(a);
    let mut got = String::new();
    b.read_to_string(&mut got).unwrap();
    let env = std::env::var("SHAREDOS_RUNTIME_PROBE").unwrap_or_default();
    println!(
        "{{\"threads\":{sums:?},\"sh\":{:?},\"ws\":{ws:?},\"tmp\":{tmp:?},\"timer\":{slept},\"unix\":{got:?},\"env\":{env:?}}}",
        String::from_utf8_lossy(&sh.stdout).trim()
    );
}
