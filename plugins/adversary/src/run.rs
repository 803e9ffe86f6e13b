//! Runs a sequence of attacks, handing each receipt out before the next
//! attempt (so receipts survive a crash later in the run).

use std::time::Duration;

use crate::attacks::{self, Attack};
use crate::bait::Bait;
use crate::receipt::Receipt;

/// What to run: the default sequence, or the attacks a test selected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Selection {
    #[default]
    Default,
    Only(Vec<String>),
}

impl Selection {
    pub fn attacks(&self) -> Result<Vec<&'static Attack>, String> {
        match self {
            Selection::Default => Ok(attacks::default_sequence().collect()),
            Selection::Only(ids) => attacks::select(ids),
        }
    }
}

/// Time for a receipt to reach the host before an attack's `then` starts
/// writing raw bytes to the same pipe or stops the process.
const SETTLE: Duration = Duration::from_millis(200);

/// Runs `attacks` in order; `out` receives each receipt right after its
/// attempt. `stop` is asked between attempts (the turn's abort). Returns
/// the receipts of the attacks that returned.
pub fn run(
    attacks: &[&Attack],
    bait: &Bait,
    stop: &dyn Fn() -> bool,
    out: &mut dyn FnMut(&Receipt),
) -> Vec<Receipt> {
    crate::sys::set_holding(bait.hold);
    let mut receipts = Vec::with_capacity(attacks.len());
    for attack in attacks {
        if stop() {
            break;
        }
        let receipt = attack.attempt(bait);
        out(&receipt);
        receipts.push(receipt);
        if let Some(then) = attack.then {
            std::thread::sleep(SETTLE);
            then(bait);
        }
    }
    receipts
}

/// Counts for the summary: attempted, blocked, succeeded, unjudged, not attempted.
pub fn tally(receipts: &[Receipt]) -> serde_json::Value {
    let attempted = receipts.iter().filter(|r| r.attempted).count();
    let count = |b: Option<bool>| {
        receipts
            .iter()
            .filter(|r| r.attempted && r.blocked == b)
            .count()
    };
    serde_json::json!({
        "attacks": receipts.len(),
        "attempted": attempted,
        "blocked": count(Some(true)),
        "succeeded": count(Some(false)),
        "unjudged": count(None),
        "notAttempted": receipts.len() - attempted,
    })
}
