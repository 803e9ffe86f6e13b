//! The fuzz targets' bodies on stable: `fuzz/src/lib.rs` is compiled here
//! and each body is fed every seed of its corpus (`fuzz/seeds/<target>/`)
//! plus a few mutations of each (truncations, a flipped byte), so the entry
//! points build and run in the normal suite. The real fuzzing runs with
//! cargo-fuzz on nightly (docs/TESTING.md).

#[path = "../../fuzz/src/lib.rs"]
mod targets;

use std::path::PathBuf;

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert!(out.len() >= 4, "{target}: too few seeds");
    out.sort();
    out
}

/// Each seed, each of its prefixes, and each seed with one byte flipped.
fn run(target: &str, body: fn(&[u8])) {
    for seed in seeds(target) {
        body(&seed);
        for end in 0..seed.len().min(256) {
            body(&seed[..end]);
        }
        for i in 0..seed.len().min(64) {
            let mut m = seed.clone();
            m[i] ^= 0x5a;
            body(&m);
        }
    }
}

#[test]
fn ndjson_decoder_seeds() {
    run("ndjson", targets::ndjson);
}

#[test]
fn peer_line_reader_agrees_with_the_codec_on_seeds() {
    run("frame_lines", targets::frame_lines);
}

#[test]
fn jsonrpc_classifier_seeds() {
    run("jsonrpc", targets::jsonrpc);
}

#[test]
fn host_toml_loader_seeds() {
    run("host_toml", targets::host_toml);
}

#[test]
fn file_path_parsing_seeds() {
    run("file_path", targets::file_path);
}

#[test]
fn call_line_readings_agree_on_seeds() {
    run("call_line", targets::call_line);
}

#[test]
fn timestamp_hand_check_agrees_with_time_on_seeds() {
    run("timestamp", targets::timestamp);
}

#[test]
fn tool_result_one_pass_agrees_with_the_derive_on_seeds() {
    run("tool_result", targets::tool_result);
}

#[test]
fn json_text_writers_agree_with_serde_on_seeds() {
    run("json_text", targets::json_text);
}

#[test]
fn json_value_writers_agree_with_serde_on_seeds() {
    run("json_value", targets::json_value);
}

#[test]
fn audit_line_writer_agrees_with_the_derive_on_seeds() {
    run("audit_line", targets::audit_line);
}

#[test]
fn bounded_text_agrees_with_trim_and_count_on_seeds() {
    run("bounded_text", targets::bounded_text);
}

/// The writer targets return early on input their reference does not
/// read: most of their seeds must get past that, or the comparison never
/// runs on the seeds.
#[test]
fn the_writer_seeds_reach_their_comparisons() {
    let parsed =
        |target: &str, ok: fn(&[u8]) -> bool| seeds(target).iter().filter(|s| ok(s)).count();
    let records = parsed("audit_line", |s| {
        serde_json::from_slice::<sharedos_kernel::AuditRecord>(s).is_ok()
    });
    assert!(records >= 4, "{records} audit_line seeds are records");
    let values = parsed("json_value", |s| {
        serde_json::from_slice::<serde_json::Value>(s).is_ok()
    });
    assert!(values >= 7, "{values} json_value seeds are JSON");
    let results = parsed("tool_result", |s| {
        serde_json::from_slice::<sharedos_protocol::ToolResult>(s).is_ok()
    });
    assert!(results >= 4, "{results} tool_result seeds are results");
    let calls = parsed("call_line", |s| {
        std::str::from_utf8(s).ok().is_some_and(|line| {
            matches!(
                sharedos_protocol::jsonrpc::classify(line),
                Ok(sharedos_protocol::jsonrpc::Incoming::Request { params: Some(p), .. })
                    if serde_json::from_str::<sharedos_protocol::InvokeToolParams>(p.get()).is_ok()
            )
        })
    });
    assert!(calls >= 4, "{calls} call_line seeds are tool calls");
}
