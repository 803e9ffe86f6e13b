//! `sharedos serve` under connection floods, over its real unix socket:
//! thousands of idle and half-sent connections do not keep health or a
//! run out, and the server itself closes each one past its timeout (the
//! client reads EOF); a head sent too slowly is closed long before an idle
//! connection; at the cap with every connection busy a new one is answered
//! `503 too_many_connections`; run out of descriptors (`ulimit -n 40`), the
//! server reports its lowered cap, pauses accepting instead of spinning,
//! reports failures at a bounded rate, and answers again once the flood is
//! gone. Bounds are generous: nothing here measures speed.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::served::{
    Events, call, open_session, run_body, run_to_end, start, start_run, wait_state,
    write_config_with,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// A connection to the socket, retried while the server's backlog is full.
/// The test process holds thousands: its soft descriptor limit goes to the
/// hard one first, as the host's own does (a user's soft limit is often
/// 1024).
async fn connect(socket: &Path) -> UnixStream {
    static RAISED: std::sync::Once = std::sync::Once::new();
    RAISED.call_once(|| {
        sharedos_host::process::raise_fd_limit().expect("raise the soft RLIMIT_NOFILE");
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match UnixStream::connect(socket).await {
            Ok(s) => return s,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot connect: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Whether the server closed `stream` within `within`: EOF, or a reset.
async fn closed_by_server(stream: &mut UnixStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// `GET /v1/health` on a new connection: its status and how long it took.
async fn health(socket: &Path) -> (u16, Duration) {
    let asked = Instant::now();
    let (status, _) = call(socket, "GET", "/v1/health", "operator", Value::Null).await;
    (status, asked.elapsed())
}

/// Descriptors the server process holds.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

const HALF_HEAD: &[u8] = b"GET /v1/health HTTP/1.1\r\nhost: sharedos\r\nx-slow: ";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_and_half_sent_connections_keep_nobody_out_and_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(
        dir.path(),
        "\n[serve]\nidleTimeoutMs = 4000\nheaderReadTimeoutMs = 4000\n",
    );
    let server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let before = descriptors(server.child.id());

    let mut flood = Vec::new();
    for i in 0..3000 {
        let mut stream = connect(&socket).await;
        if i % 2 == 1 {
            stream.write_all(HALF_HEAD).await.unwrap();
        }
        flood.push(stream);
    }

    let (status, took) = health(&socket).await;
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(10), "health took {took:?}");
    let run = run_to_end(&socket, &session, "amid-the-flood", json!([])).await;
    assert_eq!(run["result"]["status"], "succeeded", "{run}");

    // Every flood connection is closed by the server: evicted to make
    // room, or past its timeout.
    let mut open = 0;
    for stream in &mut flood {
        if !closed_by_server(stream, Duration::from_secs(60)).await {
            open += 1;
        }
    }
    assert_eq!(open, 0, "connections the server never closed");
    drop(flood);
    let deadline = Instant::now() + Duration::from_secs(30);
    while descriptors(server.child.id()) > before + 16 {
        assert!(
            Instant::now() < deadline,
            "the server still holds {} descriptors (before the flood: {before})",
            descriptors(server.child.id())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = health(&socket).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_head_or_body_is_cut_off_long_before_an_idle_connection() {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(
        dir.path(),
        "\n[serve]\nheaderReadTimeoutMs = 1000\nidleTimeoutMs = 120000\n",
    );
    let server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;

    let mut idle = connect(&socket).await;
    let mut slow_head = connect(&socket).await;
    slow_head.write_all(HALF_HEAD).await.unwrap();
    assert!(
        closed_by_server(&mut slow_head, Duration::from_secs(60)).await,
        "a head that never ends is closed"
    );
    assert!(
        !closed_by_server(&mut idle, Duration::from_millis(500)).await,
        "an idle connection is kept until its own, longer, timeout"
    );

    // A body that stops short of its Content-Length: 408 with a code.
    let mut slow_body = connect(&socket).await;
    let head = format!(
        "POST /v1/sessions/{session}/runs HTTP/1.1\r\nhost: sharedos\r\ncontent-type: application/json\r\nsharedos-scope: {}\r\ncontent-length: 1000\r\n\r\n{{\"requestId\"",
        sharedos_tests::served::scope("operator")
    );
    slow_body.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        let mut buf = [0u8; 4096];
        loop {
            match slow_body.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
            if answer.windows(15).any(|w| w == b"request_timeout") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server never answered the short body");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains("request_timeout"),
        "{answer}"
    );
    // Nothing was admitted from it.
    let (status, _) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("after-the-slow-body", json!([])),
    )
    .await;
    assert_eq!(status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_with_every_connection_busy_a_new_one_is_503() {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), "\n[serve]\nmaxConnections = 3\n");
    let server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([{"op": "emit", "type": "parked", "data": {}}, {"op": "stall"}]);
    let run = start_run(&socket, &session, "stalls", script).await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut events = Events::open(&socket, &run, None).await;
        events.until("parked").await;
        streams.push(events);
    }

    let (status, body) = call(&socket, "GET", "/v1/health", "operator", Value::Null).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &json!("too_many_connections")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maxConnections"),
        "{body}"
    );

    // One stream less: room again.
    streams.pop();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = call(&socket, "GET", "/v1/health", "operator", Value::Null).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "no room after a stream closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(streams);
    let (status, body) = call(
        &socket,
        "POST",
        &format!("/v1/runs/{run}/cancel"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let ended = wait_state(&socket, &run, "ended").await;
    assert_eq!(ended["result"]["status"], "cancelled");
}

#[test]
fn connection_options_out_of_range_are_refused_naming_the_key() {
    for (extra, key) in [
        ("headerReadTimeoutMs = 0", "serve.headerReadTimeoutMs"),
        ("idleTimeoutMs = 99999999", "serve.idleTimeoutMs"),
        ("maxConnections = 0", "serve.maxConnections"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_config_with(dir.path(), &format!("\n[serve]\n{extra}\n"));
        let config = dir.path().join("host.toml");
        let err = sharedos_serve::config::ServeConfig::load(&config).unwrap_err();
        assert!(err.to_string().contains(key), "{err}");
    }
}

/// User and system CPU time of `pid` so far, in clock ticks (USER_HZ,
/// 100 per second on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_accept_loop_backs_off_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(
        dir.path(),
        "\n[serve]\nheaderReadTimeoutMs = 30000\nidleTimeoutMs = 30000\n",
    );
    let mut command = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        "ulimit -n 40; exec \"$@\"".to_owned(),
        "sh".to_owned(),
    ];
    command.extend(sharedos_tests::served::serve_command(
        dir.path(),
        "serve.sock",
        &[],
    ));
    let server = sharedos_tests::served::start_command(dir.path(), "serve.sock", command);
    let socket = server.socket();
    let pid = server.child.id();

    // The one connection the lowered cap holds is kept busy by the event
    // stream of a stalled run; every later one waits, unanswered, for its
    // head, each holding a descriptor, until there are none left.
    let session = open_session(&socket).await;
    let script = json!([{"op": "emit", "type": "parked", "data": {}}, {"op": "stall"}]);
    let run = start_run(&socket, &session, "stalls", script).await;
    let mut busy = Events::open(&socket, &run, None).await;
    busy.until("parked").await;
    let mut flood = Vec::new();
    for _ in 0..60 {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(200), UnixStream::connect(&socket)).await
        {
            flood.push(s);
        }
    }
    let window = Duration::from_secs(6);
    let (ticks, started) = (cpu_ticks(pid), Instant::now());
    tokio::time::sleep(window).await;
    let used = Duration::from_millis((cpu_ticks(pid) - ticks) * 10);
    let elapsed = started.elapsed();
    assert!(
        used < elapsed * 15 / 100,
        "the server used {used:?} of CPU in {elapsed:?} while out of descriptors"
    );

    drop(flood);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, _)) = tokio::time::timeout(Duration::from_secs(5), health(&socket)).await {
            break;
        }
        assert!(Instant::now() < deadline, "health never answered again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(busy);
    let (status, _) = call(
        &socket,
        "POST",
        &format!("/v1/runs/{run}/cancel"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    wait_state(&socket, &run, "ended").await;
    let log = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("serve-"))
        .unwrap();
    let err = std::fs::read_to_string(log).unwrap();
    assert!(
        err.contains("does not fit the descriptor limit") && err.contains("at most 1 connections"),
        "the lowered cap is reported: {err}"
    );
    let reports = err.matches("accepting a connection failed").count();
    assert!(
        err.contains("Too many open files"),
        "the flood ran the server out of descriptors: {err}"
    );
    let bound = (started.elapsed().as_secs() / 5 + 3) as usize;
    assert!(
        reports <= bound,
        "{reports} accept failure reports, at most {bound} expected: {err}"
    );
}
