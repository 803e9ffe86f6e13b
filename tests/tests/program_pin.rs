//! The content pin of a runtime's program (`sha256 = "…"`), through the
//! whole host path (configuration, registry, executor, the real sandbox
//! and the real direct launch): the pinned bytes run and the result says
//! so; a wrong pin refuses the runtime at seating with both digests; a
//! program replaced after seating, or a staged copy altered after its
//! check, is refused at the next turn and never runs.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sharedos_host::config::{HostConfig, RuntimeEntry};
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, OnTurnError};
use sharedos_host::process::{DirectLauncher, Launcher};
use sharedos_host::registry::RuntimeRegistry;
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::registry_from_config;
use sharedos_kernel::{JsonlAuditSink, Kernel};
use sharedos_sandbox::ProgramDigest;
use sharedos_tests::harness::{HarnessCase, fixture_dir, run_harness};
use sharedos_tests::turns::{request, testplugin_host_toml, workspace_bin};

const LAUNCHERS: [&str; 2] = ["direct", "sandbox"];
/// The sandbox launcher keeping one sandbox prepared ahead of each turn.
const WARM: &str = "sandbox-warm";
/// What the replacing program writes to its stderr, if it ever runs.
const RAN: &str = "REPLACED-PROGRAM-RAN";

/// A copy of the testplugin with a trailer of its own (an ELF ignores
/// bytes after its sections), so each test's pin is a digest no other test
/// stages; and that digest.
fn pinned_plugin(dir: &Path, tag: &str) -> (PathBuf, ProgramDigest) {
    let program = dir.join("sharedos-testplugin");
    let mut bytes = std::fs::read(workspace_bin("sharedos-testplugin")).unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    bytes
        .extend_from_slice(format!("\npin-test {tag} {} {nanos}\n", std::process::id()).as_bytes());
    std::fs::write(&program, &bytes).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    (program, ProgramDigest::of_reader(&bytes[..]).unwrap())
}

/// The testplugin's host.toml on `launcher` with `program` pinned to `pin`.
fn pinned_toml(program: &Path, pin: &str, launcher: &str) -> String {
    let (launcher, warm) = match launcher {
        WARM => ("sandbox", "\nsandbox = { warm = 1 }"),
        other => (other, ""),
    };
    let text = testplugin_host_toml("pin", launcher, 30_000);
    let original = format!(
        "program = \"{}\"",
        workspace_bin("sharedos-testplugin").display()
    );
    assert!(text.contains(&original));
    text.replace(
        &original,
        &format!(
            "program = \"{}\"\nsha256 = \"{pin}\"{warm}",
            program.display()
        ),
    )
}

fn launcher_for(entry: &RuntimeEntry) -> Result<Arc<dyn Launcher>, sharedos_host::seat::SeatError> {
    Ok(match entry.launcher {
        sharedos_host::config::LauncherKind::Direct => Arc::new(DirectLauncher),
        sharedos_host::config::LauncherKind::Sandbox => Arc::new(SandboxLauncher::new(
            workspace_bin("sharedos"),
            entry.sandbox_policy(),
        )),
        sharedos_host::config::LauncherKind::Gvisor
        | sharedos_host::config::LauncherKind::Microvm => {
            return sharedos_host::seat::configured_launcher(entry);
        }
    })
}

/// A seated host: the registry from the configuration in `dir`.
struct Seated {
    config: HostConfig,
    registry: RuntimeRegistry,
    dir: PathBuf,
}

impl Seated {
    fn new(dir: &Path, text: &str) -> Self {
        let config = HostConfig::parse(text, "host.toml", dir).expect("the configuration");
        let registry = registry_from_config(&config, launcher_for).expect("the seat");
        Seated {
            config,
            registry,
            dir: dir.to_path_buf(),
        }
    }

