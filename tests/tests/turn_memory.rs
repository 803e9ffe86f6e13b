//! Host memory per turn is bounded by bytes held (docs/PROTOCOL.md section
//! 5, "the turn's byte ledger"): a real plugin that floods annotations and
//! events, each within the message rate limits, is stopped at the ledger,
//! the host's resident memory grows by a bounded amount, and the result is
//! bounded. Before the ledger, the same flood (events of small JSON values,
//! 2 bytes on the wire and a 32-byte value in the host each) made the host
//! hold some 8 million values. One test per step that measures this
//! process's memory: nothing else runs in it meanwhile.

use std::process::Command;

use serde_json::{Value, json};
use sharedos_host::executor::DEFAULT_MAX_TURN_BYTES;
use sharedos_tests::bait::memory_kib;
use sharedos_tests::turns::{
    Launch, TurnSpec, request, run_turn, testplugin_host_toml, wait_gone, workspace_bin,
};

/// 1,000 annotations of 256 small values, then 8,000 events of 1,024:
/// 9,000 messages, inside the 10,000 burst of the message budget, and 16
/// MB on the wire, inside every byte budget of the stream.
fn flood() -> Value {
    json!([
        {"op": "annotate_many", "n": 1_000, "value": vec![0; 256]},
        {"op": "emit_many", "n": 8_000, "type": "flood", "data": vec![0; 1024]},
        {"op": "outcome", "value": "never reached"}
    ])
}

fn assert_stopped_at_the_ledger(result: &Value, limit: usize) {
    assert_eq!(result["status"], "failed", "{}", result["error"]);
    assert_eq!(result["error"]["code"], "runtime_failed");
    assert_eq!(
        result["error"]["details"],
        json!({"reason": "turn_memory_exceeded", "limitBytes": limit})
    );
    assert_eq!(result["error"]["retryable"], false);
    let len = serde_json::to_vec(result).unwrap().len();
    assert!(
        len <= limit,
        "the result is {len} bytes, over the {limit}-byte ledger"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_within_the_rate_limits_is_stopped_at_the_byte_ledger() {
    let (_, rss_before) = memory_kib();
    let mut spec = TurnSpec::new(Launch::Direct, flood());
    spec.timeout_ms = 60_000;
    let run = run_turn(spec).await;
    let (hwm_after, rss_after) = memory_kib();

    let result = serde_json::to_value(&run.result).unwrap();
    assert_stopped_at_the_ledger(&result, DEFAULT_MAX_TURN_BYTES);
    let flooded = run.runtime_events("flood").len();
    assert!(
        (1..8_000).contains(&flooded),
        "{flooded} of 8,000 events were kept"
    );
    // The peak of this whole process against where it stood: the turn's
    // log, its annotations, the observer's copy the harness keeps, and the
    // result. Unbounded, the same flood holds well over 400 MiB.
    let growth_mib = hwm_after.saturating_sub(rss_before) / 1024;
    assert!(
        growth_mib <= 192,
        "resident memory grew {growth_mib} MiB (RSS {rss_before} KiB before, {rss_after} KiB after, peak {hwm_after} KiB)"
    );
    eprintln!(
        "ledger {} MiB: {flooded} events kept, peak growth {growth_mib} MiB, RSS {} -> {} MiB",
        DEFAULT_MAX_TURN_BYTES >> 20,
        rss_before / 1024,
        rss_after / 1024
    );
}

/// `[host] maxTurnBytes` sets the ledger of `sharedos run`; a value out of
/// its range is a load error naming the key.
#[test]
fn the_ledger_is_configured_in_the_host_section() {
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("turn-memory-{}", std::process::id());
    let limit = 1024 * 1024;
    let toml = testplugin_host_toml(&marker, "direct", 60_000);
    let with = |line: &str| toml.replacen("[host]\n", &format!("[host]\n{line}\n"), 1);
    std::fs::write(
        dir.path().join("host.toml"),
        with(&format!("maxTurnBytes = {limit}")),
    )
    .unwrap();
    let turn = request("memory-turn", flood(), &["files.read"], 60_000);
    std::fs::write(dir.path().join("turn.json"), turn.to_string()).unwrap();
    let run = |config: &str| {
        Command::new(workspace_bin("sharedos"))
            .arg("run")
            .arg("--config")
            .arg(dir.path().join(config))
            .arg("--request")
            .arg(dir.path().join("turn.json"))
            .output()
            .unwrap()
    };
    let out = run("host.toml");
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no result ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_stopped_at_the_ledger(&result, limit);
    assert!(wait_gone(&marker, std::time::Duration::from_secs(10)).is_empty());

    std::fs::write(dir.path().join("bad.toml"), with("maxTurnBytes = 1000")).unwrap();
    let out = run("bad.toml");
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("host.maxTurnBytes"), "{err}");
}
