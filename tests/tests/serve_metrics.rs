//! `GET /metrics` of `sharedos serve` over its real socket: after one run
//! with a tool call, the OpenMetrics text counts the admission, the run's
//! ending, its tool call, its plugin launch and the store's journal
//! writes, and the gauges say nothing is live and the lease holds.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::json;
use sharedos_tests::served::{open_session, run_to_end, send, start, write_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_is_counted_in_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([{"op": "call", "tool": "files.write", "arguments": {"path": "m.txt", "content": "1"}}]);
    let ended = run_to_end(&socket, &session, "req-1", script).await;
    assert_eq!(ended["result"]["status"], "succeeded", "{ended}");

    let req = Request::builder()
        .method("GET")
        .uri("http://sharedos/metrics")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send(&socket, req).await;
    assert_eq!(resp.status(), 200);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    for line in [
        "sharedos_runs_admitted_total 1",
        "sharedos_runs_ended_total{status=\"succeeded\"} 1",
        "sharedos_tool_calls_total{status=\"succeeded\"} 1",
        "sharedos_plugin_launches_total{launcher=\"direct\"} 1",
        "sharedos_admission_seconds_count 1",
        "sharedos_run_seconds_count 1",
        "sharedos_live_runs 0",
        "sharedos_queued_runs 0",
        "sharedos_lease_held 1",
        "# EOF",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    let appends = text
        .lines()
        .find_map(|l| l.strip_prefix("sharedos_store_seconds_count{operation=\"append_event\"} "))
        .unwrap_or_else(|| panic!("no journal writes counted:\n{text}"));
    assert!(appends.parse::<u64>().unwrap() >= 3, "{text}");
}
