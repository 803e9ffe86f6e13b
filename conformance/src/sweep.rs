//! Nothing outlives a launch: the conformance process makes itself the
//! child subreaper, so a daemon that double-forks out of a plugin's tree is
//! reparented to it instead of to init; after each launch every remaining
//! descendant is counted, killed and reaped.

use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

/// Makes orphans of our descendants our children. Best effort: without it
/// an escaped daemon of a direct launch is merely not found.
pub fn become_subreaper() -> Result<(), String> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| format!("cannot become the child subreaper: {e}"))
}

/// How long a killed tree's processes may take to die before the ones
/// still alive count as having outlived it (a sandbox's pid namespace is
/// torn down by the kernel just after its helper is reaped).
const GRACE: Duration = Duration::from_millis(500);

/// Reaps every descendant that dies within the grace, then kills and reaps
/// the rest; returns how many outlived the grace. Call only when no launch
/// is live (it reaps any child).
pub fn sweep() -> usize {
    let me = rustix::process::getpid().as_raw_nonzero().get() as u32;
    let end = Instant::now() + GRACE;
    while !descendants(me).is_empty() && Instant::now() < end {
        reap();
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut total = 0;
    // A dying process may fork once more: sweep until nothing is left.
    for _ in 0..5 {
        let found = descendants(me);
        if found.is_empty() {
            break;
        }
        total += found.len();
        for pid in &found {
            if let Some(p) = i32::try_from(*pid).ok().and_then(Pid::from_raw) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        reap();
    }
    total
}

fn reap() {
    while let Ok(Some(_)) = rustix::process::waitpid(None, WaitOptions::NOHANG) {}
}

/// Live descendants of `root` (threads are not listed in /proc's top level).
fn descendants(root: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let links: Vec<(u32, u32, bool)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            let mut f = rest.split_whitespace();
            let zombie = f.next()? == "Z";
            let ppid = f.next()?.parse::<u32>().ok()?;
            Some((pid, ppid, zombie))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(links.iter().filter(|l| l.1 == parent).map(|l| l.0));
        i += 1;
    }
    found.remove(0);
    // Zombies are only reaped, not counted: they are already gone.
    found.retain(|p| !links.iter().any(|l| l.0 == *p && l.2));
    found
}
