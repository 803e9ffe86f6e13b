//! `sharedos-standard`: the standard runtime with a transcript driver, as a
//! plugin binary. The transcript comes from the trusted registry entry, as
//! `--transcript <json>`.

use std::process::ExitCode;

const USAGE: &str = "usage: sharedos-standard --transcript '<JSON array of decisions>'";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut transcript = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--transcript" => transcript = args.next(),
            other => {
                eprintln!("sharedos-standard: unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(text) = transcript else {
        eprintln!("sharedos-standard: no transcript given\n{USAGE}");
        return ExitCode::from(2);
    };
    let value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("sharedos-standard: the transcript is not JSON: {e}");
            return ExitCode::from(2);
        }
    };
    match sharedos_standard::plugin(value) {
        Ok(plugin) => sharedos_plugin_sdk::serve(plugin),
        Err(e) => {
            eprintln!("sharedos-standard: {e}");
            ExitCode::from(2)
        }
    }
}
