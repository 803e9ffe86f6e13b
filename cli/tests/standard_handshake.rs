//! The `sharedos-standard` binary on its own, over real pipes (plugins/handshake_check.rs),
//! with a transcript and with each model driver kind the host's config accepts.

#[path = "../../plugins/handshake_check.rs"]
mod handshake_check;

const BIN: &str = env!("CARGO_BIN_EXE_sharedos-standard");
const ARGS: &[&str] = &[
    "--transcript",
    r#"[{"type": "complete", "output": "done"}]"#,
];

#[test]
fn run_by_hand_it_says_it_is_a_plugin_and_exits_non_zero() {
    handshake_check::refuses_to_run_by_hand(BIN, ARGS);
}

#[test]
fn started_by_a_host_it_answers_initialize_with_its_manifest() {
    handshake_check::answers_initialize(BIN, ARGS, "sharedos.standard");
}

fn args(kind: &str) -> [&str; 6] {
    [
        "--driver",
        kind,
        "--base-url",
        "http://127.0.0.1:9/model",
        "--model",
        "m",
    ]
}

#[test]
fn each_driver_kind_starts_and_answers_initialize() {
    for kind in sharedos_standard::DriverKind::ALL {
        handshake_check::answers_initialize(BIN, &args(kind.as_str()), "sharedos.standard");
    }
}

#[test]
fn an_unknown_kind_or_a_missing_model_is_refused_with_what_to_fix() {
    let out = std::process::Command::new(BIN)
        .args(args("gpt"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"gpt\" is not a driver kind") && err.contains("anthropic-messages"),
        "{err}"
    );
    let out = std::process::Command::new(BIN)
        .args(&args("openai-responses")[..4])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs --base-url and --model"), "{err}");
}
