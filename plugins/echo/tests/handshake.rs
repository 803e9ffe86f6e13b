//! The `sharedos-echo` binary on its own, over real pipes (../../handshake_check.rs).

#[path = "../../handshake_check.rs"]
mod handshake_check;

const BIN: &str = env!("CARGO_BIN_EXE_sharedos-echo");
const ARGS: &[&str] = &[];

#[test]
fn run_by_hand_it_says_it_is_a_plugin_and_exits_non_zero() {
    handshake_check::refuses_to_run_by_hand(BIN, ARGS);
}

#[test]
fn started_by_a_host_it_answers_initialize_with_its_manifest() {
    handshake_check::answers_initialize(BIN, ARGS, "sharedos-echo");
}
