//! Session affinity (docs/SECURITY.md, "Session affinity"): a runtime
//! configured with `affinity = { ttlMs = N }`, whose plugin accepted
//! `turns: "many"` in `initialize`, may serve consecutive turns of one
//! session from one sandboxed process.
//!
//! After a turn whose outcome was `complete`, the process is *parked*
//! under the turn's [`AffinityKey`]; the executor then confirms it (the
//! turn ended `succeeded`, without a drain) or discards it (any other
//! ending). A confirmed process is taken by the next turn with the same
//! key: exactly one taker, since taking removes it from the lot under its
//! lock. While parked, one task watches it: the TTL, a release (session
//! close, host shutdown, [`settle_kills`](super::settle_kills)), any line
//! the plugin writes, or its exit ends it, and its tree goes through the
//! same teardown as every turn's (the reaper: kill, reap, workspace and
//! cgroup removed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, Signal};
use sharedos_protocol::{
    AccessContext, Address, RuntimeTurnOutcome, RuntimeTurnRequest, canonical_json,
};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::connection::Connection;
use super::{ProcessRuntime, ProcessTree, new_turn_id, reaper, stamp};
use crate::provenance::TurnReport;

pub use crate::config::AffinityConfig;
pub use crate::limits::MAX_AFFINITY_TTL_MS;

/// What a parked process is kept under: the session, and a fingerprint of
/// everything trusted the turn runs as (the agent, the namespace, the
/// authority, the owner, the purpose, the enabled tool namespaces). The
/// runtime is the lot's own. Made only by the host's session layer: a bare
/// `execute` has no key and never reuses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    session: String,
    fingerprint: String,
}

