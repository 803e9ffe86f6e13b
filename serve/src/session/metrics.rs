//! The host's Prometheus metrics, served at `GET /metrics`
//! (docs/SERVE.md, "Metrics").
//!
//! Counted where the host already sees each thing happen: admission in
//! `Sessions::run`, tool calls and egress from the events the journal
//! stores, run endings and plugin launches from the stored result, store
//! latency around the journal's and admission's writes. Labels carry only
//! values the host chooses (a status, a route name of the configuration,
//! an operation), never a plugin's text, so a plugin cannot grow the
//! series without bound.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::Value;
use sharedos_protocol::{EventKind, ExecutionEvent};

use super::{AdmissionStatus, LeaseStatus};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Status {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Egress {
    route: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Direction {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Tokens {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Launch {
    launcher: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Operation {
    operation: &'static str,
}

/// The outcomes the host itself names; anything else counts as `other`.
const RUN_STATUSES: &[&str] = &[
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
    "denied",
    "escalated",
];
const CALL_STATUSES: &[&str] = &["succeeded", "failed", "denied", "cancelled", "timed_out"];

fn seconds_buckets() -> Histogram {
    // 1 ms to about 16 min.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

fn store_buckets() -> Histogram {
    // 50 µs to about 26 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

/// Every metric of one host.
pub struct Metrics {
    registry: Registry,
    runs_admitted: Counter,
    runs_refused: Counter,
    runs_ended: Family<Status, Counter>,
    admission_seconds: Histogram,
    run_seconds: Histogram,
    tool_calls: Family<Status, Counter>,
    egress_requests: Family<Egress, Counter>,
    egress_bytes: Family<Direction, Counter>,
    egress_tokens: Family<Tokens, Counter>,
    plugin_launches: Family<Launch, Counter>,
    store_seconds: Family<Operation, Histogram, fn() -> Histogram>,
    live_runs: Gauge,
    queued_runs: Gauge,
    lease_epoch: Gauge,
    lease_held: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("sharedos"),
            runs_admitted: Counter::default(),
            runs_refused: Counter::default(),
            runs_ended: Family::default(),
            admission_seconds: seconds_buckets(),
            run_seconds: seconds_buckets(),
            tool_calls: Family::default(),
            egress_requests: Family::default(),
            egress_bytes: Family::default(),
            egress_tokens: Family::default(),
            plugin_launches: Family::default(),
            store_seconds: Family::new_with_constructor(store_buckets as fn() -> Histogram),
            live_runs: Gauge::default(),
            queued_runs: Gauge::default(),
            lease_epoch: Gauge::default(),
            lease_held: Gauge::default(),
        };
        m.register();
        m
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        r.register(
            "runs_admitted",
            "Runs admitted (stored) by this host",
            self.runs_admitted.clone(),
        );
        r.register(
            "runs_refused",
            "Runs refused too_many_runs",
            self.runs_refused.clone(),
        );
        r.register(
            "runs_ended",
            "Runs ended here, by result status",
            self.runs_ended.clone(),
        );
        r.register(
            "admission_seconds",
            "From a run request to its run stored",
            self.admission_seconds.clone(),
        );
        r.register(
            "run_seconds",
            "From a run stored to its end stored",
            self.run_seconds.clone(),
        );
        r.register(
            "tool_calls",
            "Tool calls completed, by status",
            self.tool_calls.clone(),
        );
        r.register(
            "egress_requests",
            "Model requests through the gateway, by route and outcome",
            self.egress_requests.clone(),
        );
        r.register(
            "egress_bytes",
            "Bytes through the gateway, by direction",
            self.egress_bytes.clone(),
        );
        r.register(
            "egress_tokens",
            "Model tokens charged, by kind",
            self.egress_tokens.clone(),
        );
        r.register(
            "plugin_launches",
            "Plugin processes launched for runs, by launcher",
            self.plugin_launches.clone(),
        );
        r.register(
            "store_seconds",
            "Store operations of admission and the journal",
            self.store_seconds.clone(),
        );
        r.register(
            "live_runs",
            "Runs live on this host",
            self.live_runs.clone(),
        );
        r.register(
            "queued_runs",
            "Run requests waiting for a slot",
            self.queued_runs.clone(),
        );
        r.register(
            "lease_epoch",
            "This host's lease epoch",
            self.lease_epoch.clone(),
        );
        r.register(
            "lease_held",
            "1 while this host's lease holds, 0 once lost",
            self.lease_held.clone(),
        );
    }

    pub(super) fn admitted(&self, took: Duration) {
        self.runs_admitted.inc();
        self.admission_seconds.observe(took.as_secs_f64());
    }

    pub(super) fn refused(&self) {
        self.runs_refused.inc();
    }

    pub(super) fn store_op(&self, operation: &'static str, took: Duration) {
        self.store_seconds
            .get_or_create(&Operation { operation })
            .observe(took.as_secs_f64());
    }

    /// One event of a run, as the journal stores it.
    pub(super) fn event(&self, event: &ExecutionEvent) {
        let d = &event.data;
        match EventKind::from_name(event.kind.as_str()) {
            Some(EventKind::ToolCompleted) => {
                let status = known(d["status"].as_str(), CALL_STATUSES);
                self.tool_calls.get_or_create(&Status { status }).inc();
            }
            Some(EventKind::EgressRequest) => self.egress_request(d),
            Some(EventKind::EgressConnection) => {
                self.bytes(d["bytesUp"].as_u64(), d["bytesDown"].as_u64());
            }
            _ => {}
        }
    }

    fn egress_request(&self, d: &Value) {
        let outcome = match (d["code"].as_str(), d["status"].as_u64()) {
            (Some(code), _) => bounded_token(code),
            (None, Some(status)) => format!("{}xx", status / 100),
            (None, None) => "none".into(),
        };
        let route = bounded_token(d["route"].as_str().unwrap_or(""));
        self.egress_requests
            .get_or_create(&Egress { route, outcome })
            .inc();
        self.bytes(d["requestBytes"].as_u64(), d["responseBytes"].as_u64());
        for (kind, key) in [
            ("input", "inputTokens"),
            ("output", "outputTokens"),
            ("estimated", "estimatedTokens"),
        ] {
            if let Some(n) = d[key].as_u64() {
                self.egress_tokens.get_or_create(&Tokens { kind }).inc_by(n);
            }
        }
    }

    fn bytes(&self, up: Option<u64>, down: Option<u64>) {
        for (direction, n) in [("up", up), ("down", down)] {
            if let Some(n) = n {
                self.egress_bytes
                    .get_or_create(&Direction { direction })
                    .inc_by(n);
            }
        }
    }

    /// A run ended: its status, how long it ran, and whether a plugin
    /// process was launched for it (not a parked one reused).
    pub(super) fn ended(&self, result: &Value, took: Duration) {
        self.run_seconds.observe(took.as_secs_f64());
        let status = known(result["status"].as_str(), RUN_STATUSES);
        self.runs_ended.get_or_create(&Status { status }).inc();
        let runtime = &result["metadata"]["runtime"];
        if runtime.is_null() || runtime["affinity"]["reused"] == Value::Bool(true) {
            return;
        }
        let sandbox = &runtime["sandbox"];
        let launcher = match sandbox["launcher"].as_str() {
            Some(name) => bounded_token(name),
            None if sandbox.is_null() => "unknown".to_owned(),
            None => "sandbox".to_owned(),
        };
        self.plugin_launches
            .get_or_create(&Launch { launcher })
            .inc();
    }

    /// The text exposition, with the gauges read now.
    pub fn render(&self, admission: AdmissionStatus, lease: &LeaseStatus) -> String {
        self.live_runs.set(clamp(admission.live as u64));
        self.queued_runs.set(clamp(admission.queued as u64));
        self.lease_epoch.set(lease.epoch.unwrap_or(0));
        self.lease_held
            .set(i64::from(lease.epoch.is_some() && lease.lost.is_none()));
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `s` when it is one of `known`, else `other`.
fn known(s: Option<&str>, known: &[&str]) -> String {
    match s {
        Some(s) if known.contains(&s) => s.to_owned(),
        _ => "other".to_owned(),
    }
}

/// A host-chosen token (a route name, an error code) as a label value:
/// letters, digits, `_`, `-` and `.` only, at most 64 characters.
fn bounded_token(s: &str) -> String {
    if !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
    {
        s.to_owned()
    } else {
        "other".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, data: Value) -> ExecutionEvent {
        use sharedos_protocol::{Identifier, ShortName, Timestamp, Version};
        ExecutionEvent {
            version: Version::V1,
            event_id: Identifier::new("e").unwrap(),
            execution_id: Identifier::new("r").unwrap(),
            trace_id: Identifier::new("r").unwrap(),
            sequence: 0,
            kind: ShortName::new(kind).unwrap(),
            data: data.into(),
            occurred_at: Timestamp::parse("2026-12-05T00:00:00Z").unwrap(),
        }
    }

    #[test]
    fn events_and_endings_are_counted_with_bounded_labels() {
        let m = Metrics::new();
        m.event(&event("tool.completed", json!({"status": "succeeded"})));
        m.event(&event(
            "tool.completed",
            json!({"status": "made-up by a plugin"}),
        ));
        m.event(&event(
            "egress.request",
            json!({"route": "openai", "status": 200, "requestBytes": 10, "responseBytes": 90,
                   "inputTokens": 3, "outputTokens": 4}),
        ));
        m.event(&event(
            "egress.request",
            json!({"route": "openai", "code": "budget_exceeded"}),
        ));
        m.ended(
            &json!({"status": "succeeded", "metadata": {"runtime": {"sandbox": {"level": "isolated"}}}}),
            Duration::from_millis(5),
        );
        m.ended(
            &json!({"status": "failed", "metadata": {"runtime": {"affinity": {"reused": true}}}}),
            Duration::from_millis(5),
        );
        let text = m.render(AdmissionStatus::default(), &LeaseStatus::default());
        for line in [
            "sharedos_tool_calls_total{status=\"succeeded\"} 1",
            "sharedos_tool_calls_total{status=\"other\"} 1",
            "sharedos_egress_requests_total{route=\"openai\",outcome=\"2xx\"} 1",
            "sharedos_egress_requests_total{route=\"openai\",outcome=\"budget_exceeded\"} 1",
            "sharedos_egress_bytes_total{direction=\"down\"} 90",
            "sharedos_egress_tokens_total{kind=\"output\"} 4",
            "sharedos_runs_ended_total{status=\"failed\"} 1",
            "sharedos_plugin_launches_total{launcher=\"sandbox\"} 1",
            "sharedos_lease_held 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("made-up"), "{text}");
        assert!(
            !text.contains("isolation=\"direct\""),
            "a reused process is no launch: {text}"
        );
    }
}
