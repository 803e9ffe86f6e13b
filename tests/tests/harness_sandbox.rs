//! The harness sandbox mode (`mcp = "http"`) from the outside: the CLI may
//! reach the harness's MCP port on the sandbox's own loopback and nothing
//! else: not a listener on the host's loopback, not another port (bind or
//! connect), not DNS, not UDP; the host's listener sees no connection.

use std::net::TcpListener;

use serde_json::json;
use sharedos_tests::harness::{HarnessCase, fixture_dir, python_with_mcp, run_harness, script};

const PROBE: &str = r#"
import json, socket, sys
host_port = int(sys.argv[1])
out = {}
def tcp(name, addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(addr)
        out[name] = "connected"
    except OSError as e:
        out[name] = "errno %s" % e.errno
    finally:
        s.close()
tcp("hostLoopback", ("127.0.0.1", host_port))
tcp("egressPort", ("127.0.0.1", 8787))
tcp("elsewhere", ("10.0.0.1", 443))
tcp("mcpPort", ("127.0.0.1", 8788))
try:
    b = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    b.bind(("127.0.0.1", 9999))
    out["bindOther"] = "bound"
except OSError as e:
    out["bindOther"] = "errno %s" % e.errno
try:
    socket.getaddrinfo("example.com", 443)
    out["dns"] = "resolved"
except OSError as e:
    out["dns"] = "failed"
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out["udp"] = "created"
except OSError as e:
    out["udp"] = "errno %s" % e.errno
print(json.dumps(out))
"#;

#[test]
fn a_harness_mode_sandbox_reaches_only_its_mcp_port() {
    let _serial = sharedos_tests::serial();
    let py = python_with_mcp();
    let dir = fixture_dir();
    let probe = script(dir.path(), "probe.py", PROBE);
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let harness = format!(
        r#"[runtimes.harness]
command = {exe:?}
args = [{probe:?}, "{port}"]
mcp = "http"
env = {{ SHAREDOS_TEST_MARKER = "MARKER", UNUSED_URL = "{{mcpUrl}}" }}
final = {{ from = "stdout" }}
"#,
        exe = py.exe.display().to_string(),
        probe = probe.display().to_string(),
    );
    let mut ro = py.ro_paths;
    ro.push(dir.path().to_path_buf());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let turn = rt.block_on(run_harness(HarnessCase::new(&harness, ro)));
    turn.assert_no_survivor();
    assert_eq!(turn.status(), "succeeded", "{:#}", turn.json());
    let seen: serde_json::Value =
        serde_json::from_str(turn.json()["output"].as_str().unwrap()).unwrap();
    let eacces = format!("errno {}", libc::EACCES);
    assert_eq!(
        seen,
        json!({
            "hostLoopback": eacces,
            "egressPort": eacces,
            "elsewhere": eacces,
            "mcpPort": "connected",
            "bindOther": eacces,
            "dns": "failed",
            "udp": format!("errno {}", libc::EPERM),
        })
    );
    assert!(
        matches!(host.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host's listener accepted a connection"
    );
}
