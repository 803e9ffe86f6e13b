//! The configuration's own checks, at load.

use super::*;

const MIN: &str = r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "r"
version = "1"
program = "sharedos-echo"

[[agents]]
agentId = "alice"
runtime = "r"
"#;

#[test]
fn parses_minimal() {
    let c = HostConfig::parse(MIN, "host.toml", Path::new("/etc/sharedos")).unwrap();
    assert_eq!(c.runtime_for("alice").unwrap().id.as_str(), "r");
    assert_eq!(
        c.resolve(&c.host.audit_path),
        PathBuf::from("/etc/sharedos/audit.jsonl")
    );
}

#[test]
fn unknown_key_names_the_field() {
    let bad = MIN.replace("filesRoot", "filesroot");
    let e = HostConfig::parse(&bad, "host.toml", Path::new(".")).unwrap_err();
    assert!(e.to_string().starts_with("host.toml: "), "{e}");
    assert!(e.message.contains("filesroot"), "{e}");
}

#[test]
fn agent_bound_to_unknown_runtime_is_refused() {
    let bad = MIN.replace("runtime = \"r\"", "runtime = \"nope\"");
    let e = HostConfig::parse(&bad, "host.toml", Path::new(".")).unwrap_err();
    assert!(e.message.contains("agents[0].runtime"), "{e}");
}

#[test]
fn unknown_kernel_key_is_refused() {
    let bad = format!("{MIN}\n[kernel]\ngrant = []\n");
    let e = HostConfig::parse(&bad, "host.toml", Path::new(".")).unwrap_err();
    assert!(e.message.contains("kernel.grant"), "{e}");
}

#[test]
fn out_of_range_limits_are_refused() {
    let bad = MIN.replace("[host]", "[host]\ndrainGraceMs = 700000");
    let e = HostConfig::parse(&bad, "host.toml", Path::new(".")).unwrap_err();
    assert!(e.message.contains("drainGraceMs"), "{e}");
}

#[test]
fn a_sandbox_uid_range_with_a_host_account_is_refused() {
    // uid 0 (root) is in every passwd; 65534 is never a sandbox uid.
    for range in ["first = 0, count = 10", "first = 65530, count = 10"] {
        let text = MIN.replace(
            "program = \"sharedos-echo\"\n",
            &format!("program = \"sharedos-echo\"\nsandbox = {{ uids = {{ {range} }} }}\n"),
        );
        let e = HostConfig::parse(&text, "host.toml", Path::new("/")).unwrap_err();
        assert!(e.message.contains("runtimes[0].sandbox.uids"), "{e}");
    }
}

#[test]
fn the_inflight_tool_call_limit_is_per_runtime_and_bounded() {
    let c = HostConfig::parse(MIN, "host.toml", Path::new(".")).unwrap();
    assert_eq!(c.runtimes[0].max_inflight_tool_calls, 64);
    let set = MIN.replace(
        "program = \"sharedos-echo\"\n",
        "program = \"sharedos-echo\"\nmaxInflightToolCalls = 256\n",
    );
    let c = HostConfig::parse(&set, "host.toml", Path::new(".")).unwrap();
    assert_eq!(c.runtimes[0].max_inflight_tool_calls, 256);
    for bad in ["0", "1025"] {
        let text = set.replace("256", bad);
        let e = HostConfig::parse(&text, "host.toml", Path::new(".")).unwrap_err();
        assert!(
            e.message
                .contains("runtimes[0].maxInflightToolCalls: must be 1..=1024"),
            "{e}"
        );
    }
}

#[test]
fn warm_sandboxes_are_bounded() {
    let ok = MIN.replace(
        "program = \"sharedos-echo\"\n",
        "program = \"sharedos-echo\"\nsandbox = { warm = 2 }\n",
    );
    let c = HostConfig::parse(&ok, "host.toml", Path::new(".")).unwrap();
    assert_eq!(c.runtimes[0].sandbox.warm, 2);
    let bad = ok.replace("warm = 2", "warm = 9");
    let e = HostConfig::parse(&bad, "host.toml", Path::new(".")).unwrap_err();
    assert!(e.message.contains("runtimes[0].sandbox.warm"), "{e}");
    assert!(e.message.contains("0..=8"), "{e}");
}

