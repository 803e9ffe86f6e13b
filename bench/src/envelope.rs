//! The envelope's own cost: a tool call through the whole envelope with the
//! plugin in process, against calling the kernel directly.

use std::time::{Duration, Instant};

use serde_json::Value;
use sharedos_kernel::TurnKernel;
use sharedos_protocol::{ExecutionResult, ExecutionStatus, ToolCall, ident};
use tokio_util::sync::CancellationToken;

use super::Figure;
use super::fixture::{self, NOOP_TOOL};
use sharedos_host::executor::ExecuteOptions;

/// The per-call nanoseconds the bench plugin's `timed_calls` returned.
pub fn call_samples(result: &ExecutionResult) -> Result<Vec<Duration>, String> {
    if result.status != ExecutionStatus::Succeeded {
        return Err(format!(
            "the bench turn ended {} {:?}",
            result.status.as_str(),
            result.code()
        ));
    }
    let arr = result
        .output
        .as_ref()
        .and_then(|o| o.get("callNs"))
        .and_then(Value::as_array)
        .ok_or("the bench plugin returned no samples")?;
    Ok(arr
        .iter()
        .filter_map(Value::as_u64)
        .map(Duration::from_nanos)
        .collect())
}

/// Emits per second from the bench plugin's `timed_emits` result.
pub fn emit_rate(result: &ExecutionResult) -> Result<f64, String> {
    let out = result.output.as_ref().ok_or("no output")?;
    let ns = out
        .get("emitNs")
        .and_then(Value::as_u64)
        .ok_or("no emitNs")?
        .max(1);
    let n = out.get("emits").and_then(Value::as_u64).ok_or("no emits")?;
    Ok(n as f64 / (ns as f64 / 1e9))
}

/// (b) A tool call through the whole envelope, plugin in process.
pub async fn inprocess_calls(n: usize) -> Result<Figure, String> {
    let executor = fixture::in_process_executor()?;
    let warm = executor
        .execute(
            fixture::request("warm", fixture::calls(50)),
            ExecuteOptions::default(),
        )
        .await;
    warm.map_err(|e| e.to_string())?;
    let result = executor
        .execute(
            fixture::request("bench-inprocess", fixture::calls(n)),
            ExecuteOptions::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(Figure::from_samples(
        "(b) tool call through the envelope, plugin in process",
        call_samples(&result)?,
    ))
}

/// The baseline of (b): the same call made on the kernel directly, with the
/// turn's authority already open.
pub async fn kernel_direct(n: usize) -> Result<Figure, String> {
    let kernel = fixture::kernel();
    let context = fixture::context();
    let turn = kernel
        .open_turn(&context)
        .await
        .map_err(|e| e.to_string())?;
    turn.list_tools(&context).await.map_err(|e| e.to_string())?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..(n + 50) {
        let call = ToolCall {
            id: ident(&format!("k{i}")),
            tool: ident(NOOP_TOOL),
            arguments: Default::default(),
            trace_id: context.trace_id.clone(),
            requested_at: context.now.clone(),
        };
        let t = Instant::now();
        turn.invoke_tool(&context, &call, CancellationToken::new())
            .await
            .map_err(|e| e.to_string())?;
        if i >= 50 {
            samples.push(t.elapsed());
        }
    }
    Ok(Figure::from_samples(
        "    baseline: the same call on the kernel directly",
        samples,
    ))
}

/// (e) Emits per second through the envelope, plugin in process.
pub async fn inprocess_emits(n: usize) -> Result<f64, String> {
    let executor = fixture::in_process_executor()?;
    let result = executor
        .execute(
            fixture::request("bench-emits", fixture::emits(n)),
            ExecuteOptions::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    emit_rate(&result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_bench_fixture_runs_its_turns() {
        let b = inprocess_calls(20).await.unwrap();
        assert_eq!(b.iterations, 20);
        let k = kernel_direct(20).await.unwrap();
        assert_eq!(k.iterations, 20);
        assert!(inprocess_emits(100).await.unwrap() > 0.0);
        eprintln!("{}\n{}", b.line(), k.line());
    }
}