impl AffinityKey {
    pub(crate) fn new(session: &str, agent: &Address, context: &AccessContext) -> Self {
        let trusted = json!({
            "agent": agent,
            "namespaceId": context.namespace_id,
            "authority": context.authority,
            "owner": context.owner,
            "purpose": context.purpose,
            "enabledToolNamespaces": context.enabled_tool_namespaces,
        });
        let hash = Sha256::digest(canonical_json(&trusted).as_bytes());
        Self {
            session: session.to_owned(),
            fingerprint: hash.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One parked process, as the lot holds it.
struct Slot {
    serial: u64,
    /// The turn that parked it; `turn_ended` finds it by this.
    execution_id: String,
    /// The executor confirmed the turn ended `succeeded`: takeable.
    confirmed: bool,
    take: oneshot::Sender<oneshot::Sender<Connection>>,
    stop: CancellationToken,
    /// The process tree, shared with its guard: a release kills it
    /// without waiting for the watching task.
    tree: Arc<Mutex<Option<Box<dyn ProcessTree>>>>,
}

#[derive(Default)]
struct Slots {
    by_key: HashMap<AffinityKey, Slot>,
    serial: u64,
}

/// The parked processes of one runtime.
pub(crate) struct ParkingLot {
    ttl: Duration,
    slots: Mutex<Slots>,
}

/// Every lot of this host process, for `settle_kills`.
static LOTS: Mutex<Vec<Weak<ParkingLot>>> = Mutex::new(Vec::new());

/// Kills every parked process of every runtime (their reaping is waited
/// for by the reaper's `settle`).
pub(super) fn release_everywhere() {
    let lots: Vec<Arc<ParkingLot>> = lock(&LOTS).iter().filter_map(Weak::upgrade).collect();
    for lot in lots {
        lot.release_where(|_| true);
    }
}

/// Kills a slot's tree now and hands it to the reaper; its watching task
/// ends on `stop`.
fn evict(slot: Slot) {
    // The tree first: once `stop` is raised the watcher closes the
    // connection, and a tree it took would reach the reaper after a
    // `settle_kills` that is waiting on this eviction had returned.
    let tree = lock(&slot.tree).take();
    if let Some(tree) = tree {
        reaper::reap_later(tree);
    }
    slot.stop.cancel();
}

impl ParkingLot {
    pub(super) fn new(ttl: Duration) -> Arc<Self> {
        let lot = Arc::new(Self {
            ttl,
            slots: Mutex::new(Slots::default()),
        });
        let mut lots = lock(&LOTS);
        lots.retain(|l| l.strong_count() > 0);
        lots.push(Arc::downgrade(&lot));
        lot
    }

    /// The confirmed process parked under `key`, if any: removed from the
    /// lot, so no other turn can have it.
    async fn take(&self, key: &AffinityKey) -> Option<Connection> {
        let slot = {
            let mut slots = lock(&self.slots);
            match slots.by_key.get(key) {
                Some(s) if s.confirmed => slots.by_key.remove(key),
                _ => None,
            }
        }?;
        let (reply, conn) = oneshot::channel();
        // The watcher may have ended it an instant ago (TTL, exit): then a
        // fresh process serves the turn.
        slot.take.send(reply).ok()?;
        conn.await.ok()
    }

    /// Parks `conn` after the turn `execution_id`, unconfirmed: not
    /// takeable until [`ParkingLot::turn_ended`] confirms it, killed at
    /// the TTL either way.
    fn park(self: &Arc<Self>, key: AffinityKey, execution_id: &str, conn: Connection) {
        let (take, take_rx) = oneshot::channel();
        let stop = CancellationToken::new();
        let slot = Slot {
            serial: 0,
            execution_id: execution_id.to_owned(),
            confirmed: false,
            take,
            stop: stop.clone(),
            tree: conn.guard.tree.clone(),
        };
        let (serial, displaced) = {
            let mut slots = lock(&self.slots);
            slots.serial += 1;
            let serial = slots.serial;
            let displaced = slots.by_key.insert(key.clone(), Slot { serial, ..slot });
            (serial, displaced)
        };
        // Two turns of one session ran at once: the later one's process
        // stays, the earlier one's goes.
        if let Some(old) = displaced {
            evict(old);
        }
        let watch = Watch {
            lot: Arc::downgrade(self),
            key,
            serial,
            ttl: self.ttl,
            stop,
        };
        tokio::spawn(watch.run(conn, take_rx));
    }

    /// The executor's verdict on the turn that parked a process: `keep`
    /// only for a turn that ended `succeeded` without a drain.
    pub(crate) fn turn_ended(&self, execution_id: &str, keep: bool) {
        let mut slots = lock(&self.slots);
        let Some(key) = slots
            .by_key
            .iter()
            .find(|(_, s)| s.execution_id == execution_id)
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        if keep {
            if let Some(s) = slots.by_key.get_mut(&key) {
                s.confirmed = true;
            }
        } else if let Some(slot) = slots.by_key.remove(&key) {
            drop(slots);
            evict(slot);
        }
    }

    /// Kills every process parked for `session` (the session was closed).
    pub(crate) fn release_session(&self, session: &str) {
        self.release_where(|k| k.session == session);
    }

    /// Kills every process parked here (the host is shutting down).
    pub(crate) fn release_all(&self) {
        self.release_where(|_| true);
    }

    fn release_where(&self, pick: impl Fn(&AffinityKey) -> bool) {
        let picked: Vec<Slot> = {
            let mut slots = lock(&self.slots);
            let keys: Vec<AffinityKey> = slots.by_key.keys().filter(|k| pick(k)).cloned().collect();
            keys.iter().filter_map(|k| slots.by_key.remove(k)).collect()
        };
        picked.into_iter().for_each(evict);
    }

    /// Forgets the slot `serial` under `key`, if it is still that one.
    fn forget(&self, key: &AffinityKey, serial: u64) {
        let mut slots = lock(&self.slots);
        if slots.by_key.get(key).is_some_and(|s| s.serial == serial) {
            slots.by_key.remove(key);
        }
    }
}

/// The task that watches one parked process.
struct Watch {
    lot: Weak<ParkingLot>,
    key: AffinityKey,
    serial: u64,
    ttl: Duration,
    stop: CancellationToken,
}

enum Woke {
    Taken(oneshot::Sender<Connection>),
    Ended(&'static str),
}

impl Watch {
    async fn run(self, mut conn: Connection, take: oneshot::Receiver<oneshot::Sender<Connection>>) {
        let woke = {
            let exited = conn.guard.exited();
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => Woke::Ended("released"),
                t = take => match t {
                    Ok(reply) => Woke::Taken(reply),
                    Err(_) => Woke::Ended("released"),
                },
                // Between turns a plugin writes nothing (docs/PROTOCOL.md
                // section 4.6): any line, or its end, ends the process.
                _ = conn.inbound.recv() => Woke::Ended("the plugin wrote while parked"),
                _ = exited => Woke::Ended("the plugin exited while parked"),
                _ = tokio::time::sleep(self.ttl) => Woke::Ended("the affinity TTL passed"),
            }
        };
        let why = match woke {
            Woke::Taken(reply) => match reply.send(conn) {
                Ok(()) => return,
                Err(back) => {
                    conn = back;
                    "the taker went away"
                }
            },
            Woke::Ended(why) => why,
        };
        tracing::debug!(pid = conn.pid, first = %conn.first_execution_id, "parked plugin process ended: {why}");
        // Killed before it leaves the lot: a `settle_kills` that no longer
        // finds it there finds its tree with the reaper.
        conn.close(false);
        if let Some(lot) = self.lot.upgrade() {
            lot.forget(&self.key, self.serial);
        }
    }
}

impl ProcessRuntime {
    /// One turn of a session: on the process parked under `key` when
    /// there is one, else on a fresh one offered `turns: "many"`; after a
    /// `complete` outcome on a process that may serve again, it is parked
    /// (see the module docs), else killed. Without a lot (no affinity
    /// configured, or a network policy) it is [`RuntimePlugin::run`].
    pub(crate) async fn run_in_session(
        &self,
        key: AffinityKey,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
        report: &TurnReport,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        let Some(lot) = self.lot.clone() else {
            return self.run_reported(request, host, abort, report).await;
        };
        if abort.is_raised() {
            return Err(RuntimeError::Failed(
                "the turn was aborted before the runtime started".into(),
            ));
        }
        let stages = self.config.stages.as_ref();
        stamp(stages, "run");
        let execution_id = request.execution_id.as_str().to_owned();
        let turn_id = new_turn_id();
        let mut conn = match lot.take(&key).await {
            Some(conn) => {
                stamp(stages, "reused");
                self.report_program(report);
                if let Some(sandbox) = &conn.report {
                    report.set_sandbox(sandbox.clone());
                }
                conn
            }
            // No gateway: a runtime with a network policy has no lot.
            None => {
                self.open(&execution_id, &turn_id, &abort, true, report)
                    .await?
                    .0
            }
        };
        conn.turns += 1;
        report.set_affinity(conn.affinity_provenance());
        let outcome = conn
            .turn(&turn_id, request, host, abort.clone(), report)
            .await;
        stamp(stages, "settled");
        match &outcome {
            Ok(RuntimeTurnOutcome::Complete { .. }) if conn.reusable() && !abort.is_raised() => {
                lot.park(key, &execution_id, conn);
                stamp(stages, "parked");
            }
            Ok(_) => conn.close(false),
            Err(e) => {
                self.diagnose_error(report, &execution_id, e, &abort, &mut conn, &turn_id)
                    .await;
                conn.close(abort.is_raised());
            }
        }
        stamp(stages, "signalled");
        outcome
    }

    /// The executor's verdict on a session turn (see [`ParkingLot`]).
    pub(crate) fn session_turn_ended(&self, execution_id: &str, keep: bool) {
        if let Some(lot) = &self.lot {
            lot.turn_ended(execution_id, keep);
        }
    }

    /// Kills the processes parked for `session`.
    pub fn release_session(&self, session: &str) {
        if let Some(lot) = &self.lot {
            lot.release_session(session);
        }
    }

    /// Kills every process parked for this runtime.
    pub fn release_parked(&self) {
        if let Some(lot) = &self.lot {
            lot.release_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::HostConfig;

    const ENTRY: &str = r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "r"
version = "1"
program = "sharedos-echo"
launcher = "direct"
"#;

    fn parse(extra: &str) -> Result<HostConfig, String> {
        HostConfig::parse(&format!("{ENTRY}{extra}"), "host.toml", Path::new("."))
            .map_err(|e| e.message)
    }

    #[test]
    fn affinity_is_off_unless_configured_and_its_ttl_is_bounded() {
        assert_eq!(parse("").unwrap().runtimes[0].affinity, None);
        let on = parse("affinity = { ttlMs = 30000 }\n").unwrap();
        assert_eq!(on.runtimes[0].affinity.map(|a| a.ttl_ms), Some(30_000));
        for bad in ["0", "300001"] {
            let e = parse(&format!("affinity = {{ ttlMs = {bad} }}\n")).unwrap_err();
            assert!(
                e.contains("runtimes[0].affinity.ttlMs: must be 1..=300000"),
                "{e}"
            );
        }
        let e = parse("affinity = { ttl = 5 }\n").unwrap_err();
        assert!(e.contains("ttl"), "{e}");
    }

    #[test]
    fn the_key_separates_sessions_agents_and_scopes_and_nothing_else() {
        use serde_json::json;
        use sharedos_protocol::{AccessContext, Address};

        use super::AffinityKey;
        let agent = |id: &str| -> Address {
            serde_json::from_value(json!({"kind": "agent", "agentId": id})).unwrap()
        };
        let context = |owner: &str, trace: &str| -> AccessContext {
            serde_json::from_value(json!({
                "namespaceId": "n", "actor": {"kind": "agent", "agentId": "a"},
                "authority": {"kind": "service", "serviceId": "h"},
                "owner": {"kind": "human", "userId": owner}, "purpose": "p",
                "traceId": trace, "enabledToolNamespaces": ["files"],
                "now": "2026-01-01T00:00:00Z"
            }))
            .unwrap()
        };
        let key = AffinityKey::new("s1", &agent("a"), &context("u", "t1"));
        // The trace and the clock are the turn's own, not who it runs as.
        assert_eq!(
            key,
            AffinityKey::new("s1", &agent("a"), &context("u", "t2"))
        );
        assert_ne!(
            key,
            AffinityKey::new("s2", &agent("a"), &context("u", "t1"))
        );
        assert_ne!(
            key,
            AffinityKey::new("s1", &agent("b"), &context("u", "t1"))
        );
        assert_ne!(
            key,
            AffinityKey::new("s1", &agent("a"), &context("v", "t1"))
        );
    }

    #[test]
    fn affinity_is_refused_with_a_network_policy() {
        let network = "[runtimes.network]\nroutes = [{ name = \"m\", upstream = \"https://api.openai.com/v1\", secret = \"env:HOME\", api = \"openai\" }]\n";
        let e = parse(&format!("affinity = {{ ttlMs = 1000 }}\n{network}")).unwrap_err();
        assert!(
            e.contains("runtimes[0].affinity: not available with a network policy"),
            "{e}"
        );
    }
}
