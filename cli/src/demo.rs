//! `sharedos demo`: one real turn on the embedded defaults.

use std::sync::Arc;

use crate::{print_result, run_turn};
use sharedos_host::config::HostConfig;
use sharedos_host::seat::LauncherFor;

/// The embedded demo configuration.
pub const DEMO_CONFIG: &str = include_str!("../../host/demo/host.toml");
/// The embedded demo request.
pub const DEMO_REQUEST: &str = include_str!("../../host/demo/turn.json");

/// `sharedos demo --model`: the standard runtime on the Chat Completions
/// driver, reaching its model only through the host's egress gateway.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ModelArgs {
    /// Drive the turn with a model instead of the transcript.
    #[arg(long)]
    pub model: bool,
    /// With --model: a scripted OpenAI-compatible model started in this
    /// process on loopback (needs nothing: no network, no key).
    #[arg(long, requires = "model")]
    pub mock: bool,
    /// With --model: any OpenAI-compatible base URL (https; http only to
    /// a local server, with --allow).
    #[arg(long, requires = "model", conflicts_with = "mock", value_name = "URL")]
    pub base_url: Option<String>,
    /// The host environment variable holding the key; only the gateway
    /// reads it, the plugin gets a placeholder.
    #[arg(long, default_value = "OPENAI_API_KEY", value_name = "VAR")]
    pub key_env: String,
    /// The model name sent to the endpoint.
    #[arg(long, default_value = "gpt-4o-mini")]
    pub model_name: String,
    /// Address classes the base URL may be in besides public ones
    /// (`loopback`, `private`, `link-local`), e.g. a local Ollama.
    #[arg(long, value_name = "CLASS")]
    pub allow: Vec<String>,
}

/// The standard runtime of the embedded demo configuration on a model
/// driver instead of its transcript, behind one route: what
/// `sharedos demo --model` runs, and what the end-to-end egress tests run.
#[derive(Debug, Clone)]
pub struct ModelSetup<'a> {
    /// The driver kind (`openai-chat`, `openai-responses`,
    /// `anthropic-messages`, `gemini-generate-content`); it decides the
    /// route's `api`.
    pub kind: &'a str,
    pub upstream: &'a str,
    /// The route's `secret` reference (`env:VAR` or `file:PATH`).
    pub secret: &'a str,
    /// The route's address classes besides public ones.
    pub allow: &'a [String],
    pub model: &'a str,
    /// More keys of the driver table, as TOML (`maxTokens = 512`).
    pub driver_extra: &'a str,
    /// More lines of `[runtimes.network]`, as TOML (a budget, `caFile`).
    pub network_extra: &'a str,
    /// Grant alice requests on the route.
    pub grant: bool,
}

impl ModelSetup<'_> {
    /// The route's name (and its API shape): `anthropic` for Anthropic
    /// Messages, `gemini` for Gemini, `openai` otherwise.
    pub fn route(&self) -> &'static str {
        match self.kind {
            "anthropic-messages" => "anthropic",
            "gemini-generate-content" => "gemini",
            _ => "openai",
        }
    }
}

/// The embedded demo configuration with `setup`'s driver instead of the
/// transcript, its route, and (when asked) the grant of it to alice.
pub fn model_config(setup: &ModelSetup) -> Result<String, String> {
    let start = DEMO_CONFIG
        .find("transcript = [")
        .ok_or("the demo configuration has no transcript")?;
    let end = DEMO_CONFIG[start..]
        .find("\n]\n")
        .ok_or("the demo transcript does not end")?
        + start
        + 3;
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let allow: Vec<String> = setup.allow.iter().map(|a| quote(a)).collect();
    let route = setup.route();
    let driver_extra = match setup.driver_extra.trim() {
        "" => String::new(),
        extra => format!(", {extra}"),
    };
    let runtime = format!(
        "driver = {{ kind = {kind}, baseUrl = \"{gateway}/{route}\", model = {model}{driver_extra} }}\n\
         [runtimes.network]\n\
         routes = [{{ name = \"{route}\", upstream = {upstream}, secret = {secret}, api = \"{route}\", allow = [{allow}] }}]\n\
         {network_extra}\n",
        kind = quote(setup.kind),
        gateway = sharedos_egress::egress_url(),
        model = quote(setup.model),
        upstream = quote(setup.upstream),
        secret = quote(setup.secret),
        allow = allow.join(", "),
        network_extra = setup.network_extra,
    );
    let grant = if setup.grant {
        MODEL_GRANT.replace("{route}", route)
    } else {
        String::new()
    };
    Ok(format!(
        "{}{runtime}{}{grant}",
        &DEMO_CONFIG[..start],
        &DEMO_CONFIG[end..]
    ))
}

/// Alice may send requests on the route `{route}`.
const MODEL_GRANT: &str = r#"
[[kernel.grants]]
id = "alice-model"
subject = { kind = "agent", agentId = "alice" }
issuer = { kind = "service", serviceId = "demo-host" }
namespaceId = "demo"
[[kernel.grants.capabilities]]
namespace = "egress"
path = ["{route}"]
scope = "exact"
actions = ["request"]
"#;

/// The demo's driver: Chat Completions as `model`, granted.
fn chat_setup(model: &str) -> ModelSetup<'_> {
    ModelSetup {
        kind: "openai-chat",
        upstream: "",
        secret: "",
        allow: &[],
        model,
        driver_extra: "",
        network_extra: "",
        grant: true,
    }
}

