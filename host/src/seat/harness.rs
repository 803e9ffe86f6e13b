//! The harness runtime's spec at load and at seating: the checks that
//! refuse a spec the plugin could not honour (naming the entry, e.g.
//! `runtimes[2].harness.command`), and the `--harness <json>` argument
//! the seat passes, with the route's gateway URL and the placeholder key.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sharedos_egress::{NetworkPolicy, egress_url};
use sharedos_protocol::harness::{HarnessLaunch, HarnessSpec, MAX_LAUNCH_BYTES, McpTransport};
use sharedos_protocol::{PLACEHOLDER_MODEL_KEY, RuntimeManifest};
use sharedos_sandbox::{SandboxPolicy, fsview};

/// What the harness's check reads of its runtime entry: the spec (the
/// entry's `[runtimes.harness]` table) and the entry's parts it depends
/// on. Parts, not the entry, so that this module does not import the
/// configuration that dispatches to it.
pub(crate) struct HarnessEntry<'a> {
    /// The entry's index in `runtimes`, for the error.
    pub index: usize,
    pub manifest: RuntimeManifest,
    pub spec: &'a HarnessSpec,
    /// The CLI runs in a sandbox's filesystem view (`launcher =
    /// "sandbox"` or `"gvisor"`), so it must be visible there.
    pub sandbox_view: bool,
    /// The CLI runs unsandboxed (`launcher = "direct"`): no loopback of
    /// its own for an MCP listener.
    pub direct: bool,
    /// The CLI runs in a microVM (`launcher = "microvm"`), which sees it on
    /// its read-only disk: it must lie under `extraRoPaths`.
    pub microvm: bool,
    pub network: &'a NetworkPolicy,
    pub sandbox: &'a SandboxPolicy,
}

/// Checks runtime `entry.index`'s harness spec; the error lists every
/// problem, one a line.
pub(crate) fn check(entry: &HarnessEntry<'_>) -> Result<(), String> {
    let (i, spec) = (entry.index, entry.spec);
    let field = format!("runtimes[{i}].harness");
    let routes: Vec<&str> = match entry.network {
        NetworkPolicy::None => Vec::new(),
        NetworkPolicy::Routes(r) => r.routes.iter().map(|r| r.name.as_str()).collect(),
    };
    let mut problems = spec.check(&field, &routes);
    let command = Path::new(&spec.command);
    if command.is_absolute() {
        match std::fs::metadata(command) {
            Err(e) => problems.push(format!(
                "{field}.command: {} cannot be used: {e}; install the CLI there or fix the path",
                spec.command
            )),
            Ok(md) if !md.is_file() || md.permissions().mode() & 0o111 == 0 => {
                problems.push(format!(
                    "{field}.command: {} is not an executable file",
                    spec.command
                ));
            }
            Ok(_) if entry.sandbox_view => {
                // The sandbox must see the CLI (and its `#!` interpreter):
                // the same check as for a plugin program.
                if !fsview::visible(entry.sandbox, command) {
                    problems.push(format!(
                        "{field}.command: {} is not visible in the sandbox; add its directory to runtimes[{i}].sandbox.extraRoPaths",
                        spec.command
                    ));
                }
                for p in fsview::check_runtime(entry.sandbox, command) {
                    if p.field == "program" {
                        problems.push(format!("{field}.command: {}", p.message));
                    }
                }
            }
            Ok(_) if entry.microvm => {
                let on_disk = entry
                    .sandbox
                    .extra_ro_paths
                    .iter()
                    .any(|p| command.starts_with(p));
                if !on_disk {
                    problems.push(format!(
                        "{field}.command: {} is not on the microVM's read-only disk; add its directory to runtimes[{i}].sandbox.extraRoPaths",
                        spec.command
                    ));
                }
            }
            Ok(_) => {}
        }
        if let Some(problem) = cli_pin_problem(&field, spec) {
            problems.push(problem);
        }
    }
    if spec.mcp == McpTransport::Http && entry.direct {
        problems.push(format!(
            "{field}.mcp: \"http\" needs launcher = \"sandbox\" (the MCP listener lives on the sandbox's own loopback)"
        ));
    }
    if entry.microvm && !command.is_absolute() {
        problems.push(format!(
            "{field}.command: {} must be an absolute path under runtimes[{i}].sandbox.extraRoPaths with launcher = \"microvm\" (the guest has no PATH of the host's)",
            spec.command
        ));
    }
    launch_size_check(entry, &field, problems)
}

