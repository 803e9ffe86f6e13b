//! The `sharedos-testplugin` binary on its own, over real pipes (../../handshake_check.rs).

#[path = "../../handshake_check.rs"]
#[allow(dead_code)] // it speaks raw NDJSON without the SDK: no by-hand refusal
mod handshake_check;

const BIN: &str = env!("CARGO_BIN_EXE_sharedos-testplugin");
const ARGS: &[&str] = &[];

#[test]
fn started_by_a_host_it_answers_initialize_with_its_manifest() {
    handshake_check::answers_initialize(BIN, ARGS, "sharedos-testplugin");
}
