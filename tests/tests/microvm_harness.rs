//! A harness turn in the microVM (`launcher = "microvm"` with a
//! `[runtimes.harness]`): the real Codex CLI and `sharedos-harness` run in
//! a QEMU guest (TCG on machines without nested virtualization), the CLI
//! read from the guest's read-only disk (a virtio-blk ext4 image built at
//! seating, host/src/process/microvm/disk.rs), its model a scripted mock
//! on the host reached only through the egress gateway over the guest's
//! serial channel; the MCP server over stdio (the spec as shipped) and over
//! streamable HTTP on the guest's own loopback.
//!
//! A machine without QEMU, the guest kernel, e2fsprogs or the vendor CLIs
//! fails these tests with the fix (`scripts/test` provisions them).

use serde_json::{Value, json};
use sharedos_egress::mock::wire::{calls_turn, text_turn};
use sharedos_egress::mock::{MockModel, Reply, ScriptedCall, Wire};
use sharedos_host::config::RuntimeEntry;
use sharedos_host::seat::configured_launcher;
use sharedos_tests::engines::Engine;
use sharedos_tests::leftovers::processes_naming;
use sharedos_tests::turns::workspace_bin;
use sharedos_tests::vendors::{
    Vendor, VendorCase, VendorTurn, assert_key_kept, run_vendor_in, unique_marker,
};

/// The guest's RAM for a Codex turn: the CLI's pages read from the disk
/// sit in the guest's page cache, inside it.
const MEMORY_MIB: u64 = 1024;

/// The host.toml with every runtime in the microVM (the workspace's guest
/// init, [`MEMORY_MIB`] of RAM, a handshake bound for a TCG boot).
fn in_microvm(text: &str) -> String {
    let init = workspace_bin("sharedos-guest-init");
    let mut out = String::with_capacity(text.len() + 256);
    for line in text.lines() {
        out.push_str(line);
        out.push('\n');
        if line.trim() == "[[runtimes]]" {
            out.push_str(&format!(
                "launcher = \"microvm\"\nhandshakeTimeoutMs = 120000\nmicrovm = {{ memoryMib = {MEMORY_MIB}, init = {:?} }}\n",
                init.display().to_string()
            ));
        }
    }
    out
}

fn launcher_for(
    e: &RuntimeEntry,
) -> Result<std::sync::Arc<dyn sharedos_host::process::Launcher>, sharedos_host::seat::SeatError> {
    configured_launcher(e)
}

/// One Codex turn in the microVM: a granted `files.write` through the
/// envelope, then the final message.
fn codex_turn(http: bool) -> (VendorTurn, Vec<sharedos_egress::mock::SeenRequest>) {
    // One VM at a time: each is a TCG guest of 1 GiB.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rt = sharedos_tests::blocking_runtime();
    let marker = unique_marker();
    let args = r#"{"path": "notes/vm.md", "content": "from the guest"}"#;
    let call = ScriptedCall {
        id: "call_1",
        namespace: Some("mcp__sharedos"),
        name: "files__write",
        arguments: args,
    };
    rt.block_on(async {
        let mock = MockModel::start(vec![
            Reply::Stream(calls_turn(Wire::OpenaiResponses, &[call])),
            Reply::Stream(text_turn(Wire::OpenaiResponses, &["Done in the VM."])),
        ])
        .await
        .unwrap();
        let case = VendorCase {
            vendor: Vendor::Codex,
            prompt: json!("Write a note for the team, then tell me you did."),
            tools: vec!["files.read", "files.write", "files.list"],
            timeout_ms: 600_000,
            http,
            max_tool_calls: None,
            route_granted: true,
            engine: Engine::Sandbox,
        };
        let turn = run_vendor_in(case, &mock, &marker, &in_microvm, &launcher_for).await;
        (turn, mock.seen())
    })
}

