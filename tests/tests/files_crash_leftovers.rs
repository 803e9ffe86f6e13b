//! A write interrupted by a host crash leaves its `.sharedos-tmp-*` file;
//! the next host to open the files root removes it. A real `sharedos run`
//! seats the testplugin (in the sandbox), which writes 1 MiB files in a
//! loop; the host is SIGKILLed while a temp file exists. Then a second
//! `sharedos run` on the same configuration opens the root: the temp file
//! is gone, every finished file is still there, whole.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sharedos_tests::turns::{
    AGENT, NAMESPACE, kill_marked, request, testplugin_host_toml, wait_gone, workspace_bin,
};

const BYTES: usize = 1_000_000;

fn temps_and_finals(dir: &Path) -> (Vec<String>, Vec<String>) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .into_iter()
        .partition(|n| n.starts_with(".sharedos-tmp-"))
}

fn run(config: &Path, req: &Path, tmp: &Path, out: &Path) -> std::process::Child {
    Command::new(workspace_bin("sharedos"))
        .arg("run")
        .arg("--config")
        .arg(config)
        .arg("--request")
        .arg(req)
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(out).unwrap())
        .spawn()
        .unwrap()
}

/// Crashes a host mid-write; `Some(temp files)` when the crash left one.
fn crash_mid_write(dir: &Path, marker: &str) -> Option<Vec<String>> {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let config = dir.join("host.toml");
    std::fs::write(&config, testplugin_host_toml(marker, "sandbox", 120_000)).unwrap();
    let req: PathBuf = dir.join("turn.json");
    let script = json!([{"op": "write_files", "n": 400, "bytes": BYTES}]);
    std::fs::write(
        &req,
        request("leftover-1", script, &["files.write"], 120_000).to_string(),
    )
    .unwrap();
    let mut host = run(&config, &req, &tmp, &dir.join("stderr-1"));
    let bulk = dir.join("files").join(NAMESPACE).join(AGENT).join("bulk");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (temps, finals) = temps_and_finals(&bulk);
        if !temps.is_empty() && finals.len() >= 2 {
            break;
        }
        if let Ok(Some(status)) = host.try_wait() {
            panic!(
                "the host ended before the crash ({status}): {}",
                std::fs::read_to_string(dir.join("stderr-1")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < until, "no write got under way");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: kill(2) on the child we spawned.
    unsafe {
        libc::kill(host.id() as i32, libc::SIGKILL);
    }
    host.wait().unwrap();
    assert!(
        wait_gone(marker, Duration::from_secs(10)).is_empty(),
        "the plugin outlived its host"
    );
    kill_marked(marker);
    let (temps, _) = temps_and_finals(&bulk);
    (!temps.is_empty()).then_some(temps)
}

#[test]
fn the_next_host_removes_the_temp_files_of_writes_a_crash_interrupted() {
    // The kill lands between two syscalls of the host; retry until it
    // caught a write with its temp file on disk.
    let mut crashed = None;
    for attempt in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let marker = format!("leftover-{}-{attempt}", std::process::id());
        if let Some(temps) = crash_mid_write(dir.path(), &marker) {
            crashed = Some((dir, temps));
            break;
        }
    }
    let (dir, temps) = crashed.expect("20 crashes mid-write, none left a temp file");
    let bulk = dir
        .path()
        .join("files")
        .join(NAMESPACE)
        .join(AGENT)
        .join("bulk");
    let (_, finals_before) = temps_and_finals(&bulk);

    // A new host opens the same root (a turn that does nothing).
    let req = dir.path().join("turn-2.json");
    std::fs::write(
        &req,
        request("leftover-2", json!([]), &["files.write"], 30_000).to_string(),
    )
    .unwrap();
    let status = run(
        &dir.path().join("host.toml"),
        &req,
        &dir.path().join("tmp"),
        &dir.path().join("stderr-2"),
    )
    .wait()
    .unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(dir.path().join("stderr-2")).unwrap_or_default()
    );

    let (temps_after, finals_after) = temps_and_finals(&bulk);
    assert!(
        temps_after.is_empty(),
        "left after the sweep: {temps_after:?} (before: {temps:?})"
    );
    assert_eq!(finals_after, finals_before, "real files stay");
    for f in &finals_after {
        let len = std::fs::metadata(bulk.join(f)).unwrap().len();
        assert_eq!(len, BYTES as u64, "{f} is whole");
    }
}
