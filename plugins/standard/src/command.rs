//! `sharedos-standard`: the standard runtime as a plugin binary, with the
//! driver the trusted registry entry names:
//!
//! - `--transcript <json>`: a scripted sequence of decisions;
//! - `--driver <kind> --base-url http://<gateway>/<route> --model M`, kind
//!   `openai-chat`, `openai-responses`, `anthropic-messages` or
//!   `gemini-generate-content`: the model
//!   API through the host's egress gateway. The key is
//!   `SHAREDOS_MODEL_KEY` from the environment, a placeholder the gateway
//!   replaces; the real key never reaches this process. `--max-tokens N`
//!   sets Anthropic's `max_tokens` (default 4096) or Gemini's
//!   `maxOutputTokens` (default: not sent), 1..=131072.

use std::process::ExitCode;

const USAGE: &str = "usage: sharedos-standard --transcript '<JSON array of decisions>'\n   \
     or: sharedos-standard --driver openai-chat|openai-responses|anthropic-messages|gemini-generate-content --base-url http://<gateway>/<route> --model <name> [--max-tokens N]";

pub fn run() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut transcript, mut driver, mut base, mut model) = (None, None, None, None);
    let mut max_tokens = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--transcript" => transcript = args.next(),
            "--driver" => driver = args.next(),
            "--base-url" => base = args.next(),
            "--model" => model = args.next(),
            "--max-tokens" => match args.next().map(|n| n.parse::<u64>()) {
                Some(Ok(n)) => max_tokens = Some(n),
                _ => {
                    eprintln!("sharedos-standard: --max-tokens takes a number\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            other => {
                eprintln!("sharedos-standard: unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if max_tokens.is_some() && driver.is_none() {
        eprintln!("sharedos-standard: --max-tokens needs --driver\n{USAGE}");
        return ExitCode::from(2);
    }
    let plugin = match (transcript, driver.as_deref()) {
        (Some(text), None) => match serde_json::from_str(&text) {
            Ok(v) => crate::plugin(v),
            Err(e) => {
                eprintln!("sharedos-standard: the transcript is not JSON: {e}");
                return ExitCode::from(2);
            }
        },
        (None, Some(kind)) => {
            let kind = match crate::DriverKind::parse(kind) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("sharedos-standard: --driver {e}\n{USAGE}");
                    return ExitCode::from(2);
                }
            };
            let (Some(base), Some(model)) = (base, model) else {
                eprintln!("sharedos-standard: --driver needs --base-url and --model\n{USAGE}");
                return ExitCode::from(2);
            };
            let key = std::env::var(sharedos_protocol::MODEL_KEY_ENV)
                .unwrap_or_else(|_| sharedos_protocol::PLACEHOLDER_MODEL_KEY.into());
            crate::model_plugin_with(kind, &base, &model, &key, max_tokens)
        }
        _ => {
            eprintln!("sharedos-standard: give exactly one of --transcript or --driver\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match plugin {
        Ok(plugin) => sharedos_plugin_sdk::serve(plugin),
        Err(e) => {
            eprintln!("sharedos-standard: {e}");
            ExitCode::from(2)
        }
    }
}
