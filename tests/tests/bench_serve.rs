//! `sharedos-bench --only serve` as a real process, small (10 runs, SQLite):
//! it starts two real `sharedos serve` hosts, every run completes, live
//! events reach an observer on each host, and it prints its table with
//! each goal judged. No figure is judged here, only that each is there.

use std::process::Command;

use sharedos_tests::turns::workspace_bin;

#[test]
fn the_serve_family_runs_ten_runs_on_sqlite_and_prints_its_table() {
    let out = Command::new(workspace_bin("sharedos-bench"))
        .args(["--only", "serve", "--runs", "10", "--store", "sqlite"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout.contains("== serve, SQLite: 10 runs admitted"),
        "{stdout}"
    );
    assert!(!stdout.contains("PostgreSQL"), "{stdout}");
    for (row, goal) in [
        ("| admission |", "p99 ≤ 50 ms"),
        ("| admitted runs/s |", "≥ 100/s"),
        ("| event → SSE, same host |", "p99 ≤ 5 ms"),
        ("| event → SSE, cross host |", "p99 ≤ 50 ms"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.contains(row))
            .unwrap_or_else(|| panic!("no {row} row in {stdout}"));
        assert!(line.contains(goal), "{line}");
        assert!(
            line.ends_with("| met |") || line.ends_with("| NOT met |"),
            "{line}"
        );
    }
    assert!(stdout.contains("| run (to its end) |"), "{stdout}");
    // Observers on both hosts saw live events (the family refuses to print
    // a latency of no events).
    let observed = stdout
        .lines()
        .find(|l| l.contains("events observed same / cross host"))
        .unwrap();
    assert!(!observed.contains(", 0 /"), "{observed}");
    assert!(!observed.contains("/ 0 events"), "{observed}");
}
