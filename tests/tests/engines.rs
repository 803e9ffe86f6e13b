//! The same cases in every engine (tests/src/engines.rs: the namespace
//! sandbox, gVisor and the microVM): the conformance battery, a model turn
//! through the egress gateway, what else a plugin with a network policy
//! can reach, the adversary's attacks that apply to the engine, what
//! bounds a plugin, harness turns (in the engines that run a harness; the
//! others refuse one at load), and what each turn leaves. Each case runs
//! in every engine of [`ENGINES`]; a machine without an engine's tool
//! (runsc; QEMU or the guest kernel) fails the case with the fix.
//!
//! The microVM boots under TCG on machines without nested virtualization
//! (3–76 s a boot under load): its turns get deadlines that cover a boot,
//! and no case judges by time.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_egress::mock::wire::{calls_turn, text_turn};
use sharedos_egress::mock::{MockModel, Reply, ScriptedCall, Wire, plan_script};
use sharedos_host::config::HostConfig;
use sharedos_protocol::ExecutionStatus;
use sharedos_sandbox::SandboxPolicy;
use sharedos_tests::bait::{HostBait, TurnRun, TurnSpec, leaked_secrets, run_turn, serial};
use sharedos_tests::egress::{
    Bystander, DEMO_REQUEST, REAL_KEY, Turn, egress_grant, key_file, model_text, probe_targets,
    run_request_in,
};
use sharedos_tests::engines::{ENGINES, Engine};
use sharedos_tests::harness::{
    HarnessCase, fixture_dir, harness_text, http_harness, mcp_client, python_with_mcp, run_harness,
};
use sharedos_tests::leftovers::processes_naming_after;
use sharedos_tests::plugin_bin;
use sharedos_tests::turns::{request as testplugin_request, testplugin_host_toml};
use sharedos_tests::vendors::{
    Vendor, VendorCase, assert_key_kept, run_vendor, unique_marker, vendor_text,
};

/// The sandbox report of a turn's result.
fn report(turn: &Turn) -> Value {
    turn.result.metadata["runtime"]["sandbox"].clone()
}

/// What the engine's launch left after the turn: nothing. gVisor: no
/// process names the container, its bundle (and runsc's state) is gone.
/// The microVM: no QEMU names the run's directory (which held its image
/// and, with a network policy, the gateway channel's socket), and the
/// directory is gone. The namespace sandbox's own leftovers checks are
/// its suites' (sandbox_lifetime.rs); here its report names the engine.
fn nothing_left(engine: Engine, report: &Value) {
    assert_eq!(report["engine"], engine.report_engine(), "{report}");
    // The teardown of a finished turn runs off its path: wait for it.
    sharedos_host::process::settle_kills();
    let (name, path) = match engine {
        Engine::Sandbox => return,
        Engine::Gvisor => (&report["container"], &report["bundle"]),
        Engine::Microvm => (&report["run_dir"], &report["run_dir"]),
    };
    let name = name.as_str().expect("the report names the launch");
    let path = path.as_str().expect("the report names the launch's files");
    let left = processes_naming_after(name, Duration::from_secs(10));
    assert!(left.is_empty(), "{name} outlived its turn: {left:?}");
    assert!(!Path::new(path).exists(), "{path} is left");
}

