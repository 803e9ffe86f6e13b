//! The strong sandbox against the adversary: one real turn through the
//! whole host (config → seat → `ProcessRuntime` → `SandboxLauncher` →
//! `Executor` with the real kernel) with every piece of bait laid on the
//! host, then one test per family of sandbox.md C. Each attack is a named
//! assertion naming the layer of sandbox.md C that must stop it, checked on
//! the host side (listeners, victim, files, shm, hostname) and on the
//! plugin's receipt where the plugin can judge.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;
use sharedos_tests::bait::*;

/// The one strong turn, shared by the family tests below.
struct Strong {
    run: TurnRun,
    host: HostSide,
    receipts: BTreeMap<String, Value>,
    result_text: String,
    secrets: Vec<String>,
    victim: u32,
    hostname_before: String,
    sequence: Vec<String>,
}

fn strong() -> &'static Strong {
    static STRONG: OnceLock<Strong> = OnceLock::new();
    STRONG.get_or_init(|| {
        let _serial = serial();
        let mut bait = HostBait::lay();
        let policy = bait.policy();
        // The default sequence, with C25 (kill(-1)) just before the victim
        // is attacked last (C24): in a pid namespace it is safe to run.
        let mut sequence: Vec<String> =
            default_ids().into_iter().filter(|id| id != "C24").collect();
        sequence.extend(["C25".to_string(), "C24".to_string()]);
        let ids: Vec<&str> = sequence.iter().map(String::as_str).collect();
        let mut json = bait.json();
        json["allow_kill_all"] = true.into();
        let run = run_turn(TurnSpec::new(policy, json).only(&ids).timeout_ms(90_000));
        let host = bait.inspect();
        let receipts = run.receipts();
        let result_text = serde_json::to_string(&run.json()).unwrap();
        let secrets = bait.secrets.clone();
        let victim = bait.victim_pid();
        let hostname_before = bait.hostname.clone();
        bait.reap_victim();
        Strong {
            run,
            host,
            receipts,
            result_text,
            secrets,
            victim,
            hostname_before,
            sequence,
        }
    })
}

#[test]
fn strong_turn_is_complete_reported_strong_and_leaves_nothing() {
    let s = strong();
    assert_eq!(
        s.run.status(),
        "succeeded",
        "errors: {}",
        s.run.error_text()
    );
    let report = s.run.sandbox_report();
    assert_eq!(
        s.run.level(),
        sharedos_tests::full_level(),
        "report: {report}"
    );
    assert!(
        sharedos_tests::full_missing(&report).is_empty(),
        "report: {report}"
    );
    assert_eq!(s.run.launches, 1);
    // Every attack of the sequence reported a receipt through the host.
    for id in &s.sequence {
        assert!(
            s.receipts.contains_key(id),
            "{id}: no sandbox.attack receipt"
        );
    }
    let attempted = s
        .receipts
        .values()
        .filter(|r| r["attempted"] == true)
        .count();
    assert!(attempted >= 44, "only {attempted} attacks attempted");
    let succeeded: Vec<&String> = s
        .receipts
        .iter()
        .filter(|(_, r)| r["blocked"] == false)
        .map(|(id, _)| id)
        .collect();
    assert!(succeeded.is_empty(), "attacks that worked: {succeeded:?}");
    // The outcome's summary agrees with the receipts.
    let summary = &s.run.json()["output"]["summary"];
    assert_eq!(summary["succeeded"], 0, "{summary}");
    assert_eq!(summary["attempted"], attempted, "{summary}");
    // No secret of the host reached the result, whatever path it took.
    let leaked = leaked_secrets(&s.result_text, &s.secrets);
    assert!(leaked.is_empty(), "secrets in the result: {leaked:?}");
    assert!(
        s.run.survivors.is_empty(),
        "survivors: {:?}",
        s.run.survivors
    );
    assert!(
        s.run.leftover_workspaces.is_empty(),
        "workspaces left: {:?}",
        s.run.leftover_workspaces
    );
    assert!(
        s.run.leftover_cgroups.is_empty(),
        "cgroups left: {:?}",
        s.run.leftover_cgroups
    );
}

