//! A Node.js plugin's own `fetch` to its model route, through the gateway,
//! in the default sandbox with no memory setting: Node's HTTP client loads
//! its WebAssembly parser at the first request, which the old address-space
//! bound (RLIMIT_AS) made fail with `WebAssembly.instantiate(): Out of
//! memory` (docs/SECURITY.md, "Memory"). Observed from outside: the
//! `sharedos run` result, and what the model upstream received.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use sharedos_egress::mock::{MockModel, Wire, plan_script};
use sharedos_tests::egress::{egress_grant, key_file};
use sharedos_tests::plugin_bin;
use sharedos_tests::turns::{request, seat_toml};

/// A Node plugin on the TypeScript SDK (copied in as a package, not
/// linked) whose turn POSTs one chat completion to the `openai` route and
/// returns the HTTP status and the answer's first bytes.
fn node_plugin(base: &Path) -> std::path::PathBuf {
    let pkg = base.join("fetch-plugin");
    sharedos_tests::install_typescript_sdk(&pkg);
    std::fs::write(
        pkg.join("package.json"),
        r#"{"name": "fetch-plugin", "version": "0.1.0", "type": "module"}"#,
    )
    .unwrap();
    std::fs::write(
        pkg.join("main.mjs"),
        "import { complete, serve } from '@sharedos/plugin';\n\
         serve({\n\
         \x20 manifest: () => ({ id: 'fixture-node-fetch', version: '0.1.0', protocolVersion: '1' }),\n\
         \x20 async run(request, host) {\n\
         \x20   const url = `${process.env.SHAREDOS_EGRESS_URL}/openai/chat/completions`;\n\
         \x20   const answer = await fetch(url, {\n\
         \x20     method: 'POST',\n\
         \x20     headers: { 'content-type': 'application/json', authorization: 'Bearer sharedos-placeholder' },\n\
         \x20     body: JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'plan' }] }),\n\
         \x20   });\n\
         \x20   const text = await answer.text();\n\
         \x20   return complete({ status: answer.status, answer: text.slice(0, 2000) });\n\
         \x20 },\n\
         });\n",
    )
    .unwrap();
    pkg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_plugin_fetches_its_model_route_under_the_default_policy() {
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let base = sharedos_tests::plugin_tempdir();
    let pkg = node_plugin(base.path());
    let main = pkg.join("main.mjs");
    let key = key_file(base.path());
    // The default sandbox policy: no memory or address-space setting.
    let body = format!(
        "program = \"/usr/bin/node\"\nargs = [{main:?}]\nsandbox = {{ extraRoPaths = [{pkg:?}] }}\n\
         network = {{ routes = [{{ name = \"openai\", upstream = \"{upstream}\", secret = \"file:{key}\", api = \"openai\", allow = [\"loopback\"] }}] }}",
        upstream = model.base_url(),
        key = key.display(),
    );
    let config = base.path().join("host.toml");
    std::fs::write(
        &config,
        seat_toml("fixture-node-fetch", &body) + &egress_grant("alice-model", "openai", "request"),
    )
    .unwrap();
    let req = base.path().join("turn.json");
    let mut r = request("exec-node-fetch", json!(null), &[], 60_000);
    r["message"]["payload"] = json!({});
    std::fs::write(&req, r.to_string()).unwrap();

    let out = tokio::task::spawn_blocking(move || {
        Command::new(plugin_bin("sharedos"))
            .args(["run", "--config"])
            .arg(&config)
            .arg("--request")
            .arg(&req)
            .env_remove("SHAREDOS_LOG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(out.status.code(), Some(0), "{result:#}\n{err}");
    assert_eq!(
        result["metadata"]["runtime"]["sandbox"]["level"],
        sharedos_tests::full_level(),
        "{result:#}"
    );
    assert_eq!(result["output"]["status"], 200, "{result:#}");
    let answer = result["output"]["answer"].as_str().unwrap_or_default();
    assert!(answer.contains("files__write"), "{answer}");
    // The upstream saw exactly the plugin's request, with the real key and
    // without the placeholder.
    let seen = model.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, "POST");
    assert!(seen[0].path.ends_with("/chat/completions"), "{seen:?}");
    assert_eq!(seen[0].body["messages"][0]["content"], "plan", "{seen:?}");
    let auth: Vec<&str> = seen[0]
        .headers
        .iter()
        .filter(|(k, _)| k == "authorization")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        auth,
        [format!("Bearer {}", sharedos_tests::egress::REAL_KEY)],
        "{seen:?}"
    );
}
