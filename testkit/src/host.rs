//! The `RuntimeHost` double.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_plugin_sdk::{HostCallError, RuntimeHost, Signal, SignalSource, check_annotation};
use sharedos_protocol::{RuntimeEvent, RuntimeLimits, Timestamp, ToolCall, ToolResult};

/// What the recording host saw, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Tool {
        tool: String,
        step: Option<u64>,
        arguments: Value,
    },
    Emit {
        kind: String,
        data: Value,
    },
    Annotate {
        key: String,
        value: Value,
    },
}

/// A `RuntimeHost` test double: records every call, answers tools with
/// `succeeded {echo: arguments}`, `denied tool_unavailable` for the tool
/// `forbidden`, sleeps first for the tool `slow`, and answers the tool
/// `big` with half a megabyte.
pub struct RecordingHost {
    pub records: Mutex<Vec<Record>>,
    pub drain: SignalSource,
    pub limits: RuntimeLimits,
}

impl Default for RecordingHost {
    fn default() -> Self {
        Self {
            records: Mutex::new(Vec::new()),
            drain: SignalSource::new(),
            limits: RuntimeLimits {
                max_steps: 16,
                max_tool_calls: 64,
                timeout_ms: 30_000,
                drain_grace_ms: None,
                drain_at_ms: None,
            },
        }
    }
}

impl RecordingHost {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    pub fn records(&self) -> Vec<Record> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    fn push(&self, r: Record) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(r);
    }
    /// The pids the testplugin reported through `pid` and `forked` events.
    pub fn reported_pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for r in self.records() {
            if let Record::Emit { kind, data } = r {
                match kind.as_str() {
                    "pid" => pids.extend(data["pid"].as_u64().map(|p| p as u32)),
                    "forked" => pids.extend(
                        data["pids"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_u64)
                            .map(|p| p as u32),
                    ),
                    _ => {}
                }
            }
        }
        pids
    }
}

#[async_trait::async_trait]
impl RuntimeHost for RecordingHost {
    fn limits(&self) -> RuntimeLimits {
        self.limits
    }
    async fn invoke_tool(
        &self,
        call: ToolCall,
        step: Option<u64>,
    ) -> Result<ToolResult, HostCallError> {
        self.push(Record::Tool {
            tool: call.tool.as_str().to_owned(),
            step,
            arguments: Value::Object(call.arguments.clone()),
        });
        match call.tool.as_str() {
            "forbidden" => Ok(ToolResult::denied(
                &call,
                "tool_unavailable",
                "not offered",
                Timestamp::now(),
            )),
            "big" => {
                let output = json!({"blob": "b".repeat(512 * 1024)});
                Ok(ToolResult::succeeded(&call, output, Timestamp::now()))
            }
            "slow" => {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(ToolResult::succeeded(&call, Value::Null, Timestamp::now()))
            }
            _ => Ok(ToolResult::succeeded(
                &call,
                json!({"echo": call.arguments}),
                Timestamp::now(),
            )),
        }
    }
    fn emit(&self, event: RuntimeEvent) -> Result<(), HostCallError> {
        self.push(Record::Emit {
            kind: event.kind.as_str().to_owned(),
            data: event.data,
        });
        Ok(())
    }
    fn annotate(&self, key: &str, value: Value) -> Result<(), HostCallError> {
        check_annotation(key)?;
        self.push(Record::Annotate {
            key: key.to_owned(),
            value,
        });
        Ok(())
    }
    fn draining(&self) -> Signal {
        self.drain.signal()
    }
}
