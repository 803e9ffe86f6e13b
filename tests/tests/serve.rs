//! `sharedos serve` as a real process, over its unix socket, with a real
//! HTTP client (hyper): dedupe, re-attach after a disconnect and cancel on
//! both stores (SQLite and a real PostgreSQL server), and recovery after
//! the host is SIGKILLed mid-run.

use std::time::Duration;

use serde_json::{Value, json};
use sharedos_tests::served::{
    Backend, Events, call, open_session, run_body, start, wait_state, write_config,
};
use sharedos_tests::turns::{AGENT, NAMESPACE};

sharedos_tests::both_stores!(dedupe_scope_and_close_over_the_socket);
sharedos_tests::both_stores!(an_observer_re_attaches_after_a_disconnect_without_gap_or_duplicate);
sharedos_tests::both_stores!(cancel_over_the_socket_ends_the_run_cancelled);

async fn dedupe_scope_and_close_over_the_socket(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let runs = format!("/v1/sessions/{session}/runs");
    let script = json!([{"op": "call", "tool": "files.write", "arguments": {"path": "n.txt", "content": "1"}}]);
    let (status, first) = call(
        &socket,
        "POST",
        &runs,
        "operator",
        run_body("req-1", script.clone()),
    )
    .await;
    assert_eq!(status, 201, "{first}");
    let run = first["run"]["id"].as_str().unwrap().to_owned();
    let (status, again) = call(
        &socket,
        "POST",
        &runs,
        "operator",
        run_body("req-1", script),
    )
    .await;
    assert_eq!(
        (status, again["repeated"].clone()),
        (200, json!(true)),
        "{again}"
    );
    assert_eq!(again["run"]["id"], json!(run));
    let (status, conflict) = call(
        &socket,
        "POST",
        &runs,
        "operator",
        run_body("req-1", json!([])),
    )
    .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["code"], "request_conflict");

    let ended = wait_state(&socket, &run, "ended").await;
    assert_eq!(ended["result"]["status"], "succeeded");
    let (status, _) = call(
        &socket,
        "GET",
        &format!("/v1/runs/{run}"),
        "mallory",
        Value::Null,
    )
    .await;
    assert_eq!(status, 404, "another scope sees nothing");
    let (status, _) = call(
        &socket,
        "GET",
        &format!("/v1/runs/{run}"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);

    let (status, _) = call(
        &socket,
        "DELETE",
        &format!("/v1/sessions/{session}"),
        "mallory",
        Value::Null,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = call(
        &socket,
        "DELETE",
        &format!("/v1/sessions/{session}"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    let (status, closed) = call(
        &socket,
        "POST",
        &runs,
        "operator",
        run_body("req-2", json!([])),
    )
    .await;
    assert_eq!(
        (status, closed["error"]["code"].clone()),
        (409, json!("session_closed"))
    );
    let mode = std::fs::metadata(&socket).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
}

async fn an_observer_re_attaches_after_a_disconnect_without_gap_or_duplicate(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let mut script = Vec::new();
    for i in 0..12 {
        script.push(json!({"op": "emit", "type": "step", "data": {"i": i}}));
        script.push(json!({"op": "sleep", "ms": 30}));
    }
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", Value::Array(script)),
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();

    let mut events = Events::open(&socket, &run, None).await;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let (id, _, _) = events.next().await.unwrap();
        seen.push(id.unwrap());
    }
    drop(events); // the client goes away mid-stream
    let mut events = Events::open(&socket, &run, seen.last().copied()).await;
    loop {
        let (id, kind, data) = events
            .next()
            .await
            .expect("the stream ends with an end event");
        if kind == "end" {
            break;
        }
        assert_eq!(data["sequence"].as_u64(), id);
        seen.push(id.unwrap());
    }
    let expected: Vec<u64> = (0..seen.len() as u64).collect();
    assert_eq!(seen, expected);
    assert!(seen.len() > 12);

    let beyond = seen.len() as u64 + 10;
    let (status, err) = call(
        &socket,
        "GET",
        &format!("/v1/runs/{run}/events?afterSequence={beyond}"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].clone()),
        (400, json!("sequence_beyond_end")),
        "{err}"
    );
}

async fn cancel_over_the_socket_ends_the_run_cancelled(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([{"op": "emit", "type": "parked", "data": {}}, {"op": "stall"}]);
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", script),
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let mut events = Events::open(&socket, &run, None).await;
    while events.next().await.unwrap().2["data"]["type"] != "parked" {}
    let (status, body) = call(
        &socket,
        "POST",
        &format!("/v1/runs/{run}/cancel"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(
        (status, body["cancelled"].clone()),
        (200, json!(true)),
        "{body}"
    );
    let ended = wait_state(&socket, &run, "ended").await;
    assert_eq!(ended["result"]["status"], "cancelled");
    let kinds = events.kinds_to_end().await;
    assert_eq!(kinds.last().map(String::as_str), Some("end"), "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_run_is_recovered_at_restart_without_replay() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let mut server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let pidfile = dir.path().join("daemon.pid");
    let script = json!([
        {"op": "emit_pid"},
        {"op": "fork", "n": 1, "setsid": true, "double": true, "pidfile": pidfile.display().to_string()},
        {"op": "call", "tool": "files.write", "arguments": {"path": "effect.txt", "content": "once"}},
        {"op": "emit", "type": "written", "data": {}},
        {"op": "stall"}
    ]);
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", script.clone()),
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let mut events = Events::open(&socket, &run, None).await;
    let mut plugin_pid = None;
    let mut last = None;
    loop {
        let (id, _, e) = events.next().await.expect("events before the stall");
        last = id.or(last);
        if e["data"]["type"] == "pid" {
            plugin_pid = e["data"]["data"]["pid"].as_u64();
        }
        if e["data"]["type"] == "written" {
            break;
        }
    }
    let plugin_pid = u32::try_from(plugin_pid.expect("the plugin emitted its pid")).unwrap();
    // The double-forked `setsid` daemon writes its own pid.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let forked: u32 = loop {
        let text = std::fs::read_to_string(&pidfile).unwrap_or_default();
        if let Ok(pid) = text.trim().parse() {
            break pid;
        }
        assert!(std::time::Instant::now() < until, "the daemon wrote no pid");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SIGKILL: no drain, no cleanup.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    // The plugin dies with its host (its parent-death signal), on its own.
    let gone = |pid: u32| {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while sharedos_tests::turns::is_alive(pid) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        !sharedos_tests::turns::is_alive(pid)
    };
    let plugin_gone = gone(plugin_pid);
    if !plugin_gone {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(plugin_pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
    }
    assert!(
        plugin_gone,
        "the plugin {plugin_pid} outlived its SIGKILLed host"
    );
    let effect = dir
        .path()
        .join("files")
        .join(NAMESPACE)
        .join(AGENT)
        .join("effect.txt");
    assert_eq!(std::fs::read_to_string(&effect).unwrap(), "once");
    std::fs::remove_file(&effect).unwrap();

    let server = start(dir.path());
    let socket = server.socket();
    // The daemon the plugin left in its cgroup is killed when the next
    // host seats the runtime (the sweep of dead hosts' cgroups).
    let forked_gone = gone(forked);
    if !forked_gone {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(forked as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
    }
    assert!(
        forked_gone,
        "the plugin's setsid daemon {forked} outlived its SIGKILLed host and the restart"
    );
    let run_now = wait_state(&socket, &run, "interrupted").await;
    let recovery = &run_now["recovery"];
    assert_eq!(recovery["reason"], "host_restarted");
    assert_eq!(recovery["calls"][0]["tool"], "files.write");
    assert_eq!(recovery["calls"][0]["outcome"], "succeeded");
    assert_eq!(recovery["interrupted"], json!([]));
    // The journal says so, after the last event the first host stored.
    let mut events = Events::open(&socket, &run, last).await;
    let (_, kind, _) = events.next().await.unwrap();
    assert_eq!(kind, "run.interrupted");
    assert_eq!(events.next().await.unwrap().1, "end");
    // Nothing was re-executed: the deleted effect stays deleted, and a
    // repeat of the request returns the interrupted run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!effect.exists(), "the effect was replayed");
    let (status, again) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", script),
    )
    .await;
    assert_eq!(
        (status, again["run"]["state"].clone()),
        (200, json!("interrupted"))
    );
    assert!(!effect.exists());
    let store =
        sharedos_store::SqliteStore::open(dir.path().join("sharedos.db"), Default::default())
            .unwrap();
    let writes = sharedos_store::Store::audit_trail(&store, &run)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| {
            r.kind == "tool.invoked" && r.outcome == sharedos_kernel::AuditOutcome::Succeeded
        })
        .count();
    assert_eq!(writes, 1, "one successful write in the audit trail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_runs_in_flight_before_exiting() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let mut server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([{"op": "emit", "type": "parked", "data": {}}, {"op": "sleep", "ms": 1500},
                        {"op": "emit", "type": "finished", "data": {}}]);
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", script),
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let mut events = Events::open(&socket, &run, None).await;
    while events.next().await.unwrap().2["data"]["type"] != "parked" {}
    let pid = rustix::process::Pid::from_raw(server.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = server.child.wait().unwrap();
    assert!(
        status.success(),
        "serve exits cleanly after the drain: {status:?}"
    );
    let store =
        sharedos_store::SqliteStore::open(dir.path().join("sharedos.db"), Default::default())
            .unwrap();
    let ended = sharedos_store::Store::run(&store, &run).await.unwrap();
    assert_eq!(ended.state, sharedos_store::RunState::Ended);
    assert_eq!(
        ended.result.unwrap()["status"],
        "succeeded",
        "the run finished, not cut off"
    );
    assert!(!socket.exists(), "the socket is removed on exit");
}

/// One request over TCP with an optional bearer token; the status.
async fn tcp_status(addr: std::net::SocketAddr, token: Option<&str>) -> u16 {
    use http_body_util::Full;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/v1/sessions"))
        .header("content-type", "application/json")
        .header("sharedos-scope", sharedos_tests::served::scope("operator"));
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let body = sharedos_tests::served::session_spec().to_string();
    let resp = sender
        .send_request(req.body(Full::new(bytes::Bytes::from(body))).unwrap())
        .await
        .unwrap();
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_is_opt_in_and_every_request_needs_the_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let token = "0123456789abcdef-serve-token";
    std::fs::write(dir.path().join("token"), format!("{token}\n")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let db = dir.path().join("sharedos.db").display().to_string();
    let listen = addr.to_string();
    let token_file = dir.path().join("token").display().to_string();
    let mut child = std::process::Command::new(sharedos_tests::turns::workspace_bin("sharedos"))
        .args(["serve", "--config"])
        .arg(dir.path().join("host.toml"))
        .args([
            "--database",
            &db,
            "--listen",
            &listen,
            "--token-file",
            &token_file,
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(std::time::Instant::now() < deadline, "serve did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(tcp_status(addr, None).await, 401);
    assert_eq!(
        tcp_status(addr, Some("0123456789abcdef-wrong-token")).await,
        401
    );
    assert_eq!(tcp_status(addr, Some(token)).await, 201);
    let _ = child.kill();
    let _ = child.wait();

    // Without a token file, --listen is refused at start.
    let out = std::process::Command::new(sharedos_tests::turns::workspace_bin("sharedos"))
        .args(["serve", "--config"])
        .arg(dir.path().join("host.toml"))
        .args(["--listen", &listen])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("token-file"));
}
