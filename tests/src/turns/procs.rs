//! The processes of a turn, found by the marker in their environment or
//! by their parent, from `/proc`.

use std::time::{Duration, Instant};

use super::MARKER_ENV;

/// Live (not zombie) processes whose environment carries `marker`.
pub fn marked_pids(marker: &str) -> Vec<u32> {
    let needle = format!("{MARKER_ENV}={marker}");
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            continue;
        }
        if is_alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// A process exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// Polls until no process carries `marker`, or `bound` passed; returns the
/// survivors.
pub fn wait_gone(marker: &str, bound: Duration) -> Vec<u32> {
    let until = Instant::now() + bound;
    loop {
        let left = marked_pids(marker);
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs every process carrying `marker` (cleanup after a documented
/// escape, so a test does not leave sleepers behind).
pub fn kill_marked(marker: &str) {
    for pid in marked_pids(marker) {
        if let Ok(p) = i32::try_from(pid) {
            // SAFETY: kill(2) with a pid we found carrying our marker.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
    }
}

/// The pids of every live descendant of `root` (children first found by
/// walking `/proc/<pid>/stat`'s ppid field).
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (child, parent) in &parent_of {
            if *parent == p && !out.contains(child) {
                out.push(*child);
                frontier.push(*child);
            }
        }
    }
    out.retain(|p| is_alive(*p));
    out
}
