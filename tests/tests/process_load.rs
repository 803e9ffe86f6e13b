//! Load failures: a missing or non-executable binary, a plugin that never
//! answers `initialize`, stdout noise before the handshake, a manifest or
//! version that differs. Each is a typed error naming the binary and what
//! differed; no child survives.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use serde_json::json;
use sharedos_host::process::{DirectLauncher, LoadError, ProcessRuntime, ProcessRuntimeConfig};
use sharedos_plugin_sdk::{RuntimeError, RuntimePlugin, Signal};
use sharedos_protocol::RuntimeManifest;
use sharedos_tests::{RecordingHost, isolated, live_children, plugin_bin, runtime, turn_request};

fn manifest() -> RuntimeManifest {
    RuntimeManifest::new("sharedos-testplugin", "0.1.0").unwrap()
}

#[test]
fn a_missing_binary_is_a_typed_error_naming_it() {
    let program = std::path::PathBuf::from("/nonexistent/sharedos-plugin");
    let err = ProcessRuntime::new(
        ProcessRuntimeConfig::new(&program, manifest()),
        Arc::new(DirectLauncher),
    )
    .unwrap_err();
    assert_eq!(
        err,
        LoadError::NotFound {
            program: program.clone()
        }
    );
    assert!(err.to_string().contains("/nonexistent/sharedos-plugin"));
}

#[test]
fn a_binary_that_is_not_executable_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("plugin");
    std::fs::write(&program, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = ProcessRuntime::new(
        ProcessRuntimeConfig::new(&program, manifest()),
        Arc::new(DirectLauncher),
    )
    .unwrap_err();
    assert_eq!(
        err,
        LoadError::NotExecutable {
            program: program.clone()
        }
    );
    let err = ProcessRuntime::new(
        ProcessRuntimeConfig::new(dir.path(), manifest()),
        Arc::new(DirectLauncher),
    )
    .unwrap_err();
    assert!(matches!(err, LoadError::NotAFile { .. }));
    let path = dir.path().to_owned();
    drop(dir);
    assert!(!path.exists());
}

fn load_error(mode: &str, tweak: impl FnOnce(&mut ProcessRuntimeConfig)) -> String {
    isolated(async {
        let rt = runtime(
            "sharedos-testplugin",
            &[mode],
            ("sharedos-testplugin", "0.1.0"),
            tweak,
        );
        let host = RecordingHost::new();
        let r = rt
            .run(turn_request("exec-load", json!({})), host, Signal::never())
            .await;
        let msg = match r {
            Err(RuntimeError::Load(m)) => m,
            other => panic!("{mode}: expected a load error, got {other:?}"),
        };
        assert!(
            msg.contains(plugin_bin("sharedos-testplugin").to_str().unwrap()),
            "names the binary: {msg}"
        );
        // The teardown runs off the turn's path; settle_kills waits for it.
        sharedos_host::process::settle_kills();
        assert!(live_children().is_empty(), "{mode}: a child survived");
        msg
    })
}

#[test]
fn a_plugin_that_never_answers_initialize_times_out() {
    let msg = load_error("silent", |c| {
        c.handshake_timeout = std::time::Duration::from_millis(300)
    });
    assert!(msg.contains("did not answer initialize within"), "{msg}");
}

#[test]
fn stdout_noise_before_the_handshake_says_log_to_stderr() {
    let msg = load_error("noise", |_| {});
    assert!(
        msg.contains("Starting testplugin v0.1.0 ... ready"),
        "{msg}"
    );
    assert!(msg.contains("log to stderr"), "{msg}");
}

/// protocol.md 4.1: a request of any method, known or not, written before
/// the `initialize` answer fails the load (it used to be answered -32601
/// and the handshake went on).
#[test]
fn a_request_before_the_initialize_answer_fails_the_load() {
    let msg = load_error("early-request", |_| {});
    assert!(msg.contains("stdout_before_handshake"), "{msg}");
    assert!(
        msg.contains("probe/unknown"),
        "the sample shows the line: {msg}"
    );
    assert!(msg.contains("log to stderr"), "{msg}");
}

#[test]
fn a_different_manifest_names_the_field() {
    let msg = load_error("wrong-manifest", |_| {});
    assert!(
        msg.contains("`id`")
            && msg.contains("some-other-runtime")
            && msg.contains("sharedos-testplugin"),
        "{msg}"
    );
    let msg = isolated(async {
        let rt = runtime(
            "sharedos-testplugin",
            &["normal"],
            ("sharedos-testplugin", "0.2.0"),
            |_| {},
        );
        match rt
            .run(
                turn_request("exec-load", json!({})),
                RecordingHost::new(),
                Signal::never(),
            )
            .await
        {
            Err(RuntimeError::Load(m)) => m,
            other => panic!("{other:?}"),
        }
    });
    assert!(
        msg.contains("`version`") && msg.contains("0.1.0") && msg.contains("0.2.0"),
        "{msg}"
    );
}

#[test]
fn an_unsupported_protocol_version_is_refused() {
    let msg = load_error("bad-version", |_| {});
    assert!(msg.contains("protocol version 99"), "{msg}");
}

#[test]
fn a_plugin_that_exits_before_the_handshake_is_a_load_error() {
    let msg = load_error("exit-early", |_| {});
    assert!(
        msg.contains("plugin_exited") || msg.contains("EOF"),
        "{msg}"
    );
}

#[test]
fn an_sdk_plugin_run_by_hand_says_so() {
    // It starts a child: keep it out of the other tests' child checks.
    let _serial = sharedos_tests::serial();
    let out = std::process::Command::new(plugin_bin("sharedos-echo"))
        .env_remove("SHAREDOS_PLUGIN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sharedos runtime plugin") && err.contains("sharedos host"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}
