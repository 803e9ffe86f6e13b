//! Bad CLIs under `sharedos-harness` in the full sandbox: each ends by its
//! deadline or its exit with the outcome docs/HARNESS.md's table gives,
//! and no process of the turn survives (checked in the host's /proc by the
//! marker every process of the turn carries).

use std::time::Duration;

use serde_json::json;
use sharedos_host::config::HostConfig;
use sharedos_tests::harness::{
    HarnessCase, HarnessTurn, fixture_dir, mcp_client, python_with_mcp, run_harness, script,
};

/// A case seating `/bin/sh <script>` with `body`.
fn sh_case(body: &str) -> (HarnessCase, tempfile::TempDir) {
    let dir = fixture_dir();
    let cli = script(dir.path(), "cli.sh", &format!("#!/bin/sh\n{body}\n"));
    let harness = format!(
        r#"[runtimes.harness]
command = {cli:?}
mcp = "stdio"
env = {{ SHAREDOS_TEST_MARKER = "MARKER" }}
final = {{ from = "stdout" }}
"#,
        cli = cli.display().to_string(),
    );
    (
        HarnessCase::new(&harness, vec![dir.path().to_path_buf()]),
        dir,
    )
}

fn run(case: HarnessCase) -> HarnessTurn {
    let _serial = sharedos_tests::serial();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let turn = rt.block_on(run_harness(case));
    turn.assert_no_survivor();
    turn
}

#[test]
fn a_cli_that_never_starts_its_client_ends_by_the_deadline() {
    let (mut case, _d) = sh_case("sleep 1000");
    case.timeout_ms = 2_000;
    let turn = run(case);
    assert_eq!(turn.status(), "cancelled", "{:#}", turn.json());
    assert_eq!(turn.code(), "turn_cancelled");
    assert!(turn.elapsed < Duration::from_secs(20), "{:?}", turn.elapsed);
    // The prompt was composed before the CLI ran (G106).
    assert!(
        turn.metadata()["promptHash"]
            .as_str()
            .is_some_and(|h| h.len() == 64)
    );
}

#[test]
fn a_cli_that_never_calls_a_tool_completes_with_its_message() {
    let (case, _d) = sh_case("echo 'no tools were needed'");
    let turn = run(case);
    assert_eq!(turn.status(), "succeeded", "{:#}", turn.json());
    assert_eq!(turn.json()["output"], "no tools were needed");
    assert!(turn.events("tool.requested").is_empty());
}

#[test]
fn a_non_zero_exit_a_crash_and_a_silent_exit_fail_with_their_codes() {
    for (body, code) in [
        ("echo partial; exit 3", "harness_cli_failed"),
        ("kill -SEGV $$", "harness_cli_crashed"),
        ("true", "harness_no_final_message"),
    ] {
        let (case, _d) = sh_case(body);
        let turn = run(case);
        assert_eq!(turn.status(), "failed", "{body}: {:#}", turn.json());
        assert_eq!(turn.code(), code, "{body}");
        assert_eq!(turn.metadata()["harnessErrorCode"], code, "{body}");
    }
}

#[test]
fn a_cli_ignoring_sigterm_is_killed_at_the_drain_grace() {
    let (mut case, _d) = sh_case("trap '' TERM\nwhile :; do sleep 1; done");
    case.timeout_ms = 3_000;
    case.drain_grace_ms = 1_500;
    let turn = run(case);
    // The drain's SIGTERM is ignored; SIGKILL follows after termGraceMs,
    // before the deadline, and the envelope honours the harness's ending.
    assert_eq!(turn.status(), "failed", "{:#}", turn.json());
    assert_eq!(turn.code(), "harness_cli_stopped");
    assert!(turn.elapsed < Duration::from_secs(20), "{:?}", turn.elapsed);
    // How the stopped CLI ended: the SIGKILL, and that the drain stopped it.
    let meta = turn.metadata();
    assert_eq!(meta["signal"], libc::SIGKILL, "{meta:#}");
    assert!(meta.get("exitCode").is_none(), "{meta:#}");
    assert_eq!(meta["drained"], true, "{meta:#}");
}

#[test]
fn a_cli_stopped_by_the_drain_reports_its_exit_code() {
    let (mut case, _d) = sh_case(
        "trap 'exit 7' TERM
while :; do sleep 0.1; done",
    );
    case.timeout_ms = 3_000;
    case.drain_grace_ms = 1_500;
    let turn = run(case);
    assert_eq!(turn.status(), "failed", "{:#}", turn.json());
    assert_eq!(turn.code(), "harness_cli_stopped");
    let meta = turn.metadata();
    assert_eq!(meta["exitCode"], 7, "{meta:#}");
    assert!(meta.get("signal").is_none(), "{meta:#}");
    assert_eq!(meta["drained"], true, "{meta:#}");
}