/// `problems`, or (when there are none) the spec's launch argument checked
/// against [`MAX_LAUNCH_BYTES`]; all of them joined, one a line.
fn launch_size_check(
    entry: &HarnessEntry<'_>,
    field: &str,
    mut problems: Vec<String>,
) -> Result<(), String> {
    if problems.is_empty()
        && let Some(arg) = launch_arg(entry.manifest.clone(), entry.spec)
        && arg.len() > MAX_LAUNCH_BYTES
    {
        problems.push(format!(
            "{field}: the spec is {} bytes as JSON, more than {MAX_LAUNCH_BYTES}; shorten the generated files",
            arg.len()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// The CLI against its content pin (`sha256`), at load: a file whose
/// bytes hash otherwise, or a `#!` script (which the harness could not
/// execute through the descriptor it hashed), is a problem naming both
/// digests or the fix.
fn cli_pin_problem(field: &str, spec: &HarnessSpec) -> Option<String> {
    use sha2::Digest;
    let pin = spec.sha256.as_deref()?;
    let mut hasher = sha2::Sha256::new();
    let mut head = Vec::new();
    let read = std::fs::File::open(&spec.command).and_then(|f| {
        use std::io::Read;
        (&f).take(2).read_to_end(&mut head)?;
        hasher.update(&head);
        std::io::copy(&mut &f, &mut hasher)
    });
    if let Err(e) = read {
        return Some(format!(
            "{field}.sha256: {} cannot be read to check its pin: {e}",
            spec.command
        ));
    }
    let actual: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual != pin {
        return Some(format!(
            "{field}.sha256: {} has sha256 {actual}, the pin is {pin}; restore the pinned CLI, or set the pin to `sha256sum {}` if this file is the one to run",
            spec.command, spec.command
        ));
    }
    head.starts_with(b"#!").then(|| format!(
        "{field}.sha256: {} is a `#!` script, which the harness cannot execute through the descriptor it hashed; pin its interpreter as the command and pass the script in args",
        spec.command
    ))
}

/// The `--harness` argument of the runtime `manifest` names, whose
/// harness spec is `spec`.
pub fn launch_arg(manifest: RuntimeManifest, spec: &HarnessSpec) -> Option<String> {
    let spec = spec.clone();
    let route_url = spec.route.as_ref().map(|r| format!("{}/{r}", egress_url()));
    let launch = HarnessLaunch {
        manifest,
        spec,
        route_url,
        placeholder_key: PLACEHOLDER_MODEL_KEY.into(),
    };
    serde_json::to_string(&launch).ok()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::HostConfig;

    fn config(harness: &str) -> Result<HostConfig, String> {
        let text = format!(
            r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "a"
version = "1"
program = "/bin/true"

[[runtimes]]
id = "b"
version = "1"
program = "/bin/true"
[runtimes.harness]
{harness}
"#
        );
        HostConfig::parse(&text, "host.toml", Path::new("/tmp")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_missing_binary_fails_at_load_naming_the_entry() {
        let e = config(
            r#"command = "/opt/not-installed/bin/cli"
mcp = "stdio"
final = { from = "stdout" }"#,
        )
        .unwrap_err();
        assert!(
            e.contains("runtimes[1].harness.command: /opt/not-installed/bin/cli cannot be used"),
            "{e}"
        );
    }

    /// The spec language's misuses are load errors naming the field and
    /// the fix; the same forms used right load.
    #[test]
    fn the_spec_languages_misuses_are_refused_naming_the_fix() {
        let e = config(
            r#"command = "/bin/sh"
mcp = "stdio"
args = ["--mcp={mcpCommandLine}", "{...prompt}"]
stdin = "{promt}"
final = { from = "json", pointer = "/r" }"#,
        )
        .unwrap_err();
        for want in [
            "runtimes[1].harness.args[0]: {mcpCommandLine} is a list: use it as a whole argument",
            "runtimes[1].harness.args[1]: {...prompt} splices a list, and prompt is one value: write {json:prompt}",
            "runtimes[1].harness.stdin: {promt} is not a template variable",
        ] {
            assert!(e.contains(want), "{want}\n{e}");
        }
        let e = config(
            r#"command = "/bin/sh"
mcp = "stdio"
final = { from = "json", pointer = "/r", take = "last" }"#,
        )
        .unwrap_err();
        assert!(
            e.contains("unknown variant `last`, expected one of `lastLine`, `document`, `lines`"),
            "{e}"
        );
        config(
            r#"command = "/bin/sh"
mcp = "stdio"
args = ["{mcpCommandLine}", "-c", "{prompt}"]
stdin = "{prompt}"
final = { from = "json", pointer = "/r", take = "document" }
[[runtimes.harness.files]]
path = "{tmp}/c.json"
content = """{"command": {json:mcpCommandLine}, "again": [{json:mcpCommand}, {...mcpArgs}]}"""
"#,
        )
        .unwrap();
    }

    #[test]
    fn a_cli_the_sandbox_cannot_see_is_refused_and_a_good_spec_loads() {
        let e = config(
            r#"command = "/bin/sh"
mcp = "http"
args = ["-c", "{mcpUrl}", "{mcpArgs}"]
final = { from = "file", path = "{home}/out" }"#,
        )
        .unwrap_err();
        assert!(
            e.contains("runtimes[1].harness.args[2]: {mcpArgs} needs mcp = \"stdio\""),
            "{e}"
        );
        let ok = config(
            r#"command = "/bin/sh"
mcp = "stdio"
args = ["-c", "{prompt}", "{mcpCommand}", "{mcpArgs}"]
final = { from = "file", path = "{home}/out" }"#,
        )
        .unwrap();
        let entry = &ok.runtimes[1];
        let arg = super::launch_arg(entry.manifest(), entry.harness.as_ref().unwrap()).unwrap();
        assert!(
            arg.contains("\"placeholderKey\":\"sharedos-placeholder\""),
            "{arg}"
        );
        let e = config(
            r#"command = "/var/tmp"
mcp = "stdio"
final = { from = "stdout" }"#,
        )
        .unwrap_err();
        assert!(
            e.contains("runtimes[1].harness.command: /var/tmp is not an executable file"),
            "{e}"
        );
        let e = config(
            r#"command = "/etc/hostname"
mcp = "stdio"
final = { from = "stdout", take = "sometimes" }"#,
        )
        .unwrap_err();
        assert!(e.contains("unknown variant `sometimes`"), "{e}");
        // An executable outside the paths the sandbox sees.
        let d = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
        let cli = d.path().join("cli");
        std::fs::copy("/bin/true", &cli).unwrap();
        let e = config(&format!(
            "command = {:?}\nmcp = \"stdio\"\nfinal = {{ from = \"stdout\" }}",
            cli.display().to_string()
        ))
        .unwrap_err();
        assert!(e.contains("is not visible in the sandbox; add its directory to runtimes[1].sandbox.extraRoPaths"), "{e}");
    }

    /// With `launcher = "microvm"` a harness loads (its CLI goes on the
    /// guest's read-only disk) when the CLI lies under `extraRoPaths`, and
    /// is refused naming the fix when it does not.
    #[test]
    fn a_microvm_harness_loads_with_its_cli_under_extra_ro_paths() {
        // Not under /tmp, which a host not running as root refuses in
        // extraRoPaths (the sandbox replaces it).
        let d = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
        let cli = d.path().join("bin/cli");
        std::fs::create_dir_all(cli.parent().unwrap()).unwrap();
        std::fs::copy("/bin/true", &cli).unwrap();
        let toml = |ro: &str| {
            format!(
                r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "b"
version = "1"
program = "/bin/true"
launcher = "microvm"
[runtimes.sandbox]
extraRoPaths = [{ro}]
[runtimes.harness]
command = {cli:?}
mcp = "stdio"
final = {{ from = "stdout" }}
"#,
                cli = cli.display().to_string()
            )
        };
        let ok = HostConfig::parse(
            &toml(&format!("{:?}", d.path().display().to_string())),
            "host.toml",
            Path::new("/tmp"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let s = ok.runtimes[0].microvm_settings();
        assert_eq!(s.harness_cli.as_deref(), Some(cli.as_path()));
        let e = HostConfig::parse(&toml(""), "host.toml", Path::new("/tmp"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is not on the microVM's read-only disk; add its directory to runtimes[0].sandbox.extraRoPaths"),
            "{e}"
        );
    }
}
