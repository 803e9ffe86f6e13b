//! An MCP stdio server with one tool, `echo`, built on rmcp (the official
//! Rust MCP SDK): the peer `sharedos-bench` measures its own tool calls
//! against. `rmcp-echo [current|multi] [pipes|stdio]` picks tokio's
//! runtime (one thread, or the multi-threaded default) and rmcp's stdio
//! transport (`stdio_pipes`, epoll-driven, or `stdio`, the blocking pool),
//! so the bench can take rmcp's best.
//!
//! `rmcp-echo client <sequential> <calls> <inflight> <server> [args...]`
//! is rmcp's own client (one thread) driving that server, started as a
//! child (`<server> [args...]`, e.g. `taskset -c 1 rmcp-echo current
//! pipes`): after 10% warm-up calls, `<sequential>` calls one after the
//! other, then `<calls>` calls with `<inflight>` outstanding (as many
//! tasks, each calling in turn). It prints one JSON line:
//! `{"sequentialMedianUs": .., "sequentialMinUs": .., "rate": ..}`.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};

/// The `sharedos` binary's allocator (cli/src/main.rs): the peer runs on
/// the same one.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// What to send back.
    #[serde(default)]
    text: String,
}

#[derive(Debug, Clone)]
struct Echo {
    #[allow(dead_code)] // read by the code `tool_handler` generates
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Echo {
    #[tool(description = "Send the text back")]
    fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        text
    }
}

#[tool_handler]
impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

async fn serve(pipes: bool) -> Result<(), Box<dyn std::error::Error>> {
    let echo = Echo {
        tool_router: Echo::tool_router(),
    };
    let service = if pipes {
        echo.serve(rmcp::transport::stdio_pipes()).await?
    } else {
        echo.serve(rmcp::transport::stdio()).await?
    };
    service.waiting().await?;
    Ok(())
}

/// One `echo` call through rmcp's client.
async fn call(
    peer: &rmcp::Peer<rmcp::RoleClient>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut arguments = serde_json::Map::new();
    arguments.insert("text".into(), serde_json::Value::from("c"));
    let params = rmcp::model::CallToolRequestParams::new("echo").with_arguments(arguments);
    let result = peer.call_tool(params).await?;
    if result.is_error == Some(true) {
        return Err("the echo tool failed".into());
    }
    Ok(())
}

/// `rmcp-echo client ...` (see the module's documentation).
async fn client(args: &[String]) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let number = |i: usize| -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
        Ok(args
            .get(i)
            .ok_or("usage: rmcp-echo client <sequential> <calls> <inflight> <server> [args...]")?
            .parse()?)
    };
    let (sequential, calls, inflight) = (number(0)?, number(1)?, number(2)?.max(1));
    let server = args.get(3).ok_or("no server command")?;
    let mut command = tokio::process::Command::new(server);
    command.args(&args[4..]);
    let service = ().serve(rmcp::transport::TokioChildProcess::new(command)?).await?;
    let peer = service.peer().clone();
    for _ in 0..sequential / 10 + 10 {
        call(&peer).await?;
    }
    let mut samples = Vec::with_capacity(sequential);
    for _ in 0..sequential {
        let t = std::time::Instant::now();
        call(&peer).await?;
        samples.push(t.elapsed());
    }
    samples.sort();
    let per_task = calls.div_ceil(inflight);
    let start = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..inflight {
        let peer = peer.clone();
        tasks.spawn(async move {
            for _ in 0..per_task {
                call(&peer).await?;
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let rate = (per_task * inflight) as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let _ = service.cancel().await;
    let us = |d: Option<&std::time::Duration>| d.map(|d| d.as_secs_f64() * 1e6).unwrap_or(0.0);
    Ok(format!(
        r#"{{"sequentialMedianUs":{:.2},"sequentialMinUs":{:.2},"rate":{:.0}}}"#,
        us(samples.get(samples.len() / 2)),
        us(samples.first()),
        rate
    ))
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("client") {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("rmcp-echo client: cannot start tokio: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        return match runtime.block_on(client(&args[1..])) {
            Ok(line) => {
                println!("{line}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("rmcp-echo client: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let multi = args.iter().any(|a| a == "multi");
    let pipes = !args.iter().any(|a| a == "stdio");
    let runtime = if multi {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rmcp-echo: cannot start tokio: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(pipes)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmcp-echo: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
