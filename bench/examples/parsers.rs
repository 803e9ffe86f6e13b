//! The fast paths against their references and sonic-rs, as one Markdown
//! table (docs/BENCHMARKS.md, "Fast paths against their references"):
//! `cargo run --release -p sharedos-bench --example parsers [ITERATIONS]`.
//! sonic-rs is a dev-dependency of the bench crate only: it is here to
//! say what the best general JSON library does on the same job, and no
//! shipped code links it.

use serde::Deserialize;
use sharedos_bench::parsers::{self, Library};
use sharedos_kernel::AuditRecord;
use sharedos_protocol::{InvokeToolParams, ToolResult};

struct Sonic;

/// A call line as sonic-rs reads it in one pass, through the serde derive
/// of the params.
#[derive(Deserialize)]
struct CallLine {
    #[allow(dead_code)]
    jsonrpc: String,
    #[allow(dead_code)]
    id: u64,
    method: String,
    params: InvokeToolParams,
}

impl Library for Sonic {
    fn name(&self) -> &'static str {
        "sonic-rs"
    }
    fn read_call(&self, line: &str) -> Option<InvokeToolParams> {
        let call: CallLine = sonic_rs::from_str(line).ok()?;
        (call.method == "host/invokeTool").then_some(call.params)
    }
    fn read_tool_result(&self, text: &str) -> Option<ToolResult> {
        sonic_rs::from_str(text).ok()
    }
    fn write_tool_result(&self, result: &ToolResult) -> Vec<u8> {
        sonic_rs::to_vec(result).unwrap_or_default()
    }
    fn write_record(&self, record: &AuditRecord) -> Vec<u8> {
        sonic_rs::to_vec(record).unwrap_or_default()
    }
    fn write_str(&self, s: &str) -> Vec<u8> {
        sonic_rs::to_vec(s).unwrap_or_default()
    }
}

fn main() {
    let iterations = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(200_000);
    match parsers::rows(iterations, Some(&Sonic)) {
        Ok(rows) => print!("{}", parsers::table(&rows, Some(Sonic.name()))),
        Err(e) => {
            eprintln!("parsers: {e}");
            std::process::exit(1);
        }
    }
}
