//! Real processes: the real helper against the probe binary.

mod common;

use common::*;
use sharedos_sandbox::{SandboxLevel, SandboxPolicy};

#[test]
fn probe_sees_a_strong_sandbox() {
    let (report, out, _err) = run(
        SandboxPolicy::default(),
        &["status", "fds", "uid", "env", "hostname", "cwd", "procs"],
    );
    eprintln!("{}", serde_json::to_string_pretty(&report).unwrap());
    eprintln!("{out}");
    assert_eq!(report.level, SandboxLevel::Strong, "{:?}", report.missing);
}
