//! `sharedos-bench --only spawn`'s measurement (the `sharedos-bench`
//! crate) against the real sandbox helper: every configuration measured,
//! each at the level it claims, and the full sandbox's stages.

use sharedos_sandbox::SandboxLevel;
use sharedos_tests::plugin_bin;

#[test]
fn bench_measures_every_configuration() {
    let r = sharedos_bench::spawn::bench(&plugin_bin("sharedos-sandbox-helper"), 2).unwrap();
    assert_eq!(r.iterations, 2);
    assert!(r.configurations.len() >= 10);
    let full = r
        .configurations
        .iter()
        .find(|c| c.name == "full sandbox")
        .unwrap();
    assert_eq!(full.level, Some(full_level()));
    assert_eq!(full.runs, 2);
    assert!(full.exec_min_us > 0);
    assert_eq!(r.prepared.level, Some(full_level()));
    assert_eq!(r.prepared.runs, 2);
    assert!(r.prepared.exec_min_us > 0);
    assert!(r.layer_costs.iter().any(|c| c.layer == "netns"));
    // The full sandbox's spawn, stage by stage, host and helper side.
    let has = |process: &str, prefix: &str| {
        r.stages
            .iter()
            .any(|s| s.process == process && s.stage.starts_with(prefix))
    };
    assert!(has("host", "request_queued"), "{:?}", r.stages);
    assert!(has("helper", "request_received"));
    assert!(has("pid1", "root_built"));
    assert!(has("plugin", "seccomp_installed"));
    assert!(has("host", "report_eof"));
}

fn full_level() -> SandboxLevel {
    if sharedos_sandbox::cgroup::memory_delegated() {
        SandboxLevel::Strong
    } else {
        SandboxLevel::Isolated
    }
}
