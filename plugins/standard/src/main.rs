//! `sharedos-standard`: the standard runtime as a plugin binary, with the
//! driver the trusted registry entry names:
//!
//! - `--transcript <json>`: a scripted sequence of decisions;
//! - `--driver <kind> --base-url http://<gateway>/<route> --model M`, kind
//!   `openai-chat`, `openai-responses` or `anthropic-messages`: the model
//!   API through the host's egress gateway. The key is
//!   `SHAREDOS_MODEL_KEY` from the environment, a placeholder the gateway
//!   replaces; the real key never reaches this process.

#![forbid(unsafe_code)]

use std::process::ExitCode;

const USAGE: &str = "usage: sharedos-standard --transcript '<JSON array of decisions>'\n   \
     or: sharedos-standard --driver openai-chat|openai-responses|anthropic-messages --base-url http://<gateway>/<route> --model <name>";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut transcript, mut driver, mut base, mut model) = (None, None, None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--transcript" => transcript = args.next(),
            "--driver" => driver = args.next(),
            "--base-url" => base = args.next(),
            "--model" => model = args.next(),
            other => {
                eprintln!("sharedos-standard: unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let plugin = match (transcript, driver.as_deref()) {
        (Some(text), None) => match serde_json::from_str(&text) {
            Ok(v) => sharedos_standard::plugin(v),
            Err(e) => {
                eprintln!("sharedos-standard: the transcript is not JSON: {e}");
                return ExitCode::from(2);
            }
        },
        (None, Some(kind)) => {
            let kind = match sharedos_standard::DriverKind::parse(kind) {
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
            let key = std::env::var("SHAREDOS_MODEL_KEY")
                .unwrap_or_else(|_| "sharedos-placeholder".into());
            sharedos_standard::model_plugin(kind, &base, &model, &key)
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