#[test]
fn a_cli_that_wraps_up_on_the_drain_completes() {
    let (mut case, _d) = sh_case(
        "trap 'echo wrapped up; exit 0' TERM
while :; do sleep 0.1; done",
    );
    case.timeout_ms = 3_000;
    case.drain_grace_ms = 1_500;
    let turn = run(case);
    assert_eq!(turn.status(), "succeeded", "{:#}", turn.json());
    assert_eq!(turn.json()["output"], "wrapped up");
    // Its final message completes the turn, and the result says the drain
    // ended it.
    let meta = turn.metadata();
    assert_eq!(meta["drained"], true, "{meta:#}");
    assert_eq!(meta["exitCode"], 0, "{meta:#}");
}

#[test]
fn a_double_forked_sleeper_does_not_outlive_the_turn() {
    let (case, _d) = sh_case(
        "(setsid sh -c 'sleep 1000 & sleep 1000' &)\n(sh -c 'sleep 1000 &' &)\nsleep 0.3\necho forked",
    );
    let turn = run(case);
    assert_eq!(turn.status(), "succeeded", "{:#}", turn.json());
    assert_eq!(turn.json()["output"], "forked");
}

#[test]
fn two_gigabytes_of_stdout_cost_no_memory() {
    // With 1 GiB of address space, keeping the output would kill the
    // harness; the bounded tail keeps 64 KiB and the last line.
    let (mut case, _d) =
        sh_case("yes 'output that nobody reads' | head -c 2000000000\necho the end");
    case.sandbox = "rlimits = { addressSpace = 1073741824 }".into();
    case.timeout_ms = 120_000;
    let turn = run(case);
    assert_eq!(turn.status(), "succeeded", "{:#}", turn.json());
    assert_eq!(turn.json()["output"], "the end");
}

#[test]
fn a_client_looping_on_calls_is_bounded_by_max_tool_calls_and_the_deadline() {
    let py = python_with_mcp();
    let dir = fixture_dir();
    let client = mcp_client(dir.path());
    let steps = json!([{"tool": "files__list", "args": {"path": ""}, "delayMs": 20}]);
    let harness = format!(
        r#"[runtimes.harness]
command = {exe:?}
args = [{client:?}, "stdio", "{{mcpCommand}}", "{{mcpArgs}}"]
mcp = "stdio"
env = {{ STEPS = '{steps}', LOOP = "1", SHAREDOS_TEST_MARKER = "MARKER" }}
final = {{ from = "stdout" }}
"#,
        exe = py.exe.display().to_string(),
        client = client.display().to_string(),
    );
    let mut ro = py.ro_paths;
    ro.push(dir.path().to_path_buf());
    let mut case = HarnessCase::new(&harness, ro);
    // Long enough for the Python client to start and call more than five
    // times on a loaded machine; the turn still ends by its deadline.
    case.timeout_ms = 8_000;
    case.max_tool_calls = Some(5);
    let turn = run(case);
    assert_eq!(turn.status(), "cancelled", "{:#}", turn.json());
    let reached_kernel = turn
        .audit_of("authorization.checked")
        .iter()
        .filter(|r| r.tool.is_some())
        .count();
    assert!(
        reached_kernel <= 5,
        "{reached_kernel} calls reached the kernel"
    );
    assert!(
        turn.events("tool.requested").len() > 5,
        "the client kept calling"
    );
}

#[test]
fn a_spec_naming_a_missing_binary_fails_at_load_naming_the_entry() {
    let text = r#"[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "sharedos.gone.mcp"
version = "0.1.0"
program = "sharedos-harness"
[runtimes.harness]
command = "/opt/sharedos-test-not-installed/bin/cli"
mcp = "stdio"
final = { from = "stdout" }
"#;
    let e = HostConfig::parse(text, "host.toml", std::path::Path::new("/tmp")).unwrap_err();
    assert!(
        e.to_string().contains(
            "runtimes[0].harness.command: /opt/sharedos-test-not-installed/bin/cli cannot be used"
        ),
        "{e}"
    );
}

/// A prompt written to break the files it is templated into stays one
/// string in each: the CLI parses the generated JSON and TOML and finds
/// exactly the prompt it was given as its argument.
#[test]
fn a_hostile_prompt_cannot_break_the_generated_files() {
    let py = python_with_mcp();
    let dir = fixture_dir();
    let probe = script(
        dir.path(),
        "probe.py",
        "import json, os, sys, tomllib\n\
         home = os.environ['HOME']\n\
         j = json.load(open(home + '/cfg.json'))\n\
         t = tomllib.load(open(home + '/cfg/config.toml', 'rb'))\n\
         ok = j == {'p': sys.argv[1], 'n': 1} and t == {'p': sys.argv[1], 'server': {'args': ['mcp-relay', t['server']['args'][1]]}}\n\
         print('intact' if ok else 'broken: %r %r' % (j, t))\n",
    );
    let harness = format!(
        r#"[runtimes.harness]
command = {exe:?}
args = [{probe:?}, "{{prompt}}"]
mcp = "stdio"
env = {{ SHAREDOS_TEST_MARKER = "MARKER" }}
final = {{ from = "stdout" }}
[[runtimes.harness.files]]
path = "{{home}}/cfg.json"
content = '{{"p": {{json:prompt}}, "n": 1}}'
[[runtimes.harness.files]]
path = "{{home}}/cfg/config.toml"
content = """
p = {{json:prompt}}
[server]
args = {{json:mcpArgs}}
"""
"#,
        exe = py.exe.display().to_string(),
        probe = probe.display().to_string(),
    );
    let mut ro = py.ro_paths;
    ro.push(dir.path().to_path_buf());
    let mut case = HarnessCase::new(&harness, ro);
    case.prompt = json!(
        "\"}, \"n\": 2, \"x\": {\"\n\"\"\"\n[server]\nargs = []\n\u{7f}\u{1} \\ {home} {json:prompt} '''"
    );
    let turn = run(case);
    assert_eq!(turn.status(), "succeeded", "{:#}", turn.json());
    assert_eq!(turn.json()["output"], "intact");
}