#[test]
fn microvm_refuses_at_load_what_it_cannot_carry_and_a_bad_shape() {
    let vm = MIN.replace(
        "program = \"sharedos-echo\"",
        "program = \"/bin/true\"\nlauncher = \"microvm\"",
    );
    let c = HostConfig::parse(&vm, "host.toml", Path::new("/")).unwrap();
    // The RAM defaults to the policy's memory bound (cgroup.memoryMax).
    let s = c.runtimes[0].microvm_settings();
    let policy_max = c.runtimes[0].sandbox.cgroup.memory_max;
    assert_eq!(
        s.memory_mib,
        policy_max.map_or(super::microvm::DEFAULT_MEMORY_MIB, |b| b.div_ceil(1 << 20))
    );
    assert_eq!(s.vcpus, 1);
    let bad = |extra: &str, expect: &str| {
        let text = vm.replace(
            "launcher = \"microvm\"",
            &format!("launcher = \"microvm\"\n{extra}"),
        );
        let e = HostConfig::parse(&text, "host.toml", Path::new("/")).unwrap_err();
        assert!(e.message.contains(expect), "{extra}: {e}");
    };
    bad(
        "microvm = { kernel = \"boot/vmlinuz\" }",
        "runtimes[0].microvm.kernel: must be an absolute path",
    );
    bad(
        "microvm = { kernel = \"/nonexistent/vmlinuz\" }",
        "runtimes[0].microvm.kernel: /nonexistent/vmlinuz cannot be read",
    );
    bad(
        "microvm = { memoryMib = 16 }",
        "runtimes[0].microvm.memoryMib: must be 64..=65536, got 16",
    );
    bad(
        "microvm = { vcpus = 0 }",
        "runtimes[0].microvm.vcpus: must be 1..=64",
    );
    // VMs booted ahead are carried.
    let warm = vm.replace(
        "launcher = \"microvm\"",
        "launcher = \"microvm\"\nsandbox = { warm = 1 }",
    );
    assert!(HostConfig::parse(&warm, "host.toml", Path::new("/")).is_ok());
    // A network policy is carried (the gateway over a serial line).
    let egress = vm.replace(
        "launcher = \"microvm\"",
        "launcher = \"microvm\"\nnetwork = { destinations = [{ address = \"127.0.0.1:9\", allow = [\"loopback\"] }] }",
    );
    let c = HostConfig::parse(&egress, "host.toml", Path::new("/")).unwrap();
    assert!(c.runtimes[0].sandbox_policy().egress_port.is_some());
    let direct = MIN.replace(
        "program = \"sharedos-echo\"",
        "program = \"/bin/true\"\nlauncher = \"direct\"\nmicrovm = { vcpus = 2 }",
    );
    let e = HostConfig::parse(&direct, "host.toml", Path::new("/")).unwrap_err();
    assert!(
        e.message
            .contains("runtimes[0].microvm: applies to launcher = \"microvm\" only"),
        "{e}"
    );
}

#[test]
fn gvisor_refuses_at_load_what_it_cannot_carry() {
    let gvisor = MIN.replace(
        "program = \"sharedos-echo\"",
        "program = \"/bin/true\"\nlauncher = \"gvisor\"",
    );
    assert!(HostConfig::parse(&gvisor, "host.toml", Path::new("/")).is_ok());
    let bad = |extra: &str, expect: &str| {
        let text = gvisor.replace(
            "launcher = \"gvisor\"",
            &format!("launcher = \"gvisor\"\n{extra}"),
        );
        let e = HostConfig::parse(&text, "host.toml", Path::new("/")).unwrap_err();
        assert!(e.message.contains(expect), "{extra}: {e}");
    };
    bad(
        "gvisor = { runsc = \"bin/runsc\" }",
        "runtimes[0].gvisor.runsc: must be an absolute path",
    );
    // The container's uid (uids.first) is checked like the sandbox's:
    // never root, never an account of this machine.
    bad(
        "sandbox = { uids = { first = 0, count = 16 } }",
        "runtimes[0].sandbox.uids:",
    );
    // The egress gateway reaches a gVisor container through its relay.
    let egress = gvisor.replace(
        "launcher = \"gvisor\"",
        "launcher = \"gvisor\"\nnetwork = { destinations = [{ address = \"127.0.0.1:9\", allow = [\"loopback\"] }] }",
    );
    assert!(HostConfig::parse(&egress, "host.toml", Path::new("/")).is_ok());
    let direct = MIN.replace(
        "program = \"sharedos-echo\"",
        "program = \"/bin/true\"\nlauncher = \"direct\"\ngvisor = { runsc = \"/usr/bin/runsc\" }",
    );
    let e = HostConfig::parse(&direct, "host.toml", Path::new("/")).unwrap_err();
    assert!(
        e.message
            .contains("runtimes[0].gvisor: applies to launcher = \"gvisor\" only"),
        "{e}"
    );
}

#[test]
fn a_direct_runtime_asking_for_a_sandbox_level_or_memory_bound_is_refused_at_load() {
    let direct = |sandbox: &str| {
        MIN.replace(
            "program = \"sharedos-echo\"",
            &format!("program = \"/bin/true\"\nlauncher = \"direct\"\n{sandbox}"),
        )
    };
    for (sandbox, key, part) in [
        (
            "sandbox = { minLevel = \"isolated\" }",
            "runtimes[0].sandbox.minLevel",
            "can never be met; fix: use launcher = \"sandbox\"",
        ),
        (
            "sandbox = { minLevel = \"strong\" }",
            "runtimes[0].sandbox.minLevel",
            "minLevel = \"strong\"",
        ),
        (
            "sandbox = { requireMemoryBound = true }",
            "runtimes[0].sandbox.requireMemoryBound",
            "delegated cgroup v2 memory controller",
        ),
    ] {
        let e = HostConfig::parse(&direct(sandbox), "host.toml", Path::new("/")).unwrap_err();
        assert!(e.message.starts_with(key), "{sandbox}: {e}");
        assert!(e.message.contains(part), "{sandbox}: {e}");
    }
    // Nothing asked, or nothing it cannot meet: loads.
    for sandbox in [
        "",
        "sandbox = { minLevel = \"minimal\", requireMemoryBound = false }",
    ] {
        HostConfig::parse(&direct(sandbox), "host.toml", Path::new("/"))
            .unwrap_or_else(|e| panic!("{sandbox:?}: {e}"));
    }
    // The same keys under the sandbox launcher are its to enforce.
    let sandboxed = MIN.replace(
        "program = \"sharedos-echo\"",
        "program = \"/bin/true\"\nsandbox = { requireMemoryBound = true }",
    );
    HostConfig::parse(&sandboxed, "host.toml", Path::new("/")).expect("a sandboxed runtime");
}
