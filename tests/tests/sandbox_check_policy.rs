//! `sharedos sandbox check --runtime` shows the policy a turn gets: for a
//! runtime with an egress route and for a harness runtime serving MCP over
//! HTTP, the seccomp mode and the network rule the check prints are the
//! ones in a real turn's provenance (`metadata.runtime.sandbox`).

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use sharedos_tests::egress::{egress_grant, key_file, run_request};
use sharedos_tests::harness::{HarnessCase, fixture_dir, host_toml, run_harness, script};
use sharedos_tests::plugin_bin;
use sharedos_tests::turns::{request, testplugin_host_toml};

/// `(seccomp mode, network)` from the check's `policy:` line for runtime
/// `id` of the configuration `text`, written into `dir`.
fn checked_policy(dir: &Path, text: &str, id: &str) -> (String, String) {
    let config = dir.join("check.toml");
    std::fs::write(&config, text).unwrap();
    let out = Command::new(plugin_bin("sharedos"))
        .args(["sandbox", "check", "--runtime", id, "--config"])
        .arg(&config)
        .env_remove("SHAREDOS_LOG")
        .output()
        .expect("run sharedos sandbox check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("policy: seccomp "))
        .unwrap_or_else(|| {
            panic!(
                "no policy line in\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let (mode, net) = line
        .split_once(" mode, network ")
        .unwrap_or_else(|| panic!("unexpected policy line {line:?}"));
    (mode.to_owned(), net.to_owned())
}

/// `(seccomp mode, network)` of a turn's sandbox report.
fn turn_policy(sandbox: &Value) -> (String, String) {
    let s = |v: &Value| {
        v.as_str()
            .unwrap_or_else(|| panic!("{sandbox:#}"))
            .to_owned()
    };
    (
        s(&sandbox["seccomp"]["mode"]),
        s(&sandbox["landlock"]["net"]),
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn an_egress_runtime_is_checked_with_the_policy_its_turn_gets() {
    let _serial = sharedos_tests::serial();
    let dir = tempfile::tempdir().unwrap();
    let network = format!(
        "launcher = \"sandbox\"\nnetwork = {{ routes = [{{ name = \"openai\", upstream = \"http://127.0.0.1:9\", secret = \"file:{}\", api = \"openai\", allow = [\"loopback\"] }}] }}\n",
        key_file(dir.path()).display()
    );
    let text = testplugin_host_toml("check-policy", "sandbox", 30_000)
        .replace("launcher = \"sandbox\"\n", &network)
        + &egress_grant("alice-model", "openai", "request");
    let req = request("check-policy-1", Value::Null, &[], 30_000).to_string();
    let turn = runtime().block_on(run_request(
        dir.path(),
        &text,
        "sharedos-testplugin",
        &req,
        None,
    ));
    let meta = serde_json::to_value(&turn.result.metadata).unwrap();
    let sandbox = &meta["runtime"]["sandbox"];
    let got = turn_policy(sandbox);
    assert_eq!(got, ("namespace+egress".into(), "tcp-connect:8787".into()));
    assert_eq!(
        checked_policy(dir.path(), &text, "sharedos-testplugin"),
        got
    );
}

#[test]
fn a_harness_runtime_is_checked_with_the_policy_its_turn_gets() {
    let _serial = sharedos_tests::serial();
    let dir = fixture_dir();
    let cli = script(dir.path(), "cli.sh", "#!/bin/sh\necho done\n");
    let harness = format!(
        "[runtimes.harness]\ncommand = {cli:?}\nmcp = \"http\"\n\
         env = {{ SHAREDOS_TEST_MARKER = \"MARKER\" }}\nfinal = {{ from = \"stdout\" }}\n",
        cli = cli.display().to_string(),
    );
    let case = || HarnessCase::new(&harness, vec![dir.path().to_path_buf()]);
    let turn = runtime().block_on(run_harness(case()));
    turn.assert_no_survivor();
    let got = turn_policy(&turn.metadata()["runtime"]["sandbox"]);
    assert_eq!(got.1, "tcp-bind-connect:8788", "{:#}", turn.json());
    let text = host_toml(&case(), "check-policy");
    assert_eq!(checked_policy(dir.path(), &text, "sharedos.test.mcp"), got);
}
