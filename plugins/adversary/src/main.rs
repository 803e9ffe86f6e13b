//! `sharedos-adversary`: a hostile runtime plugin for the sandbox tests.
//!
//! ```text
//! sharedos-adversary --standalone [--bait bait.json | --bait-json '{..}'] [--only C42[,C43]]
//!     runs the attacks unsandboxed and prints one receipt per line (JSON)
//! sharedos-adversary --list        the catalogue, one attack per line (JSON)
//! sharedos-adversary --report-ids  prints `uid=.. euid=.. CapEff=..` (for C49/C50 bait copies)
//! sharedos-adversary               plugin mode: JSON-RPC over stdio
//! ```

use std::io::Write;
use std::process::ExitCode;

use sharedos_adversary::attacks::{CATALOGUE, kernel};
use sharedos_adversary::run::{self, Selection};
use sharedos_adversary::{Bait, Receipt};

const USAGE: &str = "usage: sharedos-adversary --standalone [--bait FILE | --bait-json JSON] [--only ID[,ID...]] | --list | --report-ids";

struct Args {
    standalone: bool,
    list: bool,
    report_ids: bool,
    bait: Option<String>,
    bait_json: Option<String>,
    only: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        standalone: false,
        list: false,
        report_ids: false,
        bait: None,
        bait_json: None,
        only: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--standalone" => args.standalone = true,
            "--list" => args.list = true,
            "--report-ids" => args.report_ids = true,
            "--bait" => args.bait = Some(it.next().ok_or("--bait needs a file")?),
            // Inline, for a sandbox whose workspace the host cannot write.
            "--bait-json" => args.bait_json = Some(it.next().ok_or("--bait-json needs JSON")?),
            "--only" => args.only.extend(
                it.next()
                    .ok_or("--only needs an attack id")?
                    .split(',')
                    .map(str::to_owned),
            ),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn print_line(value: &impl serde::Serialize) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, value);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

fn standalone(args: &Args) -> Result<(), String> {
    let bait: Bait = match (&args.bait, &args.bait_json) {
        (None, Some(json)) => serde_json::from_str(json)
            .map_err(|e| format!("--bait-json is not valid bait JSON: {e}"))?,
        (None, None) => Bait::default(),
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the bait {path}: {e}"))?;
            serde_json::from_str(&text)
                .map_err(|e| format!("the bait {path} is not valid bait JSON: {e}"))?
        }
    };
    let selection = if args.only.is_empty() {
        Selection::Default
    } else {
        Selection::Only(args.only.clone())
    };
    let attacks = selection.attacks()?;
    run::run(&attacks, &bait, &|| false, &mut |r: &Receipt| print_line(r));
    if bait.hold {
        print_line(&serde_json::json!({ "holding": true }));
        sharedos_adversary::sys::raw_sleep(bait.hang_secs());
    }
    Ok(())
}

fn main() -> ExitCode {
    // Before the plugin SDK moves fd 1 (see `sys::record_protocol_stdout`).
    sharedos_adversary::sys::record_protocol_stdout();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if args.report_ids {
        println!("{}", kernel::ids_line());
        return ExitCode::SUCCESS;
    }
    if args.list {
        for a in CATALOGUE {
            print_line(
                &serde_json::json!({ "id": a.id, "attack": a.label(), "selectableOnly": a.selectable_only, "bait": a.bait }),
            );
        }
        return ExitCode::SUCCESS;
    }
    if args.standalone {
        return match standalone(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sharedos-adversary: {e}");
                ExitCode::from(2)
            }
        };
    }
    sharedos_plugin_sdk::serve(sharedos_adversary::plugin::AdversaryPlugin)
}
