//! The MCP harness runtime (envelope.md E, docs/HARNESS.md): for one turn
//! it writes the CLI's configuration, composes the prompt and annotates
//! its `promptHash`, serves the turn's effective catalogue over MCP (each
//! call through the escalation latch to `host/invokeTool`), runs the CLI
//! as its child inside the same sandbox, and settles the turn from how the
//! CLI ended. The real model key never reaches it: the CLI gets the
//! gateway's route URL and a placeholder key.

#![forbid(unsafe_code)]

pub mod bridge;
pub mod cli;
pub mod command;
pub mod http;
pub mod latch;
pub mod mcp;
pub mod relay;
pub mod settle;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, RuntimePlugin, Signal};
use sharedos_protocol::harness::{
    FinalMessage, HarnessLaunch, MCP_HTTP_PORT, McpTransport, SERVER_NAME, STDOUT_TAIL_BYTES,
    Template, Var, VarValue,
};
use sharedos_protocol::{RuntimeManifest, RuntimeTurnOutcome, RuntimeTurnRequest, canonical_json};

/// The harness plugin of one runtime entry.
pub struct HarnessPlugin {
    launch: HarnessLaunch,
}

impl HarnessPlugin {
    /// From the host's `--harness <json>`; the spec is checked again here.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let launch: HarnessLaunch = serde_json::from_str(text)
            .map_err(|e| format!("--harness is not a HarnessLaunch: {e}"))?;
        let routes: Vec<&str> = launch.spec.route.iter().map(String::as_str).collect();
        let problems = launch.spec.check("harness", &routes);
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        if launch.spec.route.is_some() && launch.route_url.is_none() {
            return Err("harness: a route is named but the host gave no routeUrl".into());
        }
        Ok(Self { launch })
    }
}

/// The prompt handed to the CLI: the message payload when it is a string,
/// its canonical JSON otherwise.
pub fn compose_prompt(request: &RuntimeTurnRequest) -> String {
    match &request.message.payload {
        Value::String(s) => s.clone(),
        other => canonical_json(other),
    }
}

/// SHA-256 of the canonical JSON of `{instructions: null, prompt}`,
/// lowercase hex (A.10).
pub fn prompt_hash(prompt: &str) -> String {
    let text = canonical_json(&json!({"instructions": null, "prompt": prompt}));
    mcp::hex(&Sha256::digest(text.as_bytes()))
}

/// The per-turn places and values the templates see.
struct TurnVars {
    prompt: String,
    home: PathBuf,
    tmp: PathBuf,
    route_url: String,
    placeholder_key: String,
    mcp_url: String,
    mcp_token: String,
    mcp_command: String,
    mcp_args: Vec<String>,
}

impl TurnVars {
    fn value(&self, var: Var) -> VarValue {
        let one = |s: &str| VarValue::One(s.to_owned());
        match var {
            Var::Prompt => one(&self.prompt),
            Var::Home => one(&self.home.display().to_string()),
            Var::Tmp => one(&self.tmp.display().to_string()),
            Var::RouteUrl => one(&self.route_url),
            Var::PlaceholderKey => one(&self.placeholder_key),
            Var::McpUrl => one(&self.mcp_url),
            Var::McpToken => one(&self.mcp_token),
            Var::McpCommand => one(&self.mcp_command),
            Var::McpArgs => VarValue::List(self.mcp_args.clone()),
            Var::McpCommandLine => VarValue::List(
                std::iter::once(self.mcp_command.clone())
                    .chain(self.mcp_args.iter().cloned())
                    .collect(),
            ),
            Var::ServerName => one(SERVER_NAME),
        }
    }

    fn render(&self, text: &str) -> Result<String, RuntimeError> {
        let t = Template::parse(text).map_err(RuntimeError::Failed)?;
        Ok(t.render(&|v| self.value(v)))
    }

    /// The CLI's arguments: an element that is a list variable alone
    /// (`{mcpArgs}`, `{...mcpCommandLine}`) is spliced, one argument per
    /// element.
    fn args(&self, args: &[String]) -> Result<Vec<String>, RuntimeError> {
        let mut out = Vec::new();
        for a in args {
            let t = Template::parse(a).map_err(RuntimeError::Failed)?;
            match t.whole_list().map(|v| self.value(v)) {
                Some(VarValue::List(list)) => out.extend(list),
                _ => out.push(t.render(&|v| self.value(v))),
            }
        }
        Ok(out)
    }
}

