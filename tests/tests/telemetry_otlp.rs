//! Traces over OTLP/HTTP: `sharedos run` with a collector named by the
//! OpenTelemetry variables exports the turn's `sharedos.turn` span, in the
//! trace of the request's `traceId`, to a real HTTP collector on loopback
//! (docs/SERVE.md, "Traces").

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;
use sharedos_tests::plugin_bin;

/// A collector on loopback: every POST's path and body, answered 200.
fn collector() -> (String, mpsc::Receiver<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let mut length = 0usize;
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).unwrap_or(0) == 0 {
                            return;
                        }
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    let _ = tx.send((path, body));
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if writer.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, rx)
}

fn demo_files(dir: &Path) -> (String, String) {
    let config = dir.join("host.toml");
    let request = dir.join("turn.json");
    std::fs::write(&config, include_str!("../../host/demo/host.toml")).unwrap();
    std::fs::write(&request, include_str!("../../host/demo/turn.json")).unwrap();
    (config.display().to_string(), request.display().to_string())
}

fn run_with(env: &[(&str, &str)], tmp: &Path) -> Output {
    let runtime_dir = tempfile::tempdir().unwrap();
    let (config, request) = demo_files(tmp);
    let mut cmd = Command::new(plugin_bin("sharedos"));
    cmd.args(["run", "--config", &config, "--request", &request])
        .env("TMPDIR", tmp)
        .env("XDG_RUNTIME_DIR", runtime_dir.path())
        .env_remove("SHAREDOS_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run sharedos")
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            AnyValue::StringValue(s) => s.clone(),
            other => format!("{other:?}"),
        })
}

#[test]
fn a_turn_is_exported_as_a_span_in_the_trace_of_its_trace_id() {
    let (url, received) = collector();
    let tmp = tempfile::tempdir().unwrap();
    let out = run_with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &url)], tmp.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "succeeded");
    // The command flushed its batch before exiting.
    let mut spans = Vec::new();
    while let Ok((path, body)) = received.recv_timeout(Duration::from_secs(10)) {
        assert_eq!(path, "/v1/traces");
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        for resource in request.resource_spans {
            let service = resource
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .and_then(|kv| kv.value.as_ref()?.value.clone());
            assert_eq!(
                service,
                Some(AnyValue::StringValue("sharedos".into())),
                "the resource names the service"
            );
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        if spans.iter().any(|s| s.name == "sharedos.turn") {
            break;
        }
    }
    let turn = spans
        .iter()
        .find(|s| s.name == "sharedos.turn")
        .unwrap_or_else(|| panic!("no sharedos.turn span among {spans:?}"));
    assert_eq!(
        turn.trace_id,
        sharedos_host::telemetry::otel_trace_id("trace-demo-1").to_vec(),
        "the span is in the trace of the request's traceId"
    );
    assert_eq!(
        attribute(turn, "sharedos.trace_id").as_deref(),
        Some("trace-demo-1")
    );
    assert_eq!(
        attribute(turn, "sharedos.execution_id").as_deref(),
        Some("demo-turn-1")
    );
    assert_eq!(
        attribute(turn, "sharedos.status").as_deref(),
        Some("Succeeded")
    );
    assert!(turn.end_time_unix_nano > turn.start_time_unix_nano);
}

#[test]
fn a_collector_that_is_down_costs_the_turn_nothing() {
    // A port nothing listens on: bound, then closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let out = run_with(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url)], tmp.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "succeeded");
}

#[test]
fn a_collector_address_that_is_not_a_url_is_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run_with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")], tmp.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot export traces to not a url"),
        "{stderr}"
    );
    assert!(!tmp.path().join("audit.jsonl").exists(), "nothing ran");
}