#[test]
fn files_c01_to_c08_and_c29_stay_out_of_reach() {
    let s = strong();
    let (r, h) = (&s.receipts, &s.host);
    blocked(r, "C01", "mountns; Landlock");
    assert_eq!(
        h.files["secret"], None,
        "C01 read-host-secret (mountns; Landlock)"
    );
    blocked(r, "C02", "mountns (private HOME); Landlock");
    for f in ["ssh_key", "aws_credentials"] {
        assert_eq!(
            h.files[f], None,
            "C02 read-home-credentials {f} (mountns; Landlock)"
        );
    }
    blocked(r, "C03", "uid != 0; selective /etc bind");
    blocked(r, "C04", "ro binds; Landlock");
    let c04: Vec<_> = h
        .pwned
        .iter()
        .filter(|p| !p.to_string_lossy().ends_with(".pwned"))
        .collect();
    assert!(
        c04.is_empty(),
        "C04 write-outside-workspace (ro binds; Landlock): {c04:?}"
    );
    not_succeeded(r, "C05", "mountns private tmpfs; Landlock");
    assert_eq!(
        h.files["host_tmp"], None,
        "C05 write-host-tmp (mountns private tmpfs; Landlock)"
    );
    assert!(
        !h.pwned
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".pwned")),
        "C05 write-host-tmp: a .pwned file appeared in the host's /tmp (mountns private tmpfs; Landlock): {:?}",
        h.pwned
    );
    blocked(r, "C06", "mountns (target absent); Landlock");
    blocked(r, "C07", "mountns; Landlock Refer/MakeReg");
    // The secret's ctime and link count would move with a hard link.
    assert_eq!(
        h.files["secret"], None,
        "C06/C07 symlink/hard-link to the secret (mountns; Landlock)"
    );
    // C08 needs a `.git` in the workspace; the host makes a fresh, empty
    // one per turn, so there is nothing to protect (sandbox.md C row 8:
    // no layer yet, "–").
    let c08 = &r["C08"];
    assert_eq!(
        c08["attempted"], false,
        "C08 replace-protected-metadata: {c08}"
    );
    blocked(r, "C29", "private HOME; proxy-side credential injection");
    assert_eq!(
        h.files["codex_auth"], None,
        "C29 vendor-cli-credentials (private HOME)"
    );
}

#[test]
fn network_c09_to_c19_reaches_nothing() {
    let s = strong();
    let (r, h) = (&s.receipts, &s.host);
    blocked(r, "C09", "netns; seccomp family; Landlock ConnectTcp");
    assert_eq!(
        h.tcp_accepts, 0,
        "C09 tcp-connect-host-loopback: the host listener accepted (netns; seccomp; Landlock ConnectTcp)"
    );
    blocked(r, "C10", "seccomp");
    not_succeeded(r, "C11", "netns; seccomp");
    assert_eq!(
        h.udp_datagrams, 0,
        "C11 udp-to-host-port: the host socket got datagrams (netns; seccomp)"
    );
    blocked(r, "C12", "seccomp; Landlock BindTcp; netns");
    // Beyond the receipt: the helper's report (written before the plugin
    // ran, delivered to the host) says the plugin had its own network
    // namespace, so no listener it bound can be in the host's.
    layer_applied(s, "netns", "C12 bind-tcp-listener / C19");
    blocked(r, "C13", "mountns; strict seccomp; Landlock ResolveUnix");
    assert_eq!(
        h.unix_accepts, 0,
        "C13 unix-connect-host-pathname: the host socket accepted (mountns)"
    );
    blocked(r, "C14", "netns; Landlock Scope::AbstractUnixSocket");
    assert_eq!(
        h.abstract_accepts, 0,
        "C14 unix-connect-host-abstract: the host socket accepted (netns; Landlock scope)"
    );
    blocked(r, "C15", "seccomp");
    blocked(r, "C16", "seccomp; no CAP_NET_RAW");
    blocked(r, "C17", "seccomp (vsock is not namespaced)");
    blocked(r, "C18", "seccomp");
    blocked(r, "C19", "netns");
}