/// What every microVM harness turn shows: it ran in the microVM, the CLI
/// came from the read-only disk (not the initramfs, which stays small),
/// and no QEMU or run directory is left.
fn ran_in_the_vm_and_left_nothing(v: &Value) {
    let report = &v["metadata"]["runtime"]["sandbox"];
    assert_eq!(report["engine"], "microvm", "{report:#}");
    let disk = &report["disk"];
    let image = disk["image"].as_str().unwrap_or_default();
    assert!(image.ends_with(".ext4"), "{report:#}");
    let disk_bytes = disk["bytes"].as_u64().unwrap_or(0);
    assert!(disk_bytes > 100 << 20, "the CLI is on the disk: {disk}");
    let image_bytes = report["image"]["bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(
        image_bytes < 64 << 20,
        "the initramfs holds no CLI: {image_bytes} bytes"
    );
    // The memory axis says the disk is not guest RAM; the RAM is the bound.
    let memory = &report["memory"];
    assert!(
        memory["disk"]
            .as_str()
            .unwrap_or_default()
            .contains("not guest RAM"),
        "{memory:#}"
    );
    assert_eq!(memory["tree_bound_bytes"], MEMORY_MIB << 20, "{memory:#}");
    let run_dir = report["run_dir"].as_str().unwrap_or_default().to_owned();
    assert!(!run_dir.is_empty(), "{report:#}");
    let left = processes_naming(&run_dir);
    assert!(left.is_empty(), "QEMU left: {left:?}");
    assert!(
        !std::path::Path::new(&run_dir).exists(),
        "{run_dir} is left"
    );
}

fn assert_codex_turn(turn: &VendorTurn, seen: &[sharedos_egress::mock::SeenRequest], how: &str) {
    let v = turn.json();
    assert_eq!(v["status"], "succeeded", "{how}: {v:#}");
    assert_eq!(v["output"], "Done in the VM.", "{how}: {v:#}");
    assert_eq!(seen.len(), 2, "{how}: {seen:?}");
    let invoked: Vec<(Option<String>, Value)> = turn
        .audit_of("tool.invoked")
        .iter()
        .map(|r| (r.tool.clone(), serde_json::to_value(r.outcome).unwrap()))
        .collect();
    assert_eq!(
        invoked,
        vec![(Some("files.write".to_owned()), json!("succeeded"))],
        "{how}"
    );
    assert_key_kept(turn, seen, Vendor::Codex);
    ran_in_the_vm_and_left_nothing(&v);
    // The figures docs/BENCHMARKS.md quotes (never judged here).
    let at = |kind: &str| {
        v["events"]
            .as_array()
            .and_then(|es| es.iter().find(|e| e["type"] == kind))
            .map(|e| e["occurredAt"].clone())
            .unwrap_or(Value::Null)
    };
    eprintln!(
        "microvm harness ({how}): boot_ms {} turn_ms {} disk_bytes {} turn.started {} first egress.request {}",
        v["metadata"]["runtime"]["sandbox"]["boot_ms"],
        turn.elapsed.as_millis(),
        v["metadata"]["runtime"]["sandbox"]["disk"]["bytes"],
        at("turn.started"),
        at("egress.request"),
    );
}

/// The Codex CLI over streamable HTTP (`mcp = "http"`): the harness's MCP
/// listener on the guest's own loopback, the model through the gateway.
#[test]
fn a_codex_turn_over_mcp_http_through_the_gateway_runs_in_the_microvm() {
    let (turn, seen) = codex_turn(true);
    assert_codex_turn(&turn, &seen, "http");
}

/// The Codex CLI as the shipped spec seats it (`mcp = "stdio"`: the CLI
/// starts the harness's relay as its MCP server, inside the guest).
#[test]
fn a_codex_turn_over_mcp_stdio_through_the_gateway_runs_in_the_microvm() {
    let (turn, seen) = codex_turn(false);
    assert_codex_turn(&turn, &seen, "stdio");
}
