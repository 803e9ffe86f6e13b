//! A plugin stopped by a limit the kernel enforced: the result names the
//! limit (docs/PROTOCOL.md, "How the process ended"). Through the
//! `sharedos run` binary, in the full sandbox: `RLIMIT_CPU` ends a
//! spinning plugin with `SIGXCPU`, named in `exit.limit`; a tree that
//! reaches its cgroup's `pids.max` has it in `limitsHit` with the forks
//! refused.

use serde_json::{Value, json};
use sharedos_tests::turns::{request, sharedos_run, testplugin_host_toml, wait_gone};

/// The test plugin's host.toml in the full sandbox, with `sandbox` as its
/// `[runtimes.sandbox]` inline table.
fn config(marker: &str, sandbox: &str) -> String {
    let config = testplugin_host_toml(marker, "sandbox", 60_000);
    let edited = config.replacen(
        "launcher = \"sandbox\"",
        &format!("launcher = \"sandbox\"\nsandbox = {sandbox}"),
        1,
    );
    assert!(edited.contains("sandbox = {"), "{edited}");
    edited
}

/// `metadata.runtime.process` of a result.
fn process(result: &Value) -> &Value {
    &result["metadata"]["runtime"]["process"]
}

#[test]
fn a_plugin_past_its_cpu_time_limit_ends_with_sigxcpu_and_the_limit_named() {
    let marker = format!("limits-cpu-{}", std::process::id());
    let config = config(&marker, "{ rlimits = { cpuSeconds = 1 } }");
    let turn = request("limits-cpu", json!([{"op": "spin"}]), &[], 60_000);
    let run = sharedos_run(&config, &turn);
    let exit = &process(&run.result)["exit"];
    assert_eq!(exit["name"], "SIGXCPU", "{:#}\n{}", run.result, run.stderr);
    assert_eq!(exit["limit"], "RLIMIT_CPU", "{exit}");
    assert_eq!(run.result["status"], "failed", "{:#}", run.result);
    assert!(wait_gone(&marker, std::time::Duration::from_secs(10)).is_empty());
}

#[test]
fn a_tree_at_its_pids_max_has_the_refused_forks_in_limits_hit() {
    if !std::path::Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists()
        && !std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
            .unwrap_or_default()
            .contains("pids")
    {
        panic!("no pids controller on this machine: the sandbox's pids.max cannot be tested");
    }
    let marker = format!("limits-pids-{}", std::process::id());
    let config = config(&marker, "{ cgroup = { pidsMax = 16 } }");
    let script = json!([{"op": "fork", "n": 40}, {"op": "exit", "code": 3}]);
    let turn = request("limits-pids", script, &[], 60_000);
    let run = sharedos_run(&config, &turn);
    let process = process(&run.result);
    let sandbox = &run.result["metadata"]["runtime"]["sandbox"];
    if sandbox["cgroup"]["pids_max"].is_null() {
        // A host that cannot make the cgroup (not root, none delegated)
        // says so in the report, and then has no counter to read.
        assert!(process.get("limitsHit").is_none(), "{process}");
        eprintln!("skipped: no pids cgroup here ({})", sandbox["cgroup"]);
        return;
    }
    let hit = &process["limitsHit"][0];
    assert_eq!(hit["limit"], "pids.max", "{:#}\n{}", run.result, run.stderr);
    assert_eq!(hit["value"], 16, "{hit}");
    assert!(hit["refused"].as_u64().unwrap_or(0) > 0, "{hit}");
    assert_eq!(process["exit"]["code"], 3, "{process}");
    assert!(wait_gone(&marker, std::time::Duration::from_secs(10)).is_empty());
}

#[test]
fn a_plugin_that_hits_no_limit_has_no_limits_hit() {
    let marker = format!("limits-none-{}", std::process::id());
    let config = config(&marker, "{ cgroup = { pidsMax = 64 } }");
    let turn = request(
        "limits-none",
        json!([{"op": "exit", "code": 4}]),
        &[],
        60_000,
    );
    let run = sharedos_run(&config, &turn);
    let process = process(&run.result);
    assert_eq!(
        process["exit"]["code"], 4,
        "{:#}\n{}",
        run.result, run.stderr
    );
    assert!(process.get("limitsHit").is_none(), "{process}");
    assert!(process["exit"].get("limit").is_none(), "{process}");
}
