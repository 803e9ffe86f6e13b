//! `sharedos` as a user installs it: `--version`, the binaries laid out as
//! `cargo install --path cli` lays them (side by side in one directory),
//! run from a directory that is not the checkout, and the demo against a
//! model server on this host's loopback, named on the command line alone.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sharedos_egress::mock::{MockModel, Wire, plan_script};
use sharedos_tests::plugin_bin;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn version_names_the_crate_the_protocol_and_the_commit() {
    let out = Command::new(plugin_bin("sharedos"))
        .arg("--version")
        .output()
        .expect("run sharedos --version");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let protocols: Vec<String> = sharedos_protocol::PROTOCOL_VERSIONS
        .iter()
        .map(u32::to_string)
        .collect();
    let head = format!(
        "sharedos {} (protocol {}, commit ",
        env!("CARGO_PKG_VERSION"),
        protocols.join(", ")
    );
    assert!(text.starts_with(&head), "{text:?} does not start {head:?}");
    let commit = text[head.len()..]
        .trim_end()
        .strip_suffix(')')
        .expect("the commit closes the parenthesis");
    let hex = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        commit == "unknown" || (hex.len() == 12 && hex.chars().all(|c| c.is_ascii_hexdigit())),
        "commit {commit:?} is neither 12 hex digits (optionally -dirty) nor unknown"
    );
}

/// `sharedos` and the runtimes it seats by name, copied into one fresh
/// directory as `cargo install` puts them into its bin directory.
fn installed() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::Builder::new()
        .prefix("sharedos-install-")
        .tempdir_in("/var/tmp")
        .expect("install root");
    let bin = root.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for name in ["sharedos", "sharedos-standard", "sharedos-harness"] {
        std::fs::copy(plugin_bin(name), bin.join(name)).expect("copy a binary");
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (root, bin)
}

fn demo_from(bin: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(bin.join("sharedos"))
        .arg("demo")
        .args(args)
        .current_dir(cwd)
        .env("TMPDIR", cwd)
        .env_remove("SHAREDOS_LOG")
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("run the installed sharedos")
}

#[test]
fn an_installed_sharedos_runs_the_demo_from_any_directory() {
    let (_root, bin) = installed();
    let elsewhere = tempfile::tempdir().unwrap();
    let out = demo_from(&bin, elsewhere.path(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).expect("the result JSON on stdout");
    assert_eq!(result["status"], "succeeded", "{}", stderr(&out));
    assert_eq!(
        result["metadata"]["runtime"]["sandbox"]["level"],
        sharedos_tests::full_level()
    );
}

#[test]
fn the_installed_runtime_binaries_are_found_beside_sharedos_not_in_the_checkout() {
    let (_root, bin) = installed();
    std::fs::remove_file(bin.join("sharedos-standard")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let out = demo_from(&bin, elsewhere.path(), &[]);
    assert!(!out.status.success(), "ran without its runtime binary");
    let err = stderr(&out);
    assert!(
        err.contains(&bin.join("sharedos-standard").display().to_string()),
        "the error names the missing binary beside sharedos: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_reaches_a_model_server_on_loopback_named_on_the_command_line() {
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .expect("a model server on loopback");
    let (_root, bin) = installed();
    let elsewhere = tempfile::tempdir().unwrap();
    let base = model.base_url();
    let out = tokio::task::spawn_blocking({
        let bin = bin.clone();
        let cwd = elsewhere.path().to_path_buf();
        move || demo_from(&bin, &cwd, &["--model", "--base-url", &base])
    })
    .await
    .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let result: Value = serde_json::from_slice(&out.stdout).expect("the result JSON on stdout");
    assert_eq!(result["status"], "succeeded", "{err}");
    assert!(
        err.contains("names a loopback address") && err.contains("is consent"),
        "the demo says why it may reach loopback: {err}"
    );
    assert!(
        !model.seen().is_empty(),
        "the model server on loopback got the turn's requests"
    );
    assert!(
        !err.contains("embedded"),
        "nothing tells the user to edit an embedded file: {err}"
    );
}

#[test]
fn a_public_base_url_without_its_key_names_the_flag_to_set() {
    let (_root, bin) = installed();
    let elsewhere = tempfile::tempdir().unwrap();
    let out = demo_from(
        &bin,
        elsewhere.path(),
        &["--model", "--base-url", "https://api.example.invalid/v1"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("OPENAI_API_KEY is not set") && err.contains("--key-env"),
        "{err}"
    );
    assert!(!err.contains("embedded"), "{err}");
}

#[test]
fn the_shipped_binary_lists_only_product_commands() {
    let out = Command::new(plugin_bin("sharedos"))
        .arg("--help")
        .output()
        .expect("run sharedos --help");
    assert!(out.status.success(), "{}", stderr(&out));
    let help = String::from_utf8_lossy(&out.stdout);
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        commands,
        [
            "demo",
            "run",
            "serve",
            "grants",
            "tokens",
            "sandbox",
            "conformance",
            "help"
        ],
        "{help}"
    );
    for internal in ["bench", "soak"] {
        let out = Command::new(plugin_bin("sharedos"))
            .arg(internal)
            .output()
            .expect("run sharedos");
        assert_eq!(
            out.status.code(),
            Some(2),
            "`sharedos {internal}` is not a command"
        );
    }
}
