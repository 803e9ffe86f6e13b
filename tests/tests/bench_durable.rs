//! `sharedos-bench --only durable`'s measurement (the `sharedos-bench`
//! crate) through the real `sharedos run`: few calls, so it cannot rot.
//! Each run's figures come from where the bench says they do (the
//! plugin's clock, the host's /proc, the sink's own commit counters).

use sharedos_bench::durable::{Shape, bare_append_fsync, one_run};
use sharedos_tests::turns::workspace_bin;

/// The bench finds `sharedos` and the test plugin next to its binary.
fn exe() -> std::path::PathBuf {
    workspace_bin("sharedos-bench")
}

#[test]
fn sequential_calls_are_measured_through_sharedos_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = one_run(&exe(), dir.path(), "direct", Shape::Sequential, 8).unwrap();
    assert_eq!(run.calls, 8);
    assert_eq!(run.latencies_ns.len(), 8);
    assert!(run.latencies_ns.iter().all(|ns| *ns > 0));
    // A decision and an outcome per call, and the turn's own records.
    assert!(run.records >= 2 * 8 + 3, "{run:?}");
    assert!(run.syncs >= 1 && run.syncs <= run.records, "{run:?}");
    assert!(run.latency_us(0.5) > 0.0);
}

#[test]
fn calls_in_flight_are_measured_direct_and_sandboxed() {
    for launcher in ["direct", "sandbox"] {
        let dir = tempfile::tempdir().unwrap();
        let run = one_run(&exe(), dir.path(), launcher, Shape::InFlight(64), 200).unwrap();
        assert_eq!(run.calls, 200);
        assert!(run.latencies_ns.is_empty());
        assert!(run.wall.as_nanos() > 0);
        assert!(run.records >= 2 * 200 + 3, "{launcher}: {run:?}");
        assert!(run.syncs >= 1 && run.syncs <= run.records, "{run:?}");
        assert!(run.calls_per_s() > 0.0);
    }
}

#[test]
fn the_floor_is_a_bare_append_and_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let (median, _cpu) = bare_append_fsync(dir.path(), 5).unwrap();
    assert!(median.as_nanos() > 0);
    // The floor's file is removed after.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
