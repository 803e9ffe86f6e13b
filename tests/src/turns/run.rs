//! One turn through the real executor: its spec, its run, and what the
//! host saw of it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_host::executor::{
    ExecuteOptions, Executor, ExecutorOptions, OnEvent, OnTurnError, TurnError,
};
use sharedos_host::process::{ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::seat::process_seat;
use sharedos_kernel::{AuditKind, AuditRecord, JsonlAuditSink, Kernel};
use sharedos_protocol::{ExecutionEvent, ExecutionResult};
use sharedos_testkit::FaultySink;
use tokio_util::sync::CancellationToken;

use super::procs::{is_alive, marked_pids, wait_gone};
use super::records::check_audit_invariants;
use super::{
    DECISION_KINDS, Launch, LedgerAppend, LedgerSlow, MARKER_ENV, TRACE, kernel_config,
    ledger_definition, ledger_slow_definition, request, testplugin_manifest, workspace_bin,
};

/// One turn's setup.
pub struct TurnSpec {
    pub launch: Launch,
    /// The testplugin's argv mode (`normal`, `silent`, ...).
    pub mode: &'static str,
    pub script: Value,
    pub tools: Vec<&'static str>,
    pub timeout_ms: u64,
    pub drain_grace_ms: u64,
    /// Cancel the turn (the host's own cancellation) this long after start.
    pub cancel_after: Option<Duration>,
    /// Cancel the turn when the plugin emits an event of this type.
    pub cancel_on_event: Option<&'static str>,
    /// Cancel the turn before `execute` is called.
    pub precancel: bool,
    /// Break the audit sink's decision path when the plugin emits an event
    /// of this type.
    pub audit_fault_on_event: Option<&'static str>,
    /// Changes the request before it is sent.
    pub patch_request: Option<fn(&mut Value)>,
    /// `on_event` takes this long over each `tool.requested` (a slow
    /// observer, e.g. one that writes to a slow terminal).
    pub slow_observer_ms: Option<u64>,
    /// Do not check the per-turn invariants (for tests of their breach).
    pub skip_invariants: bool,
    /// Extra environment for the plugin.
    pub env: Vec<(String, String)>,
    /// When the plugin emits an event of this type, each call's decision
    /// write starts taking the given time.
    pub slow_decisions_on_event: Option<(&'static str, u64)>,
    /// The executor's byte ledger; its default when `None`.
    pub max_turn_bytes: Option<usize>,
}

impl TurnSpec {
    pub fn new(launch: Launch, script: Value) -> Self {
        Self {
            launch,
            mode: "normal",
            script,
            tools: vec![
                "files.read",
                "files.write",
                "files.list",
                "ledger.append",
                "ledger.slow",
            ],
            timeout_ms: 20_000,
            drain_grace_ms: 0,
            cancel_after: None,
            cancel_on_event: None,
            precancel: false,
            audit_fault_on_event: None,
            patch_request: None,
            slow_observer_ms: None,
            skip_invariants: false,
            env: Vec::new(),
            slow_decisions_on_event: None,
            max_turn_bytes: None,
        }
    }
    pub fn tools(mut self, tools: &[&'static str]) -> Self {
        self.tools = tools.to_vec();
        self
    }
    pub fn timeout(mut self, ms: u64) -> Self {
        self.timeout_ms = ms;
        self
    }
    pub fn grace(mut self, ms: u64) -> Self {
        self.drain_grace_ms = ms;
        self
    }
    pub fn mode(mut self, mode: &'static str) -> Self {
        self.mode = mode;
        self
    }
}

/// What a turn left behind.
pub struct TurnRun {
    pub result: ExecutionResult,
    /// How long `execute` took.
    pub elapsed: Duration,
    /// Every `on_turn_error` report.
    pub turn_errors: Vec<TurnError>,
    /// The events as `on_event` saw them, in order (as of `run_turn`'s
    /// return, or of the last [`TurnRun::reload`]).
    pub streamed: Vec<ExecutionEvent>,
    streamed_log: Arc<Mutex<Vec<ExecutionEvent>>>,
    /// What `on_event` had seen when `execute` returned.
    pub streamed_at_return: Vec<ExecutionEvent>,
    /// Every process that carried the turn's marker while it ran (host
    /// pids, found in `/proc`).
    pub seen_pids: Vec<u32>,
    /// The pids the plugin reported itself (`pid` and `forked` events).
    pub reported_pids: Vec<u32>,
    pub marker: String,
    pub launch: Launch,
    pub audit: Vec<AuditRecord>,
    pub audit_path: PathBuf,
    pub files_root: PathBuf,
    _dir: tempfile::TempDir,
}

impl TurnRun {
    pub fn code(&self) -> Option<&str> {
        self.result.code()
    }
    pub fn retryable(&self) -> Option<bool> {
        self.result.retryable()
    }
    /// The last event: `(type, data)`.
    pub fn last_event(&self) -> (String, Value) {
        let e = self.result.events.last().expect("at least one event");
        (e.kind.as_str().to_owned(), e.data.clone().into_value())
    }
    pub fn event_types(&self) -> Vec<&str> {
        self.result.event_types()
    }
    /// The data of every `runtime.event` of the plugin's type `kind`.
    pub fn runtime_events(&self, kind: &str) -> Vec<Value> {
        self.result
            .events
            .iter()
            .filter(|e| e.kind.as_str() == "runtime.event" && e.data["type"] == kind)
            .map(|e| e.data["data"].clone())
            .collect()
    }
    /// `metadata.runtime`.
    pub fn runtime_provenance(&self) -> Value {
        self.result
            .metadata
            .get("runtime")
            .cloned()
            .unwrap_or(Value::Null)
    }
    /// Asserts `metadata.runtime` names the testplugin and carries the
    /// sandbox report the launcher implies.
    pub fn assert_provenance(&self, launch: Launch) {
        let rt = self.runtime_provenance();
        assert_eq!(rt["id"], "sharedos-testplugin", "provenance: {rt}");
        assert_eq!(rt["version"], "0.1.0", "provenance: {rt}");
        assert_eq!(rt["protocolVersion"], "1", "provenance: {rt}");
        match launch {
            Launch::Direct => {
                let mut report = rt["sandbox"].clone();
                let containment = report
                    .as_object_mut()
                    .and_then(|o| o.remove("containment"))
                    .unwrap_or(Value::Null);
                crate::assert_direct_containment(&containment);
                assert_eq!(
                    report,
                    json!({"engine": "direct", "launcher": "direct", "level": "none", "reason": "launched without a sandbox",
                           "use": "development only"}),
                    "provenance: {rt}"
                );
            }
            Launch::Sandbox | Launch::SandboxBelowMinimum => {
                let report = &rt["sandbox"];
                assert_eq!(
                    report["level"],
                    crate::full_level(),
                    "sandbox report: {report}"
                );
                assert!(
                    crate::full_missing(report).is_empty(),
                    "sandbox report: {report}"
                );
                for layer in ["lifeline", "pidns", "mountns", "netns", "userns", "root"] {
                    assert_eq!(
                        report[layer]["state"], "applied",
                        "{layer} in the sandbox report: {report}"
                    );
                }
                assert_eq!(report["self_check"]["cap_eff"], 0, "{report}");
                assert_eq!(report["self_check"]["no_new_privs"], true, "{report}");
                let env = report["env_keys"].as_array().cloned().unwrap_or_default();
                assert!(
                    env.contains(&json!(MARKER_ENV)) && env.contains(&json!("SHAREDOS_PLUGIN")),
                    "env keys in the sandbox report: {env:?}"
                );
            }
        }
    }
    /// Re-reads the audit trail until `pred` holds for some record or
    /// `bound` passed (outcome-path records of an interrupted handler may
    /// land after the result); returns whether it held.
    pub fn wait_audit(&mut self, bound: Duration, pred: impl Fn(&AuditRecord) -> bool) -> bool {
        let until = Instant::now() + bound;
        loop {
            self.audit = sharedos_kernel::audit::read_jsonl(&self.audit_path)
                .expect("the audit trail parses");
            if self.audit.iter().any(&pred) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    /// Re-reads what `on_event` saw and the audit trail.
    pub fn reload(&mut self) {
        self.streamed = self.streamed_log.lock().unwrap().clone();
        self.audit =
            sharedos_kernel::audit::read_jsonl(&self.audit_path).expect("the audit trail parses");
    }
    /// The audit record `turn.ended`.
    pub fn turn_ended(&self) -> &AuditRecord {
        self.audit
            .iter()
            .rev()
            .find(|r| r.kind == "turn.ended")
            .expect("a turn.ended audit record")
    }
    /// Asserts no process of the turn is alive, polling under a generous
    /// bound (the reaping runs off-thread after the result).
    pub fn assert_no_survivor(&self) {
        let mut pids: Vec<u32> = self.seen_pids.clone();
        pids.extend(&self.reported_pids);
        let survivors = wait_gone(&self.marker, Duration::from_secs(10));
        assert!(
            survivors.is_empty(),
            "processes of the turn survived: {survivors:?} (seen {pids:?})"
        );
        if self.launch == Launch::Direct {
            // The plugin's own pids are host pids: each is gone too.
            let until = Instant::now() + Duration::from_secs(10);
            let mut alive: Vec<u32> = self.reported_pids.clone();
            while !alive.is_empty() && Instant::now() < until {
                alive.retain(|p| is_alive(*p));
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(alive.is_empty(), "reported pids still alive: {alive:?}");
        }
    }
}

/// Runs one turn of the testplugin through the real executor and kernel.
pub async fn run_turn(spec: TurnSpec) -> TurnRun {
    let dir = tempfile::tempdir().expect("tempdir");
    let files_root = dir.path().join("files");
    std::fs::create_dir_all(&files_root).expect("files root");
    let audit_path = dir.path().join("audit.jsonl");
    let audit = Arc::new(FaultySink::new(
        JsonlAuditSink::open(&audit_path).expect("audit sink"),
    ));
    let kernel = Kernel::builder_from_config(&kernel_config(), &files_root, audit.clone())
        .expect("kernel builder")
        .tool(ledger_definition(), Arc::new(LedgerAppend))
        .expect("ledger tool")
        .tool(ledger_slow_definition(), Arc::new(LedgerSlow))
        .expect("ledger.slow tool")
        .build();

    let marker = format!("m{}", std::process::id()) + &unique_suffix();
    let mut pc =
        ProcessRuntimeConfig::new(workspace_bin("sharedos-testplugin"), testplugin_manifest());
    pc.args = vec![spec.mode.to_owned()];
    pc.env = vec![(MARKER_ENV.to_owned(), marker.clone())];
    pc.env.extend(spec.env.iter().cloned());
    let runtime = Arc::new(ProcessRuntime::new(pc, spec.launch.launcher()).expect("runtime"));

    let errors: Arc<Mutex<Vec<TurnError>>> = Arc::default();
    let errs = errors.clone();
    let on_turn_error: OnTurnError = Arc::new(move |e, _| errs.lock().unwrap().push(e.clone()));
    let defaults = ExecutorOptions::default();
    let options = ExecutorOptions {
        drain_grace_ms: spec.drain_grace_ms,
        on_turn_error: Some(on_turn_error),
        max_turn_bytes: spec.max_turn_bytes.unwrap_or(defaults.max_turn_bytes),
        ..defaults
    };
    let executor =
        Executor::new(Arc::new(kernel), process_seat(runtime), options).expect("executor");

    let cancel = CancellationToken::new();
    let streamed: Arc<Mutex<Vec<ExecutionEvent>>> = Arc::default();
    let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
    let slow_decisions = spec.slow_decisions_on_event;
    let (s2, seen2, marker2, cancel2, cancel_on, fault_on, slow) = (
        streamed.clone(),
        seen.clone(),
        marker.clone(),
        cancel.clone(),
        spec.cancel_on_event,
        spec.audit_fault_on_event,
        spec.slow_observer_ms,
    );
    let on_event: OnEvent = Arc::new(move |e: &ExecutionEvent| {
        s2.lock().unwrap().push(e.clone());
        if let Some(ms) = slow
            && e.kind.as_str() == "tool.requested"
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
        if e.kind.as_str() == "runtime.event" {
            // The plugin said something about its processes: look at /proc
            // while they still run.
            // Two scans a moment apart: one listing of /proc on a loaded
            // machine has been seen to miss a process.
            let mut s = seen2.lock().unwrap();
            for round in 0..2 {
                if round > 0 {
                    std::thread::sleep(Duration::from_millis(10));
                }
                for p in marked_pids(&marker2) {
                    if !s.contains(&p) {
                        s.push(p);
                    }
                }
            }
            if cancel_on.is_some_and(|k| e.data["type"] == k) {
                cancel2.cancel();
            }
            if fault_on.is_some_and(|k| e.data["type"] == k) {
                for kind in DECISION_KINDS {
                    audit.fail_on(kind);
                }
            }
            if let Some((k, ms)) = slow_decisions
                && e.data["type"] == k
            {
                // Each call's check becomes durable this much later (a
                // slow disk).
                audit.slow_calls_on(AuditKind::AuthorizationChecked, Duration::from_millis(ms));
            }
        }
    });
    if let Some(after) = spec.cancel_after {
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            c.cancel();
        });
    }
    if spec.precancel {
        cancel.cancel();
    }
    let mut req = request("exec-1", spec.script, &spec.tools, spec.timeout_ms);
    if let Some(patch) = spec.patch_request {
        patch(&mut req);
    }
    let started = Instant::now();
    let result = executor
        .execute_json(
            &req.to_string(),
            ExecuteOptions {
                cancel: Some(cancel),
                on_event: Some(on_event),
            },
        )
        .await
        .expect("a result");
    let elapsed = started.elapsed();
    let streamed_at_return = streamed.lock().unwrap().clone();
    let reported_pids = result
        .events
        .iter()
        .filter(|e| {
            e.kind.as_str() == "runtime.event"
                && (e.data["type"] == "pid" || e.data["type"] == "forked")
        })
        .flat_map(|e| pids_of(&e.data["data"]))
        .collect();
    let audit = sharedos_kernel::audit::read_jsonl(&audit_path).expect("the audit trail parses");
    if !spec.skip_invariants {
        // Invariants of every ending: the events are numbered 0, 1, 2, ...
        // and belong to this turn, and `on_event` saw exactly them, in
        // order (waiting, bounded, for a delivery still running on another
        // thread: see `streamed_at_return`).
        for (i, e) in result.events.iter().enumerate() {
            assert_eq!(
                e.sequence, i as u64,
                "event {i} has sequence {}",
                e.sequence
            );
            assert_eq!(e.execution_id.as_str(), "exec-1");
            assert_eq!(e.trace_id.as_str(), TRACE);
        }
        check_audit_invariants(&audit);
        let until = Instant::now() + Duration::from_secs(5);
        while streamed.lock().unwrap().len() < result.events.len() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let observed = streamed.lock().unwrap().clone();
        assert_eq!(
            observed.len(),
            result.events.len(),
            "on_event saw {} events {:?}, the result has {} {:?}",
            observed.len(),
            observed
                .iter()
                .map(|e| (e.kind.as_str(), e.data.to_string()))
                .collect::<Vec<_>>(),
            result.events.len(),
            result.event_types()
        );
        assert!(
            observed == result.events,
            "on_event saw other events than the result's"
        );
    }
    let observed = streamed.lock().unwrap().clone();
    let seen_pids = seen.lock().unwrap().clone();
    let turn_errors = errors.lock().unwrap().clone();
    TurnRun {
        result,
        elapsed,
        turn_errors,
        streamed: observed,
        streamed_log: streamed,
        streamed_at_return,
        seen_pids,
        reported_pids,
        marker,
        launch: spec.launch,
        audit,
        audit_path,
        files_root,
        _dir: dir,
    }
}

fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("-{}-{nanos}", N.fetch_add(1, Ordering::Relaxed))
}

fn pids_of(v: &Value) -> Vec<u32> {
    let mut out = Vec::new();
    if let Some(p) = v.get("pid").and_then(Value::as_u64) {
        out.push(p as u32);
    }
    if let Some(ps) = v.get("pids").and_then(Value::as_array) {
        out.extend(ps.iter().filter_map(Value::as_u64).map(|p| p as u32));
    }
    out
}