#[test]
fn processes_c20_to_c26_cannot_touch_the_victim() {
    let s = strong();
    let (r, h) = (&s.receipts, &s.host);
    blocked(r, "C20", "pidns; seccomp; no caps");
    assert_eq!(
        h.victim_tracer.as_deref(),
        Some("0"),
        "C20 ptrace-attach: the victim {} was traced (pidns; seccomp)",
        s.victim
    );
    blocked(r, "C21", "seccomp; pidns");
    blocked(r, "C22", "pidns + own procfs; uid != 0");
    blocked(r, "C23", "pidns");
    layer_applied(s, "pidns", "C21/C22/C23");
    layer_applied(s, "uid_drop", "C22");
    blocked(r, "C24", "pidns; Landlock Scope::Signal; uid");
    assert!(
        h.victim_alive,
        "C24 kill-victim: the victim {} died (pidns; Landlock scope; uid)",
        s.victim
    );
    assert_eq!(
        h.victim_state,
        Some('S'),
        "C24 kill-victim: the victim {} is not sleeping (stopped?)",
        s.victim
    );
    not_succeeded(r, "C25", "pidns; Landlock scope");
    assert!(
        h.victim_alive,
        "C25 kill-minus-one: the victim {} died (pidns; Landlock scope)",
        s.victim
    );
    blocked(r, "C26", "pidns; seccomp (pidfd_getfd)");
    assert!(
        h.victim_alive,
        "C26 pidfd-open-getfd-signal: the victim {} died (pidns; seccomp)",
        s.victim
    );
}

#[test]
fn leaks_c27_c28_c60_nothing_is_inherited() {
    let s = strong();
    let r = &s.receipts;
    let report = s.run.sandbox_report();
    blocked(r, "C27", "close_range CLOEXEC");
    assert_eq!(
        report["fds"],
        serde_json::json!([0, 1, 2]),
        "C27 inherited-fds: the plugin started with more than stdio (close_range)"
    );
    blocked(r, "C28", "env_clear + allowlist");
    let keys: Vec<&str> = report["env_keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for (k, _) in SECRET_ENV.iter().chain([&CONFIG_SECRET_ENV]) {
        assert!(
            !keys.contains(k),
            "C28 env-credential-leak: {k} reached the plugin (env_clear + allowlist)"
        );
    }
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains(CONFIG_SECRET_ENV.0),
        "C28: the dropped configured credential must be named in the report's warnings: {warnings}"
    );
    // Configured in the host's file, the credential never gets that far:
    // the configuration is refused at load, naming the key.
    let text = host_config_text().replace(
        "env = { RUST_BACKTRACE = \"0\" }",
        &format!(
            "env = {{ RUST_BACKTRACE = \"0\", {} = \"{}\" }}",
            CONFIG_SECRET_ENV.0, CONFIG_SECRET_ENV.1
        ),
    );
    let refused = sharedos_host::config::HostConfig::parse(&text, "c28.toml", Path::new("/"))
        .expect_err("a configured credential outside the allowlist is refused at load");
    assert!(
        refused.message.contains(&format!(
            "runtimes[0].env.{}: not admitted",
            CONFIG_SECRET_ENV.0
        )),
        "{refused}"
    );
    let leaked = leaked_secrets(&s.result_text, &s.secrets);
    assert!(
        leaked.is_empty(),
        "C28/C22: secrets in the result: {leaked:?}"
    );
    blocked(r, "C60", "cap drop (bounding set before the uid change)");
    let sc = &report["self_check"];
    for cap in ["cap_eff", "cap_prm", "cap_bnd", "cap_amb"] {
        assert_eq!(sc[cap], 0, "C60 capabilities-left: {cap} (cap drop): {sc}");
    }
}

