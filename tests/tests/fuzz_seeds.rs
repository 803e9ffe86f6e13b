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