/// The configuration text of the demo for `model`, and a description.
async fn config_text(
    model: &ModelArgs,
    dir: &std::path::Path,
) -> Result<(String, String, Option<sharedos_egress::mock::MockModel>), String> {
    if !model.model {
        return Ok((
            DEMO_CONFIG.to_owned(),
            "sharedos.standard (transcript driver)".into(),
            None,
        ));
    }
    if model.mock {
        let script = sharedos_egress::mock::plan_script(sharedos_egress::mock::Wire::OpenaiChat);
        let mock = sharedos_egress::mock::MockModel::start(script)
            .await
            .map_err(|e| format!("cannot start the mock model: {e}"))?;
        let key = dir.join("mock-model.key");
        std::fs::write(&key, "sharedos-mock-key").map_err(|e| format!("{}: {e}", key.display()))?;
        let secret = format!("file:{}", key.display());
        let text = model_config(&ModelSetup {
            upstream: &mock.base_url(),
            secret: &secret,
            allow: &["loopback".into()],
            ..chat_setup(&model.model_name)
        })?;
        let what = format!(
            "sharedos.standard (chat driver) -> gateway -> mock model on 127.0.0.1:{}",
            mock.port
        );
        return Ok((text, what, Some(mock)));
    }
    let url = model
        .base_url
        .as_deref()
        .ok_or("--model needs --mock or --base-url URL")?;
    let allow = consented_classes(url, &model.allow)?;
    let secret = if std::env::var_os(&model.key_env).is_some() {
        format!("env:{}", model.key_env)
    } else if allow.len() > model.allow.len() || !model.allow.is_empty() {
        // A model server on this host or its network usually takes no key.
        eprintln!(
            "sharedos demo: {} is not set; the gateway sends a placeholder key (set it, or \
             name another variable with --key-env, for a server that checks keys)",
            model.key_env
        );
        let key = dir.join("local-model.key");
        std::fs::write(&key, "sharedos-local-no-key")
            .map_err(|e| format!("{}: {e}", key.display()))?;
        format!("file:{}", key.display())
    } else {
        return Err(format!(
            "{} is not set: the gateway needs the key of {url} (set it, or name another \
             variable with --key-env VAR); the plugin never sees it",
            model.key_env
        ));
    };
    let text = model_config(&ModelSetup {
        upstream: url,
        secret: &secret,
        allow: &allow,
        ..chat_setup(&model.model_name)
    })?;
    Ok((
        text,
        format!("sharedos.standard (chat driver) -> gateway -> {url}"),
        None,
    ))
}

/// The address classes the demo's route may reach: `--allow`'s, plus the
/// class of the host `--base-url` names (a model server on this host's
/// loopback, such as Ollama or vLLM, or one on a private network). A URL
/// typed on the command line is the operator's consent to reach it, and
/// the demo says so; a configuration file still needs `allow` spelled out.
fn consented_classes(url: &str, allow: &[String]) -> Result<Vec<String>, String> {
    let parsed = sharedos_egress::policy::UpstreamUrl::parse(url)
        .map_err(|e| format!("--base-url {url}: {e}"))?;
    let mut allow = allow.to_vec();
    let class = sharedos_egress::policy::class_of_host(&parsed.host)
        .and_then(|c| serde_json::to_value(c).ok())
        .and_then(|v| v.as_str().map(str::to_owned));
    if let Some(class) = class
        && !allow.contains(&class)
    {
        eprintln!(
            "sharedos demo: --base-url names a {class} address ({host}); naming it on the \
             command line is consent, so this demo's route may reach {class} addresses",
            host = parsed.host
        );
        allow.push(class);
    }
    Ok(allow)
}

/// What a configuration error names as its source: with --model the
/// configuration is built from the flags, and an error in it is about a
/// flag, never about a file the user could edit.
fn config_origin(model: &ModelArgs) -> &'static str {
    if model.model {
        "<the demo's configuration from your --model flags>"
    } else {
        "<embedded demo/host.toml>"
    }
}

/// Runs the demo; returns the exit code.
pub async fn demo(keep: bool, model: &ModelArgs, launcher_for: &LauncherFor) -> i32 {
    let dir = match tempfile::Builder::new().prefix("sharedos-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("sharedos demo: cannot create a temporary directory: {e}");
            return 2;
        }
    };
    let (text, what, _mock) = match config_text(model, dir.path()).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sharedos demo: {e}");
            return 2;
        }
    };
    let config = match HostConfig::parse(&text, config_origin(model), dir.path()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sharedos demo: {e}");
            return 2;
        }
    };
    eprintln!("sharedos demo: agent alice, runtime {what}, in a sandboxed child process");
    eprintln!(
        "sharedos demo: files and audit trail under {}",
        dir.path().display()
    );
    let printer: Arc<dyn Fn(String) + Send + Sync> = Arc::new(|line| eprintln!("  {line}"));
    let run = match run_turn(
        &config,
        DEMO_REQUEST,
        "<embedded demo/turn.json>",
        launcher_for,
        Some(printer),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sharedos demo: {e}");
            return 2;
        }
    };
    let code = print_result(&run.result);
    let sandbox = &run
        .result
        .metadata
        .get("runtime")
        .and_then(|r| r.get("sandbox"))
        .cloned()
        .unwrap_or_default();
    eprintln!(
        "sharedos demo: the plugin ran in a sandbox of level {} (see metadata.runtime.sandbox)",
        sandbox
            .get("level")
            .and_then(|l| l.as_str())
            .unwrap_or("unknown")
    );
    let records = std::fs::read_to_string(&run.audit_path)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    eprintln!(
        "sharedos demo: turn {} {}; {} audit records in {}",
        run.result.execution_id,
        run.result.status.as_str(),
        records,
        run.audit_path.display()
    );
    if keep {
        let kept = dir.keep();
        eprintln!("sharedos demo: kept {}", kept.display());
    }
    code
}
