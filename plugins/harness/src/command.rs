//! `sharedos-harness`: the MCP harness runtime as a plugin binary.
//!
//! - `sharedos-harness --harness <json>`: the runtime plugin, started by
//!   the host with the spec (a `HarnessLaunch`, docs/HARNESS.md);
//! - `sharedos-harness mcp-relay <socket>`: the stdio MCP server the CLI
//!   spawns (`{mcpCommand} {mcpArgs}`): it relays its stdin and stdout to
//!   the harness over the turn's unix socket.

use std::process::ExitCode;

const USAGE: &str = "usage: sharedos-harness --harness '<HarnessLaunch JSON>'\n   \
     or: sharedos-harness mcp-relay <socket path>";

pub fn run() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["mcp-relay", socket] => crate::relay::run(socket),
        ["--harness", json] => match crate::HarnessPlugin::from_json(json) {
            Ok(plugin) => sharedos_plugin_sdk::serve(plugin),
            Err(e) => {
                eprintln!("sharedos-harness: {e}");
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!("sharedos-harness: unexpected arguments\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