/// A prompt holding a NUL byte given to a CLI on its command line: no
/// `execve` argument can carry it, so the CLI never starts and the turn
/// fails `harness_argument_invalid` naming the argument, not
/// `harness_cli_unavailable` as if the CLI were missing.
#[test]
fn a_nul_in_a_prompt_on_the_command_line_is_named_and_the_cli_never_starts() {
    let dir = fixture_dir();
    let marker_file = dir.path().join("ran");
    let cli = script(
        dir.path(),
        "cli.sh",
        &format!("#!/bin/sh\ntouch {}\necho ran\n", marker_file.display()),
    );
    let harness = format!(
        r#"[runtimes.harness]
command = {cli:?}
args = ["--prompt", "{{prompt}}"]
mcp = "stdio"
env = {{ SHAREDOS_TEST_MARKER = "MARKER" }}
final = {{ from = "stdout" }}
"#,
        cli = cli.display().to_string(),
    );
    let mut case = HarnessCase::new(&harness, vec![dir.path().to_path_buf()]);
    case.prompt = json!("before\u{0}after");
    let turn = run(case);
    assert_eq!(turn.status(), "failed", "{:#}", turn.json());
    assert_eq!(turn.code(), "harness_argument_invalid", "{:#}", turn.json());
    let message = turn.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("argument 2"), "{message}");
    assert_eq!(turn.json()["error"]["retryable"], false);
    assert!(!marker_file.exists(), "the CLI ran");
}

/// The same prompt on the CLI's stdin (`stdin = "{prompt}"`, the fix the
/// message above names): a pipe carries every byte, so the CLI starts in
/// the sandbox, reads the prompt whole, NUL included, then EOF, and its
/// answer completes the turn.
#[test]
fn a_prompt_on_stdin_reaches_the_cli_whole_nul_included() {
    let dir = fixture_dir();
    let cli = script(
        dir.path(),
        "cli.sh",
        "#!/bin/sh\nbytes=$(od -An -c | tr -s ' \\n' ' ')\nprintf 'read:%s\\n' \"$bytes\"\n",
    );
    let harness = format!(
        r#"[runtimes.harness]
command = {cli:?}
stdin = "{{prompt}}"
mcp = "stdio"
env = {{ SHAREDOS_TEST_MARKER = "MARKER" }}
final = {{ from = "stdout" }}
"#,
        cli = cli.display().to_string(),
    );
    let mut case = HarnessCase::new(&harness, vec![dir.path().to_path_buf()]);
    case.prompt = json!("a\u{0}b");
    let turn = run(case);
    assert_eq!(turn.status(), "succeeded", "{:#}", turn.json());
    // `od -c` spells the NUL `\0`: the three bytes arrived, and `od` saw
    // the end of its input (it would wait forever otherwise).
    assert_eq!(turn.json()["output"], "read: a \\0 b", "{:#}", turn.json());
}

/// A CLI that prints its answer as one pretty-printed JSON document (as
/// Gemini CLI's `--output-format json` does): `take = "document"` reads
/// the pointer from all of stdout; the default `lastLine` sees only `}`
/// and the same run fails `harness_no_final_message`.
#[test]
fn a_pretty_printed_json_answer_is_read_as_one_document() {
    for (take, status) in [("document", "succeeded"), ("lastLine", "failed")] {
        let dir = fixture_dir();
        let cli = script(
            dir.path(),
            "cli.sh",
            "#!/bin/sh\nprintf '{\\n  \"response\": \"All done.\",\\n  \"stats\": {\\n    \"n\": 1\\n  }\\n}\\n'\n",
        );
        let harness = format!(
            r#"[runtimes.harness]
command = {cli:?}
mcp = "stdio"
env = {{ SHAREDOS_TEST_MARKER = "MARKER" }}
final = {{ from = "json", take = "{take}", pointer = "/response" }}
"#,
            cli = cli.display().to_string(),
        );
        let turn = run(HarnessCase::new(&harness, vec![dir.path().to_path_buf()]));
        assert_eq!(turn.status(), status, "{take}: {:#}", turn.json());
        if status == "succeeded" {
            assert_eq!(turn.json()["output"], "All done.", "{:#}", turn.json());
        } else {
            assert_eq!(turn.code(), "harness_no_final_message", "{:#}", turn.json());
        }
    }
}