/// The MCP server's transport for the turn.
enum Transport {
    Stdio(bridge::Bridge),
    Http(http::HttpServer),
}

impl Transport {
    /// Stops accepting and drops every session.
    fn close(self) {
        match self {
            Transport::Stdio(b) => b.close(),
            Transport::Http(h) => h.close(),
        }
    }
}

/// The turn's tmp directory: private to the turn, removed at its end.
struct TurnDir(PathBuf);

impl Drop for TurnDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl HarnessPlugin {
    /// The turn's directories and template values.
    fn turn_vars(&self, prompt: String, turn_dir: &TurnDir) -> Result<TurnVars, RuntimeError> {
        let _ = std::fs::remove_dir_all(&turn_dir.0);
        create_private_dir(&turn_dir.0)?;
        let home = match std::env::var_os("HOME").map(PathBuf::from) {
            Some(h) if h.is_dir() && h.is_absolute() => h,
            _ => {
                let h = turn_dir.0.join("home");
                create_private_dir(&h)?;
                h
            }
        };
        let relay = std::env::current_exe()
            .map_err(|e| RuntimeError::Failed(format!("cannot find the relay program: {e}")))?;
        Ok(TurnVars {
            prompt,
            home,
            tmp: turn_dir.0.clone(),
            route_url: self.launch.route_url.clone().unwrap_or_default(),
            placeholder_key: self.launch.placeholder_key.clone(),
            mcp_url: format!("http://127.0.0.1:{MCP_HTTP_PORT}{}", http::MCP_PATH),
            mcp_token: http::new_token()
                .map_err(|e| RuntimeError::Failed(format!("cannot make the MCP token: {e}")))?,
            mcp_command: relay.display().to_string(),
            mcp_args: vec![
                "mcp-relay".into(),
                turn_dir.0.join("mcp.sock").display().to_string(),
            ],
        })
    }

    /// Starts serving `server` over the spec's transport.
    async fn serve(
        &self,
        vars: &TurnVars,
        server: &Arc<mcp::TurnServer>,
    ) -> Result<Transport, RuntimeError> {
        match self.launch.spec.mcp {
            McpTransport::Stdio => bridge::Bridge::bind(&vars.tmp.join("mcp.sock"), server.clone())
                .map(Transport::Stdio)
                .map_err(|e| RuntimeError::Failed(format!("cannot bind the MCP bridge: {e}"))),
            McpTransport::Http => {
                http::HttpServer::bind(MCP_HTTP_PORT, vars.mcp_token.clone(), server.clone())
                    .await
                    .map(Transport::Http)
                    .map_err(|e| {
                        RuntimeError::Failed(format!(
                            "cannot bind the MCP listener on 127.0.0.1:{MCP_HTTP_PORT} (a harness runtime with mcp = \"http\" runs in the harness sandbox mode): {e}"
                        ))
                    })
            }
        }
    }
}

#[async_trait]
impl RuntimePlugin for HarnessPlugin {
    fn manifest(&self) -> RuntimeManifest {
        self.launch.manifest.clone()
    }

    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        let spec = &self.launch.spec;
        let prompt = compose_prompt(&request);
        // Before the server exists, so before it can take a call.
        host.annotate("promptHash", json!(prompt_hash(&prompt)))
            .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        // Before the CLI exists: a catalogue it could not be given whole
        // ends the turn here.
        let server = match mcp::TurnServer::new(
            host.clone(),
            &request.tools,
            spec.escalation,
            request.context.trace_id.clone(),
            request.execution_id.as_str(),
        ) {
            Ok(server) => Arc::new(server),
            Err(collision) => return Ok(settle::names_collide(&collision)),
        };
        let base = std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        let turn_dir = TurnDir(base.join(format!("sharedos-harness-{}", std::process::id())));
        let vars = self.turn_vars(prompt, &turn_dir)?;
        for f in &spec.files {
            write_file(
                &PathBuf::from(vars.render(&f.path)?),
                &vars.render(&f.content)?,
            )?;
        }
        let transport = self.serve(&vars, &server).await?;
        let launch = cli::Launch {
            command: PathBuf::from(&spec.command),
            sha256: spec.sha256.clone(),
            args: vars.args(&spec.args)?,
            env: cli_env(&vars, &spec.env)?,
            stdin: match &spec.stdin {
                Some(t) => Some(vars.render(t)?.into_bytes()),
                None => None,
            },
            cwd: vars.home.clone(),
            term_grace: Duration::from_millis(spec.term_grace_ms),
        };
        if let Some(what) = launch.nul_byte() {
            server.close();
            transport.close();
            return Ok(settle::nul_in_command_line(&what));
        }
        cli::become_subreaper();
        let run = cli::run(launch, abort, host.draining(), STDOUT_TAIL_BYTES).await;
        // The turn is over for the CLI: refuse late calls, drop the bridge.
        server.close();
        transport.close();
        report_stderr(&run.stderr);
        let final_path = match &spec.final_message {
            FinalMessage::File { path } => Some(PathBuf::from(vars.render(path)?)),
            _ => None,
        };
        let message = settle::final_message(&spec.final_message, &run, final_path.as_deref());
        let facts = settle::Facts {
            catalog_hash: server.catalog_hash().to_owned(),
            escalation: server.latch().asked(),
            calls_after_escalation: server.latch().calls_after(),
        };
        Ok(settle::outcome(&run, message, facts))
    }
}