    /// One turn of an empty script: the result as JSON and the turn
    /// errors the host reported.
    async fn turn(&self, id: &str) -> (Value, Vec<String>) {
        let seat = self
            .registry
            .resolve("sharedos-testplugin")
            .expect("the runtime")
            .clone();
        let files_root = self.config.resolve(&self.config.host.files_root);
        std::fs::create_dir_all(&files_root).unwrap();
        let audit = JsonlAuditSink::open(self.dir.join("audit.jsonl")).unwrap();
        let kernel =
            Kernel::from_config(&self.config.kernel, &files_root, Arc::new(audit)).unwrap();
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        let on_turn_error: OnTurnError =
            Arc::new(move |e, _| sink.lock().unwrap().push(format!("{e:?}")));
        let options = ExecutorOptions {
            on_turn_error: Some(on_turn_error),
            ..ExecutorOptions::default()
        };
        let executor = Executor::new(Arc::new(kernel), seat, options).unwrap();
        let req = request(id, json!([]), &["files.read"], 30_000).to_string();
        let result = executor
            .execute_json(&req, ExecuteOptions::default())
            .await
            .expect("a valid request");
        drop(executor);
        sharedos_host::process::settle_kills();
        let errors = errors.lock().unwrap().clone();
        (serde_json::to_value(&result).unwrap(), errors)
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Writes a shell script over `path` in place (the same inode), padded to
/// the same size and with the same mtime, that leaves `marker` and says
/// [`RAN`] on its stderr if it is ever executed.
fn replace_in_place(path: &Path, marker: &Path) {
    let md = std::fs::metadata(path).unwrap();
    let mut script = format!(
        "#!/bin/sh\necho {RAN} >&2\necho ran > {}\nexit 3\n#",
        marker.display()
    )
    .into_bytes();
    script.resize(md.len() as usize - 1, b'x');
    script.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all(&script).unwrap();
    f.set_modified(md.modified().unwrap()).unwrap();
    drop(f);
    let now = std::fs::metadata(path).unwrap();
    assert_eq!(
        (now.len(), now.modified().unwrap()),
        (md.len(), md.modified().unwrap())
    );
}

fn assert_refused_and_never_ran(result: &Value, errors: &[String], marker: &Path, what: &str) {
    assert_eq!(result["status"], "failed", "{what}: {result:#}");
    assert_eq!(
        result["error"]["code"], "runtime_failed",
        "{what}: {result:#}"
    );
    assert!(
        result["metadata"]["runtime"].get("programSha256").is_none(),
        "{what}: {result:#}"
    );
    assert!(
        !result.to_string().contains(RAN),
        "{what}: the replaced program ran: {result:#}"
    );
    assert!(
        !marker.exists(),
        "{what}: the replaced program ran (marker written)"
    );
    assert!(!errors.is_empty(), "{what}: no turn error was reported");
}

#[test]
fn a_pinned_program_runs_and_its_result_states_the_digest() {
    let _serial = sharedos_tests::serial();
    for launcher in LAUNCHERS {
        let dir = tempfile::tempdir().unwrap();
        let (program, pin) = pinned_plugin(dir.path(), "runs");
        let seated = Seated::new(dir.path(), &pinned_toml(&program, &pin.hex(), launcher));
        let (result, errors) = block_on(seated.turn("pin-runs"));
        assert_eq!(
            result["status"], "succeeded",
            "{launcher}: {result:#} {errors:?}"
        );
        let runtime = &result["metadata"]["runtime"];
        assert_eq!(
            runtime["programSha256"],
            pin.hex(),
            "{launcher}: {runtime:#}"
        );
        assert_eq!(runtime["programPinned"], true, "{launcher}: {runtime:#}");
    }
}

#[test]
fn a_wrong_pin_is_refused_at_seating_with_both_digests() {
    let _serial = sharedos_tests::serial();
    for launcher in LAUNCHERS {
        let dir = tempfile::tempdir().unwrap();
        let (program, actual) = pinned_plugin(dir.path(), "wrong");
        let wrong = "0".repeat(64);
        let text = pinned_toml(&program, &wrong, launcher);
        let config = HostConfig::parse(&text, "host.toml", dir.path()).expect("well-formed");
        let e = registry_from_config(&config, launcher_for)
            .err()
            .expect("a wrong pin must refuse the runtime")
            .to_string();
        assert!(e.contains(&wrong), "{launcher}: {e}");
        assert!(e.contains(&actual.hex()), "{launcher}: {e}");
        assert!(e.contains("sharedos-testplugin"), "{launcher}: {e}");
    }
}

#[test]
fn a_program_replaced_after_seating_is_refused_and_never_runs() {
    let _serial = sharedos_tests::serial();
    // With a prepared sandbox too: it holds the copy checked before the
    // file was replaced, and is not started.
    for launcher in LAUNCHERS.into_iter().chain([WARM]) {
        let dir = tempfile::tempdir().unwrap();
        let (program, pin) = pinned_plugin(dir.path(), "replaced");
        let seated = Seated::new(dir.path(), &pinned_toml(&program, &pin.hex(), launcher));
        let (first, _) = block_on(seated.turn("pin-before"));
        assert_eq!(first["status"], "succeeded", "{launcher}: {first:#}");
        let marker = dir.path().join("replaced-ran");
        replace_in_place(&program, &marker);
        let (result, errors) = block_on(seated.turn("pin-after"));
        assert_refused_and_never_ran(&result, &errors, &marker, launcher);
        let joined = errors.join("\n");
        assert!(joined.contains(&pin.hex()), "{launcher}: {joined}");
        let actual = ProgramDigest::of_reader(std::fs::File::open(&program).unwrap()).unwrap();
        assert!(joined.contains(&actual.hex()), "{launcher}: {joined}");
    }
}

#[test]
fn a_staged_copy_altered_after_its_check_is_never_executed() {
    let _serial = sharedos_tests::serial();
    for launcher in LAUNCHERS {
        let dir = tempfile::tempdir().unwrap();
        let (program, pin) = pinned_plugin(dir.path(), "staged");
        let seated = Seated::new(dir.path(), &pinned_toml(&program, &pin.hex(), launcher));
        let (first, _) = block_on(seated.turn("pin-staged-before"));
        assert_eq!(first["status"], "succeeded", "{launcher}: {first:#}");
        // The copy the host staged and checked, altered behind its back
        // (only the host's uid can: the state directory is 0700).
        let staged = sharedos_sandbox::statedir::location()
            .join("plugins")
            .join(format!("sha256-{pin}"))
            .join("sharedos-testplugin");
        assert!(
            staged.is_file(),
            "{launcher}: {} was not staged",
            staged.display()
        );
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Once with a script that leaves a marker, once with a working
        // plugin of the same size but other bytes (one byte of its trailer
        // changed), which would complete the turn if it ran.
        let marker = dir.path().join("staged-ran");
        replace_in_place(&staged, &marker);
        let (result, errors) = block_on(seated.turn("pin-staged-script"));
        assert_refused_and_never_ran(&result, &errors, &marker, launcher);
        let mut other = std::fs::read(&program).unwrap();
        let last = other.len() - 2;
        other[last] ^= 1;
        std::fs::write(&staged, &other).unwrap();
        let (result, errors) = block_on(seated.turn("pin-staged-elf"));
        assert_refused_and_never_ran(&result, &errors, &marker, launcher);
        let joined = errors.join("\n");
        assert!(joined.contains(&pin.hex()), "{launcher}: {joined}");
        let other = ProgramDigest::of_reader(&other[..]).unwrap();
        assert!(joined.contains(&other.hex()), "{launcher}: {joined}");
        assert!(joined.contains("not executed"), "{launcher}: {joined}");
        let _ = std::fs::remove_dir_all(staged.parent().unwrap());
    }
}

#[test]
fn a_malformed_pin_is_a_config_error_naming_the_entry_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (program, pin) = pinned_plugin(dir.path(), "malformed");
    for bad in [pin.hex().to_uppercase(), pin.hex()[..40].to_owned()] {
        let text = pinned_toml(&program, &bad, "sandbox");
        let e = HostConfig::parse(&text, "host.toml", dir.path()).unwrap_err();
        assert!(e.message.starts_with("runtimes[0].sha256: "), "{e}");
        assert!(e.message.contains("64 lowercase hex digits"), "{e}");
        assert!(e.message.contains("sha256sum"), "{e}");
    }
}

#[test]
fn a_pinned_script_is_refused_at_seating_with_the_interpreter_as_the_fix() {
    let _serial = sharedos_tests::serial();
    for launcher in LAUNCHERS {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("plugin.sh");
        let body = format!("#!/bin/sh\n# {launcher} {:?}\nexit 0\n", dir.path());
        std::fs::write(&script, &body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let pin = ProgramDigest::of_reader(body.as_bytes()).unwrap();
        let text = pinned_toml(&script, &pin.hex(), launcher);
        let config = HostConfig::parse(&text, "host.toml", dir.path()).expect("well-formed");
        let e = registry_from_config(&config, launcher_for)
            .err()
            .expect("a pinned script must refuse the runtime")
            .to_string();
        assert!(e.contains("`#!` script"), "{launcher}: {e}");
        assert!(e.contains("pin the interpreter"), "{launcher}: {e}");
    }
}

/// A harness runtime whose CLI is `cli` (a copy of a shell binary) pinned
/// to `pin`, run as `cli -c <body>`, its final message all of stdout.
fn pinned_cli_case(dir: &Path, cli: &Path, pin: &str, body: &str) -> HarnessCase {
    let harness = format!(
        r#"[runtimes.harness]
command = {cli:?}
sha256 = "{pin}"
args = ["-c", {body:?}]
mcp = "stdio"
final = {{ from = "stdout", take = "all" }}
"#,
        cli = cli.display().to_string(),
    );
    HarnessCase::new(&harness, vec![dir.to_path_buf()])
}

/// A copy of the shell binary `/bin/sh` names, in `dir`, and its digest.
fn shell_copy(dir: &Path, from: &str) -> (PathBuf, ProgramDigest) {
    let cli = dir.join("cli");
    let bytes = std::fs::read(std::fs::canonicalize(from).unwrap()).unwrap();
    std::fs::write(&cli, &bytes).unwrap();
    std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).unwrap();
    (cli, ProgramDigest::of_reader(&bytes[..]).unwrap())
}

/// Prints [`RAN`] first when the shell running it is bash (the file that
/// replaces the pinned dash), then the line every run prints.
const CLI_BODY: &str =
    "test -n \"$BASH_VERSION\" && echo REPLACED-PROGRAM-RAN; echo pinned-cli-ran";

fn harness_turn(case: HarnessCase) -> sharedos_tests::harness::HarnessTurn {
    let _serial = sharedos_tests::serial();
    block_on(run_harness(case))
}

#[test]
fn a_pinned_harness_cli_runs_a_wrong_pin_is_refused_at_load_and_a_replaced_one_never_runs() {
    let dir = fixture_dir();
    let (cli, pin) = shell_copy(dir.path(), "/bin/sh");
    let turn = harness_turn(pinned_cli_case(dir.path(), &cli, &pin.hex(), CLI_BODY));
    assert_eq!(turn.status(), "succeeded", "{:#}", turn.json());
    assert_eq!(turn.json()["output"], "pinned-cli-ran");
    // The result states the pin the CLI ran under.
    assert_eq!(
        turn.json()["metadata"]["runtime"]["harnessCliSha256"],
        pin.hex(),
        "{:#}",
        turn.json()
    );

    let wrong = "0".repeat(64);
    let case = pinned_cli_case(dir.path(), &cli, &wrong, CLI_BODY);
    let text = sharedos_tests::harness::host_toml(&case, "m");
    let e = HostConfig::parse(&text, "host.toml", dir.path()).unwrap_err();
    assert!(e.message.contains("runtimes[0].harness.sha256"), "{e}");
    assert!(
        e.message.contains(&wrong) && e.message.contains(&pin.hex()),
        "{e}"
    );

    // Seated with the right pin, then the CLI replaced (in place) by bash,
    // which would say RAN first.
    let mut case = pinned_cli_case(dir.path(), &cli, &pin.hex(), CLI_BODY);
    let target = cli.clone();
    case.after_seating = Some(Box::new(move || {
        let bash = std::fs::read(std::fs::canonicalize("/bin/bash").unwrap()).unwrap();
        std::fs::write(&target, bash).unwrap();
    }));
    let turn = harness_turn(case);
    let json = turn.json();
    assert_eq!(turn.status(), "failed", "{json:#}");
    assert_eq!(turn.code(), "harness_cli_unavailable", "{json:#}");
    assert!(
        !json.to_string().contains(RAN),
        "the replaced CLI ran: {json:#}"
    );
    assert!(json.to_string().contains("it was not executed"), "{json:#}");
}
