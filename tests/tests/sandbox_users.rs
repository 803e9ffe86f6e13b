//! The sandbox's users from the outside: a real Python plugin on the SDK,
//! seated through `sharedos run` in the full sandbox, asks who it is the
//! ways ordinary programs do (Python's `pwd` and `getpass`, Node's
//! `os.userInfo()`, `id`) and reads `/etc/passwd` and `/etc/group`. Every
//! way answers with the sandbox's own user, and no host user or group (root
//! included) is in what it reads.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use sharedos_tests::plugin_bin;
use sharedos_tests::turns::{request, seat_toml};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

const PLUGIN: &str = r#"
import getpass, grp, os, pwd, subprocess, sys
sys.path.insert(0, os.path.dirname(__file__))
from sharedos_plugin import Complete, RuntimeManifest, serve

def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    return {"code": p.returncode, "out": p.stdout, "err": p.stderr}

class Who:
    def manifest(self):
        return RuntimeManifest("who", "0.1.0")

    async def run(self, request, host, abort):
        e = pwd.getpwuid(os.getuid())
        node = "const u = require('os').userInfo(); console.log(JSON.stringify(u))"
        return Complete({
            "uid": os.getuid(),
            "pwd": [e.pw_name, e.pw_dir, e.pw_shell],
            "getpass": getpass.getuser(),
            "group": grp.getgrgid(os.getgid()).gr_name,
            "home": os.environ.get("HOME"),
            "id": run(["id"]),
            "node": run(["/usr/bin/node", "-e", node]),
            "passwd": open("/etc/passwd").read(),
            "groups": open("/etc/group").read(),
        })

sys.exit(serve(Who()))
"#;

/// The plugin and a copy of the Python SDK in one directory below `base`.
fn plugin_dir(base: &Path) -> PathBuf {
    let dir = base.join("who");
    std::fs::create_dir(&dir).unwrap();
    let copied = Command::new("cp")
        .arg("-r")
        .arg(repo().join("sdk/python/sharedos_plugin"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::write(dir.join("main.py"), PLUGIN).unwrap();
    dir
}

fn host_toml(dir: &Path) -> String {
    let main = dir.join("main.py");
    seat_toml(
        "who",
        &format!(
            "program = \"/usr/bin/python3\"\nargs = [{main:?}]\nsandbox = {{ extraRoPaths = [{dir:?}] }}"
        ),
    )
}

/// The user names (or group names) a passwd- or group-format text lists.
fn names(text: &str) -> Vec<&str> {
    text.lines().filter_map(|l| l.split(':').next()).collect()
}

#[test]
fn ordinary_programs_find_the_sandbox_user_and_no_host_user() {
    let base = sharedos_tests::plugin_tempdir();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = plugin_dir(base.path());
    let config = base.path().join("host.toml");
    std::fs::write(&config, host_toml(&dir)).unwrap();
    let req = base.path().join("turn.json");
    let mut r = request("exec-sandbox-users", json!(null), &[], 60_000);
    r["message"]["payload"] = json!({});
    std::fs::write(&req, r.to_string()).unwrap();
    let out = Command::new(plugin_bin("sharedos"))
        .args(["run", "--config"])
        .arg(&config)
        .arg("--request")
        .arg(&req)
        .env_remove("SHAREDOS_LOG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(out.status.code(), Some(0), "{result:#}\n{err}");
    assert_eq!(
        result["metadata"]["runtime"]["sandbox"]["level"],
        sharedos_tests::full_level()
    );
    let o = &result["output"];
    let uid = o["uid"].as_u64().expect("uid");
    // The sandbox's own uid, not the host's root.
    assert_ne!(uid, 0, "{o:#}");
    assert_eq!(
        o["pwd"],
        json!(["sandbox", "/sandbox/home", "/usr/sbin/nologin"]),
        "{o:#}"
    );
    assert_eq!(o["getpass"], "sandbox", "{o:#}");
    assert_eq!(o["group"], "sandbox", "{o:#}");
    assert_eq!(o["home"], "/sandbox/home", "{o:#}");
    assert_eq!(o["id"]["code"], 0, "{o:#}");
    assert_eq!(
        o["id"]["out"].as_str().unwrap_or_default().trim(),
        format!("uid={uid}(sandbox) gid={uid}(sandbox) groups={uid}(sandbox)"),
        "{o:#}"
    );
    assert_eq!(o["node"]["code"], 0, "{o:#}");
    let node: Value =
        serde_json::from_str(o["node"]["out"].as_str().unwrap_or_default()).unwrap_or_default();
    assert_eq!(node["username"], "sandbox", "{o:#}");
    assert_eq!(node["homedir"], "/sandbox/home", "{o:#}");
    assert_eq!(node["shell"], "/usr/sbin/nologin", "{o:#}");
    assert_eq!(node["uid"], uid, "{o:#}");
    // What it reads names the sandbox user and the overflow id only: no
    // host user or group, root's included.
    let passwd = o["passwd"].as_str().unwrap_or_default();
    let groups = o["groups"].as_str().unwrap_or_default();
    assert_eq!(names(passwd), ["sandbox", "nobody"], "{passwd}");
    assert_eq!(names(groups), ["sandbox", "nogroup"], "{groups}");
    assert!(!passwd.contains("root") && !groups.contains("root"));
    // The host has users the sandbox must not show (root at least).
    let host = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(names(&host).contains(&"root") && names(&host).len() > 2);
}