/// The CLI's environment: the spec's, plus `HOME`, `TMPDIR`, `PATH` and
/// the locale; nothing else of the plugin's.
fn cli_env(
    vars: &TurnVars,
    spec_env: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, RuntimeError> {
    let mut env = BTreeMap::new();
    for (k, v) in spec_env {
        env.insert(k.clone(), vars.render(v)?);
    }
    env.insert("HOME".into(), vars.home.display().to_string());
    env.insert("TMPDIR".into(), vars.tmp.display().to_string());
    env.insert(
        "PATH".into(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
    );
    for k in ["LANG", "LC_ALL", "TZ"] {
        if let (Ok(v), false) = (std::env::var(k), env.contains_key(k)) {
            env.insert(k.into(), v);
        }
    }
    Ok(env)
}

fn create_private_dir(p: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
        .map_err(|e| RuntimeError::Failed(format!("cannot create {}: {e}", p.display())))
}

fn write_file(path: &Path, content: &str) -> Result<(), RuntimeError> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| RuntimeError::Failed(format!("cannot write {}: {e}", path.display())))?;
    std::io::Write::write_all(&mut f, content.as_bytes())
        .map_err(|e| RuntimeError::Failed(format!("cannot write {}: {e}", path.display())))
}

/// The last few KiB of the CLI's stderr, to the plugin's stderr (the
/// host's log, with its own budget).
fn report_stderr(stderr: &[u8]) {
    if stderr.is_empty() {
        return;
    }
    let tail = &stderr[stderr.len().saturating_sub(4096)..];
    eprintln!(
        "sharedos-harness: the CLI's stderr (tail):\n{}",
        String::from_utf8_lossy(tail)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> TurnVars {
        TurnVars {
            prompt: "-p \"hi\"".into(),
            home: "/sandbox/home".into(),
            tmp: "/tmp/t".into(),
            route_url: String::new(),
            placeholder_key: String::new(),
            mcp_url: String::new(),
            mcp_token: String::new(),
            mcp_command: "/plugin/sharedos-harness".into(),
            mcp_args: vec!["mcp-relay".into(), "/tmp/t/mcp.sock".into()],
        }
    }

    /// A list variable alone in an argument becomes one argument per
    /// element, in each of its spellings; anywhere else it is rendered as
    /// text, and other arguments are rendered once.
    #[test]
    fn list_variables_alone_in_an_argument_are_spliced() {
        let v = vars();
        let args: Vec<String> = [
            "{mcpCommandLine}",
            "{...mcpArgs}",
            "{mcpArgs}",
            "--mcp=[{...mcpCommandLine}]",
            "{prompt}",
        ]
        .map(String::from)
        .to_vec();
        let out = v.args(&args).unwrap();
        assert_eq!(
            out,
            [
                "/plugin/sharedos-harness",
                "mcp-relay",
                "/tmp/t/mcp.sock",
                "mcp-relay",
                "/tmp/t/mcp.sock",
                "mcp-relay",
                "/tmp/t/mcp.sock",
                "--mcp=[\"/plugin/sharedos-harness\", \"mcp-relay\", \"/tmp/t/mcp.sock\"]",
                "-p \"hi\"",
            ]
        );
    }
}
