//! A stand-in host for the lifeline test: it spawns a sandboxed probe
//! daemon, prints the helper's pid, and waits to be killed. When it dies,
//! nothing it launched may survive.
//!
//! Usage: sharedos-sandbox-host-stub HELPER PROBE WORKSPACE TOKEN

use sharedos_sandbox::{SandboxPolicy, SpawnSpec, spawn};

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() != 4 {
        eprintln!("usage: sharedos-sandbox-host-stub HELPER PROBE WORKSPACE TOKEN");
        std::process::exit(2);
    }
    let child = spawn(&SpawnSpec {
        helper_exe: a[0].clone().into(),
        program: a[1].clone().into(),
        args: vec![format!("daemon:{}", a[3]).into()],
        env: vec![],
        policy: SandboxPolicy::default(),
        workspace: Some(a[2].clone().into()),
    })
    .expect("spawn");
    println!("{}", child.pid);
    // Hold the child (and its lifeline) until this process is killed.
    loop {
        std::thread::park();
    }
}
