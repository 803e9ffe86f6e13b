//! Opt-in stage timestamps (`policy.timings`): where a spawn spends its
//! time, host and helper side, on one clock (`CLOCK_MONOTONIC`, which is
//! shared across processes), relative to the host's call to
//! [`crate::spawn`]. Off by default; when off, [`stamp`] is one relaxed
//! atomic load.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One stage: microseconds since the host entered `spawn`, and in which
/// process it was taken (`host`, `helper`, `pid1`, `plugin`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StageTiming {
    pub stage: String,
    pub process: String,
    pub us: u64,
}

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

// The helper's record. The helper is single-threaded, so after a fork the
// child owns a consistent copy (no other thread can hold the lock).
static ON: AtomicBool = AtomicBool::new(false);
static ORIGIN_NS: AtomicU64 = AtomicU64::new(0);
static STAMPS: Mutex<Vec<(&'static str, &'static str, u64)>> = Mutex::new(Vec::new());

/// Start recording in the helper, with the host's origin.
pub(crate) fn enable(origin_ns: u64, early: &[(&'static str, u64)]) {
    ORIGIN_NS.store(origin_ns, Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
    let mut s = STAMPS.lock().unwrap_or_else(|p| p.into_inner());
    for (stage, ns) in early {
        s.push((stage, "helper", *ns));
    }
}

/// Record `stage` in `process`, when enabled.
pub(crate) fn stamp(process: &'static str, stage: &'static str) {
    if ON.load(Ordering::Relaxed) {
        let t = now_ns();
        STAMPS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((stage, process, t));
    }
}

/// Everything recorded so far, relative to the host's origin.
pub(crate) fn take() -> Vec<StageTiming> {
    if !ON.load(Ordering::Relaxed) {
        return Vec::new();
    }
    let origin = ORIGIN_NS.load(Ordering::Relaxed);
    STAMPS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
        .map(|(stage, process, ns)| StageTiming {
            stage: stage.into(),
            process: process.into(),
            us: ns.saturating_sub(origin) / 1000,
        })
        .collect()
}

/// Host side: stamps taken in `spawn`, relative to its start.
#[derive(Debug)]
pub(crate) struct HostClock {
    pub origin_ns: u64,
    on: bool,
    pub stamps: Vec<StageTiming>,
}

impl HostClock {
    pub fn new(on: bool) -> Self {
        HostClock {
            origin_ns: now_ns(),
            on,
            stamps: Vec::new(),
        }
    }

    pub fn stamp(&mut self, stage: &str) {
        if self.on {
            self.stamps.push(StageTiming {
                stage: stage.into(),
                process: "host".into(),
                us: now_ns().saturating_sub(self.origin_ns) / 1000,
            });
        }
    }
}
