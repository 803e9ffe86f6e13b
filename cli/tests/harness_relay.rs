//! The stdio relay as a real process: it carries bytes both ways between
//! its stdio and the harness's socket, and exits at the end of its stdin,
//! on SIGTERM and on SIGINT, within a bound.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn relay(dir: &std::path::Path) -> (Child, std::os::unix::net::UnixStream) {
    let sock = dir.join("mcp.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    // Through `env --default-signal`: a test run started in the
    // background of a non-interactive shell inherits SIGINT ignored, and
    // the relay keeps the dispositions it inherits (its parent's choice).
    let child = Command::new("env")
        .arg("--default-signal=INT,TERM")
        .arg(env!("CARGO_BIN_EXE_sharedos-harness"))
        .args(["mcp-relay", sock.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (conn, _) = listener.accept().unwrap();
    (child, conn)
}

fn exits_within(child: &mut Child, bound: Duration) -> bool {
    let until = Instant::now() + bound;
    while Instant::now() < until {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

#[test]
fn the_relay_carries_lines_and_exits_at_the_end_of_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, mut conn) = relay(dir.path());
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
        .unwrap();
    let mut line = String::new();
    BufReader::new(&mut conn).read_line(&mut line).unwrap();
    assert_eq!(line, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n");
    conn.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut answer = String::new();
    out.read_line(&mut answer).unwrap();
    assert_eq!(answer, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n");
    drop(stdin);
    assert!(exits_within(&mut child, Duration::from_secs(10)));
    // The harness saw the session end.
    let mut rest = Vec::new();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(conn.read_to_end(&mut rest).unwrap(), 0);
}

#[test]
fn the_relay_exits_on_sigterm_and_sigint() {
    use rustix::process::{Pid, Signal, kill_process};
    for sig in [Signal::TERM, Signal::INT] {
        let dir = tempfile::tempdir().unwrap();
        let (mut child, _conn) = relay(dir.path());
        let pid = Pid::from_raw(child.id() as i32).expect("a child's pid is positive");
        kill_process(pid, sig).unwrap();
        assert!(exits_within(&mut child, Duration::from_secs(10)), "{sig:?}");
    }
}