#[test]
fn kernel_surface_c46_to_c55_c58_c59_c61_is_closed() {
    let s = strong();
    let (r, h) = (&s.receipts, &s.host);
    blocked(r, "C46", "seccomp; no caps");
    blocked(r, "C47", "seccomp (unshare, clone flags, clone3)");
    blocked(r, "C48", "seccomp; pidns");
    blocked(
        r,
        "C49",
        "NO_NEW_PRIVS; nosuid binds; unmapped owner in userns",
    );
    blocked(r, "C50", "NO_NEW_PRIVS; nosuid");
    blocked(r, "C51", "minimal /dev");
    blocked(r, "C52", "own procfs in pidns; uid");
    blocked(r, "C53", "/sys not mounted");
    blocked(r, "C54", "setsid; seccomp (32-bit compare)");
    blocked(r, "C55", "utsns; seccomp; no caps");
    assert_eq!(
        h.hostname, s.hostname_before,
        "C55 change-hostname-and-time: the host's hostname changed (utsns; seccomp)"
    );
    blocked(r, "C58", "seccomp");
    blocked(r, "C58a", "seccomp allowlist (mount/LSM/xattrat refused)");
    blocked(r, "C58b", "seccomp (prlimit64 on pid 0 only)");
    blocked(r, "C58c", "seccomp (personality query and PER_LINUX only)");
    blocked(r, "C58d", "seccomp (memfd_create refused by default)");
    blocked(r, "C58e", "seccomp allowlist (unlisted -> ENOSYS)");
    let unlisted = &r["C58e"]["observed"];
    assert!(
        unlisted.to_string().matches("ENOSYS").count() == 3,
        "C58e: every unlisted syscall answers ENOSYS: {unlisted}"
    );
    blocked(r, "C59", "x32 guard; seccompiler arch check = KILL_PROCESS");
    blocked(r, "C61", "RLIMIT_CORE=0");
    // Beyond the receipt: the helper set the core limit to 0 (soft and
    // hard, so the plugin cannot raise it) before the plugin ran.
    let report = s.run.sandbox_report();
    assert_eq!(
        report["rlimits"]["core"], 0,
        "C61 core-dump: RLIMIT_CORE is not 0 in the helper's report: {}",
        report["rlimits"]
    );
    layer_applied(s, "rlimits_status", "C61 core-dump");
    layer_applied(s, "utsns", "C55");
    layer_applied(s, "caps", "C46/C48/C55 (no capabilities)");
    layer_applied(
        s,
        "root",
        "C51/C53 (minimal root: /sys not mounted, minimal /dev)",
    );
    assert_eq!(
        report["no_new_privs"], true,
        "C49/C50: no_new_privs not set in the helper's report"
    );
}

/// A layer the helper reports `applied` (its report is written by the
/// helper before `execve` and delivered to the host, never by the plugin).
fn layer_applied(s: &Strong, layer: &str, attacks: &str) {
    let report = s.run.sandbox_report();
    assert_eq!(
        report[layer]["state"], "applied",
        "{attacks}: the helper reports {layer} {}",
        report[layer]
    );
}

#[test]
fn ipc_c56_c57_host_shared_memory_is_untouched() {
    let s = strong();
    let (r, h) = (&s.receipts, &s.host);
    blocked(r, "C56", "ipcns; seccomp in reduced mode");
    layer_applied(s, "ipcns", "C56 host-sysv-shm");
    assert_eq!(
        h.shm, None,
        "C56 host-sysv-shm: the host segment was attached or changed (ipcns)"
    );
    blocked(r, "C57", "private /dev/shm tmpfs; Landlock");
    assert_eq!(
        h.files["devshm"], None,
        "C57 host-dev-shm-file: the host file was read or changed (private /dev/shm; Landlock)"
    );
}

#[test]
fn c62_setup_race_is_host_side() {
    // The plugin cannot race the helper's path resolution once it runs; the
    // helper's O_NOFOLLOW workspace open is covered by the sandbox crate's
    // `symlinked_workspace_is_refused`.
    let s = strong();
    assert_eq!(
        s.receipts["C62"]["attempted"], false,
        "C62: {}",
        s.receipts["C62"]
    );
}

/// The host-side detectors are live: a read of a watched file, a connection
/// to each listener, a datagram and an attach of the shm segment are all
/// seen, so the assertions above cannot pass by being blind.
#[test]
fn host_side_detectors_see_real_access() {
    use std::io::Write;
    let _serial = serial();
    let mut bait = HostBait::lay();
    keep_pid(bait.victim_pid());
    let _ = std::fs::read(&bait.secret.path).unwrap();
    std::fs::write(format!("{}.pwned", bait.host_tmp.path.display()), "x").unwrap();
    let tcp = bait.tcp.local_addr().unwrap();
    let mut c = std::net::TcpStream::connect(tcp).unwrap();
    c.write_all(b"x").unwrap();
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    u.send_to(b"x", bait.udp.local_addr().unwrap()).unwrap();
    let _s = std::os::unix::net::UnixStream::connect(&bait.unix_path).unwrap();
    let addr = {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(bait.abstract_name.as_bytes()).unwrap()
    };
    let _a = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let h = bait.inspect();
    if atime_is_tracked(&bait.secret.path) {
        assert!(
            h.files["secret"]
                .as_deref()
                .unwrap_or_default()
                .contains("atime"),
            "{h:?}"
        );
    }
    assert_eq!(h.files["host_tmp"], None);
    assert!(!h.pwned.is_empty(), "{h:?}");
    assert_eq!(
        (
            h.tcp_accepts,
            h.udp_datagrams,
            h.unix_accepts,
            h.abstract_accepts
        ),
        (1, 1, 1, 1)
    );
    assert!(h.victim_alive);
}
