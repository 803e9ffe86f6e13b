//! Stdio abuses of sandbox.md C41–C45 through the whole host, one turn
//! each (selected with `payload.only`) at a short deadline: every turn ends
//! by its deadline (generous margin) with the ending the host's framing,
//! drain and timeouts give it, the test process's memory stays bounded
//! (VmHWM/VmRSS of `/proc/self/status`), and no process of the turn
//! survives.

use std::time::Duration;

use serde_json::{Value, json};
use sharedos_sandbox::SandboxPolicy;
use sharedos_tests::bait::*;

/// Generous: the host keeps 16 MiB frames and a bounded stderr ring; a
/// host that buffered the 2 GiB line or the flood would blow far past it.
const MEMORY_BOUND_KIB: u64 = 256 * 1024;
/// Past the deadline, the kill and the reap.
const MARGIN: Duration = Duration::from_secs(5);

struct Stdio {
    run: TurnRun,
    hwm_growth_kib: u64,
    rss_growth_kib: u64,
}

fn stdio_turn(id: &str, bait: Value, timeout_ms: u64) -> Stdio {
    let _serial = serial();
    let (hwm0, rss0) = memory_kib();
    let run = run_turn(
        TurnSpec::new(SandboxPolicy::default(), bait)
            .only(&[id])
            .timeout_ms(timeout_ms),
    );
    let (hwm1, rss1) = memory_kib();
    let s = Stdio {
        hwm_growth_kib: hwm1.saturating_sub(hwm0),
        rss_growth_kib: rss1.saturating_sub(rss0),
        run,
    };
    let label = format!("{id} ({})", s.run.error_text());
    assert!(
        s.run.elapsed <= Duration::from_millis(timeout_ms) + MARGIN,
        "{label}: the turn took {:?}, past its {timeout_ms} ms deadline",
        s.run.elapsed
    );
    assert!(
        s.hwm_growth_kib < MEMORY_BOUND_KIB && s.rss_growth_kib < MEMORY_BOUND_KIB,
        "{label}: host memory grew by VmHWM {} KiB / VmRSS {} KiB (bound {MEMORY_BOUND_KIB} KiB)",
        s.hwm_growth_kib,
        s.rss_growth_kib
    );
    assert!(
        s.run.survivors.is_empty(),
        "{label}: survivors {:?}",
        s.run.survivors
    );
    assert!(
        s.run.leftover_workspaces.is_empty(),
        "{label}: workspaces left {:?}",
        s.run.leftover_workspaces
    );
    assert!(
        s.run.leftover_cgroups.is_empty(),
        "{label}: cgroups left {:?}",
        s.run.leftover_cgroups
    );
    assert_eq!(s.run.level(), sharedos_tests::full_level(), "{label}");
    // The receipt was emitted before the abuse and reached the host.
    attempted(&s.run.receipts(), id, "host stdio handling");
    eprintln!(
        "{id}: {} {:?} in {:?}, VmHWM +{} KiB, VmRSS +{} KiB; {}",
        s.run.status(),
        s.run.code(),
        s.run.elapsed,
        s.hwm_growth_kib,
        s.rss_growth_kib,
        s.run.error_text()
    );
    s
}

/// The turn failed `runtime_failed`, and `on_turn_error` heard the wire
/// violation `reason` (the peer's `ViolationReason`).
fn failed_runtime(s: &Stdio, id: &str, layer: &str, reason: &str) {
    assert_eq!(
        (s.run.status().as_str(), s.run.code().as_deref()),
        ("failed", Some("runtime_failed")),
        "{id} must end the turn runtime_failed ({layer}); errors: {}",
        s.run.error_text()
    );
    let errors = s.run.error_text();
    assert!(
        errors.contains(reason),
        "{id}: on_turn_error must name the violation {reason} ({layer}): {errors}"
    );
}

#[test]
fn c41_close_stdout_early_ends_the_turn_on_eof() {
    let s = stdio_turn("C41", json!({"hang_secs": 60}), 4000);
    failed_runtime(
        &s,
        "C41 close-stdout-early",
        "host reader: EOF is death; pidns kill",
        "plugin_exited",
    );
    // EOF ends it, not the deadline.
    assert!(
        s.run.elapsed < Duration::from_millis(3500),
        "C41: EOF on stdout must end the turn before its deadline, took {:?}",
        s.run.elapsed
    );
}

#[test]
fn c41b_grandchild_holding_stdout_does_not_hang_the_host() {
    let s = stdio_turn("C41b", json!({"hang_secs": 60}), 4000);
    failed_runtime(
        &s,
        "C41b grandchild-holds-stdout",
        "host reader + exit watch; pidns kill",
        "plugin_exited",
    );
    assert!(
        s.run.elapsed < Duration::from_millis(3500),
        "C41b: the plugin's exit must end the turn before its deadline, took {:?}",
        s.run.elapsed
    );
}

