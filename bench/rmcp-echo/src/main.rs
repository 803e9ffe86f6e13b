//! An MCP stdio server with one tool, `echo`, built on rmcp (the official
//! Rust MCP SDK): the peer `sharedos-bench` measures its own tool calls
//! against. `rmcp-echo [current|multi] [pipes|stdio]` picks tokio's
//! runtime (one thread, or the multi-threaded default) and rmcp's stdio
//! transport (`stdio_pipes`, epoll-driven, or `stdio`, the blocking pool),
//! so the bench can take rmcp's best.

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

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let multi = args.iter().any(|a| a == "multi");
    let pipes = !args.iter().any(|a| a == "stdio");
    let runtime = if multi {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
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