/// What is left after every turn of a case in `engine`: for the microVM,
/// no QEMU of this test process at all (warm or cold) and no run
/// directory of it in the temporary directory.
fn no_vm_left(engine: Engine) {
    if engine != Engine::Microvm {
        return;
    }
    let prefix = format!("sharedos-microvm-{}-", std::process::id());
    let left = processes_naming_after(&prefix, Duration::from_secs(10));
    assert!(left.is_empty(), "a QEMU outlived its case: {left:?}");
    let dirs: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    assert!(dirs.is_empty(), "run directories left: {dirs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// One test of this file at a time: the attack cases count every
// descendant of the test process as a survivor.
#[allow(clippy::await_holding_lock)]
async fn a_model_turn_goes_through_the_gateway_in_every_engine() {
    let _serial = serial();
    for engine in ENGINES {
        let e = engine.name();
        let dir = tempfile::tempdir().unwrap();
        let model = MockModel::start(plan_script(Wire::OpenaiChat))
            .await
            .unwrap();
        let key = key_file(dir.path());
        let text = engine.configure(&model_text(
            "openai-chat",
            &model.base_url(),
            &key,
            "",
            "",
            true,
        ));
        let turn = run_request_in(
            engine,
            dir.path(),
            &text,
            "sharedos.standard",
            DEMO_REQUEST,
            None,
        )
        .await;
        let result = &turn.result;
        assert_eq!(
            result.status,
            ExecutionStatus::Succeeded,
            "{e}: {result:#?}"
        );
        assert_eq!(
            result.output.as_ref().unwrap()["text"],
            "Plan written.",
            "{e}"
        );
        let written = std::fs::read_to_string(dir.path().join("files/demo/alice/notes/plan.md"));
        assert_eq!(written.unwrap(), "step one", "{e}");
        // The model saw both requests, with the real key the gateway added.
        let seen = model.seen();
        assert_eq!(seen.len(), 2, "{e}: {seen:?}");
        let bearer = format!("Bearer {REAL_KEY}");
        for s in &seen {
            assert_eq!(s.authorization(), Some(bearer.as_str()), "{e}");
        }
        let report = report(&turn);
        let network = report["network"].as_str().unwrap_or_default();
        match engine {
            Engine::Gvisor => {
                assert!(network.starts_with("the egress gateway only"), "{report}")
            }
            // No network device; the gateway over the guest's virtio port vport0p2.
            Engine::Microvm => assert!(network.contains("vport0p2"), "{report}"),
            Engine::Sandbox => {}
        }
        nothing_left(engine, &report);
        no_vm_left(engine);
    }
}

/// The test plugin with a route to `upstream`, in `engine`.
fn testplugin_text(engine: Engine, upstream: &str, key_file: &Path) -> String {
    let network = format!(
        "{}network = {{ routes = [{{ name = \"openai\", upstream = \"{upstream}\", secret = \"file:{}\", api = \"openai\", allow = [\"loopback\"] }}] }}\n",
        engine.entry_keys(),
        key_file.display()
    );
    let launcher = format!("launcher = \"{}\"\n", engine.name());
    testplugin_host_toml("engines", engine.name(), 60_000).replace(&launcher, &network)
        + &egress_grant("alice-model", "openai", "request")
}

/// The runtime events (`{type, data}`) the test plugin emitted.
fn emitted(turn: &Turn) -> Vec<Value> {
    turn.events
        .iter()
        .filter(|e| e.kind.as_str() == "runtime.event")
        .map(|e| e.data.clone().into_value())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// One test of this file at a time: the attack cases count every
// descendant of the test process as a survivor.
#[allow(clippy::await_holding_lock)]
async fn a_plugin_with_a_network_policy_reaches_the_gateway_and_nothing_else_in_every_engine() {
    let _serial = serial();
    for engine in ENGINES {
        let e = engine.name();
        let dir = tempfile::tempdir().unwrap();
        let model = MockModel::start(plan_script(Wire::OpenaiChat))
            .await
            .unwrap();
        let bystander = Bystander::start().await;
        let targets = probe_targets(bystander.port, model.port);
        let script = json!([{"op": "net_probe", "targets": targets, "resolve": "example.com"}]);
        let text = testplugin_text(engine, &model.base_url(), &key_file(dir.path()));
        let request = testplugin_request("engines-net", script, &[], 60_000).to_string();
        let turn = run_request_in(
            engine,
            dir.path(),
            &text,
            "sharedos-testplugin",
            &request,
            None,
        )
        .await;
        assert_eq!(
            turn.result.status,
            ExecutionStatus::Succeeded,
            "{e}: {:#?}",
            turn.result
        );
        let emitted = emitted(&turn);
        let probe = &emitted
            .iter()
            .find(|v| v["type"] == "net_probe")
            .unwrap_or_else(|| panic!("{e}: no probe event: {emitted:?}"))["data"];
        // Only the gateway's own listener answers.
        assert_eq!(probe[targets[4].as_str()], "connected", "{e}: {probe}");
        for t in &targets[..4] {
            let got = probe[t.as_str()].as_str().unwrap_or_default();
            assert!(!got.is_empty() && got != "connected", "{e}: {t}: {probe}");
        }
        let resolved = probe["resolve example.com"].as_str().unwrap_or_default();
        assert!(!resolved.starts_with("resolved"), "{e}: {probe}");
        assert_ne!(probe["raw"], "created", "{e}: {probe}");
        // Observed on the host: nothing reached the bystander or the model.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(bystander.accepted(), 0, "{e}");
        assert!(model.seen().is_empty(), "{e}: {:?}", model.seen());
        nothing_left(engine, &report(&turn));
        no_vm_left(engine);
    }
}

/// The engines that run a harness, each engine that does not checked to
/// refuse `text` (a harness runtime's host.toml in that engine) at load
/// with its reason, so a harness case cannot pass there by running
/// nothing.
fn harness_engines(text: impl Fn(Engine) -> String) -> Vec<Engine> {
    for engine in ENGINES.into_iter().filter(|e| !e.runs_harness()) {
        let text = text(engine);
        let dir = tempfile::tempdir().unwrap();
        let refused = HostConfig::parse(&text, "harness.toml", dir.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let reason = format!(
            "runtimes[0].harness: not available with launcher = \"{}\"",
            engine.name()
        );
        assert!(
            refused.contains(&reason) && refused.contains("use launcher = \"sandbox\""),
            "{}: the harness entry was not refused at load with its reason: {refused:?}\n{text}",
            engine.name()
        );
    }
    ENGINES.into_iter().filter(|e| e.runs_harness()).collect()
}

/// The harness's MCP server over HTTP (`mcp = "http"`): the real Python
/// `mcp` client, seated by `sharedos-harness`, reaches the harness's
/// listener on the engine's own loopback and calls tools through the
/// envelope: a write, a read of it, an ungranted delete.
#[test]
fn a_harness_turn_over_mcp_http_runs_in_every_engine() {
    let _serial = serial();
    let rt = sharedos_tests::blocking_runtime();
    let steps = json!([
        {"tool": "files__write", "args": {"path": "notes/h.md", "content": "over http"}},
        {"tool": "files__read", "args": {"path": "notes/h.md"}},
        {"tool": "files__delete", "args": {"path": "notes/h.md"}},
    ]);
    let case_in = |engine: Engine, dir: &Path| {
        let py = python_with_mcp();
        let client = mcp_client(dir);
        let harness = http_harness(&py.exe, &client, &steps);
        let mut ro = py.ro_paths;
        ro.push(dir.to_path_buf());
        let mut case = HarnessCase::new(&harness, ro);
        case.engine = engine;
        case
    };
    let engines = harness_engines(|engine| {
        let dir = fixture_dir();
        harness_text(&case_in(engine, dir.path()), "refused")
    });
    for engine in engines {
        let e = engine.name();
        let dir = fixture_dir();
        let mut case = case_in(engine, dir.path());
        case.timeout_ms = 120_000;
        let turn = rt.block_on(run_harness(case));
        turn.assert_no_survivor();
        assert_eq!(turn.status(), "succeeded", "{e}: {:#}", turn.json());
        let client = turn.client();
        assert_eq!(client["unauthorized"], json!([401, 401]), "{e}: {client}");
        let r = &client["results"];
        assert_eq!(r[0]["isError"], false, "{e}: {r}");
        assert!(
            r[1]["text"]
                .as_str()
                .unwrap_or_default()
                .contains("over http"),
            "{e}: {r}"
        );
        assert_eq!(r[2]["isError"], true, "{e}: {r}");
        assert_eq!(turn.events("tool.requested").len(), 3, "{e}");
        nothing_left(engine, &turn.metadata()["runtime"]["sandbox"]);
    }
}

/// A vendor CLI in each engine: the real Codex CLI seated over streamable
/// HTTP (`mcp = "http"`), its model a scripted mock on the host reached
/// only through the egress gateway: one granted tool call through the
/// envelope, the final message as the output, the real key kept from the
/// CLI.
#[test]
fn a_codex_turn_over_mcp_http_through_the_gateway_runs_in_every_engine() {
    let _serial = serial();
    let rt = sharedos_tests::blocking_runtime();
    let case_in = |engine: Engine| VendorCase {
        vendor: Vendor::Codex,
        prompt: json!("Write a note for the team, then tell me you did."),
        tools: vec!["files.read", "files.write", "files.list"],
        timeout_ms: 120_000,
        http: true,
        max_tool_calls: None,
        route_granted: true,
        engine,
    };
    let engines = harness_engines(|engine| {
        let dir = tempfile::tempdir().unwrap();
        let mock = rt.block_on(MockModel::start(vec![])).unwrap();
        vendor_text(&case_in(engine), dir.path(), &mock, "refused")
    });
    for engine in engines {
        let e = engine.name();
        let marker = unique_marker();
        let args = r#"{"path": "notes/http.md", "content": "over http"}"#;
        let call = ScriptedCall {
            id: "call_1",
            namespace: Some("mcp__sharedos"),
            name: "files__write",
            arguments: args,
        };
        let (turn, seen) = rt.block_on(async {
            let mock = MockModel::start(vec![
                Reply::Stream(calls_turn(Wire::OpenaiResponses, &[call])),
                Reply::Stream(text_turn(Wire::OpenaiResponses, &["Done over HTTP."])),
            ])
            .await
            .unwrap();
            let turn = run_vendor(case_in(engine), &mock, &marker).await;
            (turn, mock.seen())
        });
        let v = turn.json();
        assert_eq!(v["status"], "succeeded", "{e}: {v:#}");
        assert_eq!(v["output"], "Done over HTTP.", "{e}: {v:#}");
        assert_eq!(seen.len(), 2, "{e}: {seen:?}");
        let invoked: Vec<(Option<String>, Value)> = turn
            .audit_of("tool.invoked")
            .iter()
            .map(|r| (r.tool.clone(), serde_json::to_value(r.outcome).unwrap()))
            .collect();
        assert_eq!(
            invoked,
            vec![(Some("files.write".to_owned()), json!("succeeded"))],
            "{e}"
        );
        assert_key_kept(&turn, &seen, Vendor::Codex);
        nothing_left(engine, &v["metadata"]["runtime"]["sandbox"]);
    }
}

/// The adversary's attacks that apply to any container, in each engine,
/// with every piece of bait laid on the host: file escapes (C01–C07,
/// C29), the network (C09, C11, C13, C14, C19; never C17, the vsock
/// socket), other processes and /proc (C20–C25), inherited fds and
/// credentials in the environment (C27, C28). Judged on the host side
/// (the bait files, listeners, the victim) as well as by the receipts
/// ([`worked_in`]: the one receipt the microVM judges otherwise).
#[test]
fn the_adversarys_container_attacks_are_stopped_in_every_engine() {
    const IDS: [&str; 21] = [
        "C01", "C02", "C03", "C04", "C05", "C06", "C07", "C29", "C09", "C11", "C13", "C14", "C19",
        "C20", "C21", "C22", "C23", "C27", "C28", "C25", "C24",
    ];
    for engine in ENGINES {
        let e = engine.name();
        let _serial = serial();
        let mut bait = HostBait::lay();
        let policy = bait.policy();
        let mut json = bait.json();
        json["allow_kill_all"] = true.into();
        let run = run_turn(
            TurnSpec::new(policy, json)
                .only(&IDS)
                .timeout_ms(with_boot(engine, 90_000))
                .engine(engine),
        );
        let h = bait.inspect();
        let secrets = bait.secrets.clone();
        bait.reap_victim();
        assert_eq!(run.status(), "succeeded", "{e}: {}", run.error_text());
        let r = run.receipts();
        let missing: Vec<&str> = IDS
            .iter()
            .copied()
            .filter(|id| !r.contains_key(*id))
            .collect();
        assert!(missing.is_empty(), "{e}: no receipt from {missing:?}");
        for id in ["C23", "C25"] {
            eprintln!("{e}: {id}: {}", r[id]["observed"]);
        }
        let worked: Vec<(&String, &Value)> = r
            .iter()
            .filter(|(id, v)| worked_in(engine, id, v))
            .collect();
        assert!(worked.is_empty(), "{e}: attacks that worked: {worked:#?}");
        for f in [
            "secret",
            "ssh_key",
            "aws_credentials",
            "host_tmp",
            "codex_auth",
        ] {
            assert_eq!(h.files[f], None, "{e}: the host's {f} was touched");
        }
        assert!(
            h.pwned.is_empty(),
            "{e}: files written on the host: {:?}",
            h.pwned
        );
        assert_eq!(h.tcp_accepts, 0, "{e}: C09 the host's listener accepted");
        assert_eq!(
            h.udp_datagrams, 0,
            "{e}: C11 the host's socket got datagrams"
        );
        assert_eq!(
            h.unix_accepts, 0,
            "{e}: C13 the host's unix socket accepted"
        );
        assert_eq!(
            h.abstract_accepts, 0,
            "{e}: C14 the abstract socket accepted"
        );
        assert_eq!(
            h.victim_tracer.as_deref(),
            Some("0"),
            "{e}: C20 the victim was traced"
        );
        assert!(h.victim_alive, "{e}: C24/C25 the victim died");
        let text = serde_json::to_string(&run.json()).unwrap();
        let leaked = leaked_secrets(&text, &secrets);
        assert!(leaked.is_empty(), "{e}: secrets in the result: {leaked:?}");
        assert!(run.survivors.is_empty(), "{e}: {:?}", run.survivors);
        nothing_left(engine, &run.sandbox_report());
        no_vm_left(engine);
    }
}

/// The most a microVM's boot may take under TCG on a loaded machine (the
/// launcher's own bound); a turn's deadline covers its launch.
const BOOT_ALLOWANCE_MS: u64 = 120_000;

/// A deadline of `ms` for what the plugin does, in `engine`: the
/// microVM's turns get its boot on top.
fn with_boot(engine: Engine, ms: u64) -> u64 {
    match engine {
        Engine::Microvm => ms + BOOT_ALLOWANCE_MS,
        Engine::Sandbox | Engine::Gvisor => ms,
    }
}

/// Whether the attack `id` worked in `engine`, by its receipt. Every
/// attack applies in every engine, and in the microVM each is judged as
/// elsewhere (the host's files, listeners and victim are in another
/// kernel, so the file, network and process attacks find nothing of the
/// host) but one:
/// - C23 (see other processes) counts more than 4 pids in `/proc` as a
///   leak, the most a private pid namespace holds (its init, the plugin,
///   a child or two). A guest's `/proc` lists the guest kernel's own
///   threads and its init (dozens), none of the host's; there only the
///   victim (a host process) in the list would be a leak, and the
///   receipt says whether it was.
///
/// C25 (`kill(-1)`) is not attempted in the microVM: the adversary
/// refuses it where `/proc` lists more than 8 processes; the host-side
/// check (the victim alive) stands in every engine.
fn worked_in(engine: Engine, id: &str, receipt: &Value) -> bool {
    if engine == Engine::Microvm && id == "C23" {
        let observed = receipt["observed"].as_str().unwrap_or_default();
        return !observed.contains("victim visible: false");
    }
    receipt["blocked"] == false
}

/// One attack `id` of the adversary with `bait`, under the default policy
/// in `engine`, its deadline `timeout_ms`.
fn attack(engine: Engine, id: &str, bait: Value, timeout_ms: u64) -> TurnRun {
    run_turn(
        TurnSpec::new(SandboxPolicy::default(), bait)
            .only(&[id])
            .timeout_ms(timeout_ms)
            .engine(engine),
    )
}

/// What bounds a plugin in each engine: a fork bomb stops at the policy's
/// `RLIMIT_NPROC` (C30; in the microVM the guest init sets it), a 2 GiB
/// stdout line at the host's framing limit (C42; in the microVM it
/// crosses the serial line), and a plugin sleeping through the abort
/// (C37) is killed at the deadline; each leaves nothing. The C37 receipt,
/// sent before the plugin starts sleeping, shows the deadline came while
/// the plugin ran (not during a microVM's boot): the microVM's deadline
/// is set from the boot the C30 turn measured.
#[test]
fn a_fork_bomb_a_huge_line_and_an_ignored_abort_are_bounded_in_every_engine() {
    for engine in ENGINES {
        let e = engine.name();
        let _serial = serial();
        let mut policy = SandboxPolicy::default();
        policy.rlimits.nproc = Some(64);
        let run = run_turn(
            TurnSpec::new(policy, json!({"fork_count": 300}))
                .only(&["C30"])
                .timeout_ms(with_boot(engine, 60_000))
                .engine(engine),
        );
        let c30 = &run.receipts()["C30"];
        assert_eq!(c30["blocked"], true, "{e}: C30 fork bomb: {c30}");
        assert!(run.survivors.is_empty(), "{e}: C30 {:?}", run.survivors);
        nothing_left(engine, &run.sandbox_report());
        // A microVM's boot, as this machine does it now.
        let boot_ms = run.sandbox_report()["boot_ms"].as_u64().unwrap_or(0);

        let run = attack(
            engine,
            "C42",
            json!({"line_mib": 2048}),
            with_boot(engine, 20_000),
        );
        assert_eq!(
            (run.status().as_str(), run.code().as_deref()),
            ("failed", Some("runtime_failed")),
            "{e}: C42 {}",
            run.error_text()
        );
        assert!(
            run.error_text().contains("frame_too_large"),
            "{e}: C42 {}",
            run.error_text()
        );
        nothing_left(engine, &run.sandbox_report());

        // Three boots' worth for the microVM (boots vary under load), so
        // the deadline comes while the plugin sleeps.
        let deadline = 3000 + 3 * boot_ms;
        let run = attack(engine, "C37", json!({"hang_secs": 300}), deadline);
        assert!(
            run.status() == "cancelled" || run.code().as_deref() == Some("runtime_failed"),
            "{e}: C37 {} {:?}",
            run.status(),
            run.code()
        );
        assert!(
            run.receipts().contains_key("C37"),
            "{e}: C37: the deadline ({deadline} ms) came before the plugin ran: {:#}",
            run.json()
        );
        assert!(run.survivors.is_empty(), "{e}: C37 {:?}", run.survivors);
        nothing_left(engine, &run.sandbox_report());
        no_vm_left(engine);
    }
}

/// The conformance battery (`sharedos conformance`, every check through
/// the real host's launcher and envelope) passes in each engine with the
/// Rust echo plugin: each check launches it afresh in the engine (a VM
/// boot per check in the microVM, the boot part of the launch), and the
/// last check finds no process that outlived its launch. Every check
/// passes in every engine: the deadline checks (`drain`, `abort`) add
/// twice a measured launch to their deadlines where a launch is slow (a
/// microVM's boot under TCG), so the deadline finds the plugin up.
#[test]
fn the_conformance_battery_passes_in_every_engine() {
    let _serial = serial();
    let echo = plugin_bin("sharedos-echo");
    // The microVM's guest init is looked up beside `sharedos`.
    plugin_bin("sharedos-guest-init");
    for engine in ENGINES {
        let e = engine.name();
        let out = Command::new(plugin_bin("sharedos"))
            .args(["conformance", "--json", "--launcher", e])
            .args(["--handshake-timeout-ms", "120000"])
            .args(["--step-timeout-ms", "60000", "--"])
            .arg(&echo)
            .env_remove("SHAREDOS_LOG")
            .output()
            .expect("run sharedos conformance");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|err| {
            panic!(
                "{e}: no JSON report ({err}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(report["launcher"], e, "{report}");
        let checks = report["checks"].as_array().expect("checks");
        assert!(checks.len() >= 15, "{e}: {checks:#?}");
        let not_passed: Vec<&Value> = checks.iter().filter(|c| c["status"] != "pass").collect();
        assert!(not_passed.is_empty(), "{e}: {not_passed:#?}");
        assert_eq!(report["passed"], true, "{e}");
        assert_eq!(out.status.code(), Some(0), "{e}");
        no_vm_left(engine);
    }
}