#[test]
fn c42_two_gib_line_hits_the_framing_limit() {
    let s = stdio_turn("C42", json!({"line_mib": 2048}), 5000);
    failed_runtime(
        &s,
        "C42 huge-stdout-line",
        "host framing limit",
        "frame_too_large",
    );
}

#[test]
fn c43_stderr_flood_is_drained_and_the_turn_completes() {
    let s = stdio_turn("C43", json!({"flood_mib": 1024}), 30000);
    assert_eq!(
        s.run.status(),
        "succeeded",
        "C43 stderr-flood: the host must keep draining stderr (bounded ring) and the turn complete; errors: {}",
        s.run.error_text()
    );
}

#[test]
fn c44a_c44b_malformed_frames_are_protocol_errors() {
    for (id, what, reason) in [
        ("C44a", "invalid-utf8-frame", "invalid_utf8"),
        ("C44b", "invalid-json-frame", "invalid_json"),
    ] {
        let s = stdio_turn(id, json!({}), 4000);
        failed_runtime(
            &s,
            &format!("{id} {what}"),
            "host framing and parser (UTF-8, JSON)",
            reason,
        );
    }
}

#[test]
fn c44d_c44e_huge_number_and_deep_nesting_are_rejected() {
    // A `host/emit` whose data is a 100 000-digit number, or arrays nested
    // 100 000 deep, for a turn id the host does not know: the host parses
    // it without blowing its stack (the test process is the host), drops
    // it (message rejected) or fails the turn, and never lets it into the
    // result.
    for (id, what) in [("C44d", "huge-number"), ("C44e", "deep-nesting")] {
        let s = stdio_turn(id, json!({}), 4000);
        let status = s.run.status();
        assert!(
            status == "succeeded" || s.run.code().as_deref() == Some("runtime_failed"),
            "{id} {what}: {status} {:?} (host parser)",
            s.run.code()
        );
        let forged: Vec<_> = s
            .run
            .result
            .events
            .iter()
            .filter_map(|e| serde_json::to_value(e).ok())
            .filter(|e| e["data"]["type"] == "x")
            .collect();
        assert!(
            forged.is_empty(),
            "{id} {what}: the forged event reached the result (host parser)"
        );
    }
}

#[test]
fn c44c_forged_response_id_is_dropped() {
    // protocol.md: a response to an id the host never sent (a forged
    // outcome) is dropped and counted; the turn goes on to its real end.
    let s = stdio_turn("C44c", json!({}), 4000);
    assert_eq!(
        s.run.status(),
        "succeeded",
        "C44c forged-response-id: errors: {}",
        s.run.error_text()
    );
    let output = &s.run.json()["output"];
    assert_ne!(
        output,
        &json!("forged"),
        "C44c forged-response-id: the forged outcome was taken (host peer: unknown ids dropped)"
    );
    assert_eq!(output["summary"]["attacks"], 1, "C44c: {output}");
}

#[test]
fn c45_never_reading_stdin_is_killed_at_the_deadline() {
    let s = stdio_turn("C45", json!({}), 3000);
    assert!(
        s.run.status() == "failed" || s.run.status() == "cancelled",
        "C45 never-read-stdin: {} {:?}",
        s.run.status(),
        s.run.code()
    );
    assert!(
        s.run.elapsed >= Duration::from_millis(2900),
        "C45: ended before its deadline: {:?}",
        s.run.elapsed
    );
}

#[test]
fn c45_stopped_plugin_gets_draining_and_abort_without_stalling_the_host() {
    // With a drain grace the host writes `turn/draining`, then
    // `turn/abort`, to a process that never reads again: neither write may
    // hold the turn past its deadline (async writes with a stall timeout).
    let _serial = serial();
    let (hwm0, _) = memory_kib();
    let run = run_turn(
        TurnSpec::new(SandboxPolicy::default(), json!({}))
            .only(&["C45"])
            .timeout_ms(3000)
            .drain_grace_ms(1500),
    );
    let (hwm1, _) = memory_kib();
    assert_eq!(
        run.status(),
        "cancelled",
        "C45 with drain: {:?} {}",
        run.code(),
        run.error_text()
    );
    assert!(
        run.elapsed <= Duration::from_millis(3000) + MARGIN,
        "C45 with drain: {:?}",
        run.elapsed
    );
    assert!(hwm1.saturating_sub(hwm0) < MEMORY_BOUND_KIB);
    assert!(run.survivors.is_empty(), "C45: {:?}", run.survivors);
    assert!(run.leftover_workspaces.is_empty());
    attempted(&run.receipts(), "C45", "host async stdin writes");
}
