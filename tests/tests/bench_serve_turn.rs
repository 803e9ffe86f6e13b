//! `sharedos-bench --only serve-turn`'s measurement (the `sharedos-bench`
//! crate) through a real `sharedos serve` with prepared sandboxes: few
//! rounds, so it cannot rot. The served runs are counted only when their
//! result says they ran in a prepared sandbox.

use sharedos_bench::serveturn::measure;
use sharedos_tests::turns::workspace_bin;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_zero_call_run_is_measured_against_its_floors() {
    let exe = workspace_bin("sharedos-bench");
    let f = measure(&exe, 3, 20).await.unwrap();
    // Every round is one served run, counted or not, and one in-process turn.
    assert_eq!(f.served.iterations + f.unprepared, 3);
    assert!(f.served.iterations >= 1);
    assert_eq!(f.in_process.iterations, 3);
    assert_eq!(f.raw.iterations, 20);
    for figure in [&f.served, &f.in_process, &f.raw] {
        assert!(figure.median_us > 0.0, "{}", figure.name);
    }
    assert!(f.ratio() > 0.0);
    // The host's own account covers the runs it served.
    let run = f
        .host_means_ms
        .iter()
        .find(|(name, _)| *name == "run stored → ended")
        .and_then(|(_, v)| *v);
    assert!(run.is_some_and(|ms| ms > 0.0), "{:?}", f.host_means_ms);
}
