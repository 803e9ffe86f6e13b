//! Prints the kernel's benchmark figures as JSON:
//! `cargo run --release -p sharedos-bench --example kernel_bench [DIR]`.
//! DIR (default: a fresh directory under the system temp dir) holds the
//! audit files and the file tools' root; put it on the disk you care about.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = match std::env::args().nth(1) {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::temp_dir().join(format!("sharedos-kernel-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let figures = serde_json::json!({
        "dir": dir.display().to_string(),
        "authorizationDecision": sharedos_bench::kernel::authorization_decision(10_000).await,
        "auditedToolCall": sharedos_bench::kernel::audited_tool_call(&dir, 200).await,
        "fileToolCalls": sharedos_bench::kernel::file_tool_calls(&dir).await,
    });
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}
