//! `scripts/test`, the README's test command, when it cannot provision:
//! with the registries unreachable it says, once and before any test runs,
//! what could not be provisioned and which tests need it, exits 2, and
//! removes a half-made environment left by an interrupted run instead of
//! running the suite against it.

use std::path::Path;
use std::process::Command;

#[test]
fn an_unreachable_registry_is_reported_first_with_the_tests_that_need_it() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    // Not under /tmp where the host is not root: scripts/test refuses that
    // location first (its sandboxes could not bind it).
    let env_dir = sharedos_tests::plugin_tempdir();
    let npm_cache = tempfile::tempdir().unwrap();
    // What an interrupted run leaves: a venv with no stamp.
    let venv = env_dir.path().join("venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::write(venv.join("half-made"), "").unwrap();

    let out = Command::new(repo.join("scripts/test"))
        .arg("--provision-only")
        .env("SHAREDOS_TEST_ENV", env_dir.path())
        // Nothing answers on port 9 of loopback: every registry is down.
        .env("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
        .env("PIP_NO_CACHE_DIR", "1")
        .env("PIP_RETRIES", "0")
        .env("PIP_TIMEOUT", "5")
        .env("npm_config_registry", "http://127.0.0.1:9/")
        .env("npm_config_cache", npm_cache.path())
        .env("npm_config_fetch_retries", "0")
        .env("npm_config_offline", "false")
        .output()
        .expect("run scripts/test");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot run the tests: provisioning failed"),
        "{err}"
    );
    assert_eq!(
        err.matches("cannot run the tests").count(),
        1,
        "said once: {err}"
    );
    assert!(
        err.contains("python: installing tests/requirements.lock from PyPI failed")
            && err.contains("tests/tests/harness_"),
        "names the step and the tests that need it: {err}"
    );
    assert!(
        !venv.join("half-made").exists(),
        "the half-made environment was removed, not used"
    );
    assert!(
        !env_dir.path().join("venv.stamp").exists(),
        "no stamp for a step that failed"
    );
}
