//! The turn a gateway's traffic belongs to: whose grants decide, where the
//! events go, what is left of the budget; and what one request or tunnel
//! reports when it ends (an event, and an audit record with counts and
//! codes only).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};
use sharedos_kernel::{EffectDecision, KernelTurn};
use sharedos_protocol::{AccessContext, JsonObject};
use tokio::sync::mpsc;

use super::policy::EgressBudget;
use super::usage::TokenUsage;

/// What the gateway reports to the turn; the envelope turns these into
/// events. None holds a payload or a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EgressEvent {
    /// One model request, ended.
    Request {
        route: String,
        /// The upstream's status, when it answered.
        status: Option<u16>,
        /// Why the gateway refused or cut it.
        code: Option<String>,
        request_bytes: u64,
        response_bytes: u64,
        duration_ms: u64,
        usage: Option<TokenUsage>,
        /// Charged to the token budget for an answer that reported no
        /// usage: (request bytes + response bytes) / 4, rounded up.
        estimated_tokens: Option<u64>,
    },
    /// One CONNECT tunnel, ended (or refused).
    Connection {
        destination: String,
        code: Option<String>,
        bytes_up: u64,
        bytes_down: u64,
        duration_ms: u64,
    },
    /// A per-turn budget ran out: the turn ends `egress_budget_exceeded`.
    BudgetExceeded { budget: &'static str },
    /// A route's model failed `failures` answers in a row (its
    /// `maxFailures`): the turn ends `model_unavailable`, or
    /// `model_access_refused` when the last answer was 401 or 403.
    ModelFailing {
        route: String,
        failures: u32,
        /// The last failed answer's status, or why none came.
        status: Option<u16>,
        code: Option<String>,
    },
}

impl EgressEvent {
    /// Whether this ends the turn, and with which reason.
    pub fn ends_turn(&self) -> Option<&'static str> {
        match self {
            EgressEvent::BudgetExceeded { .. } => Some(EGRESS_BUDGET_EXCEEDED),
            EgressEvent::ModelFailing {
                status: Some(401 | 403),
                ..
            } => Some(MODEL_ACCESS_REFUSED),
            EgressEvent::ModelFailing { .. } => Some(MODEL_UNAVAILABLE),
            _ => None,
        }
    }
}

/// The code of a request or tunnel still open when its turn ended.
pub const INTERRUPTED: &str = "interrupted";

/// The turn's ending when a budget runs out.
pub const EGRESS_BUDGET_EXCEEDED: &str = "egress_budget_exceeded";
/// The turn's ending when a route's model fails `maxFailures` answers in a
/// row (5xx, 429, no answer): retryable, the model may come back.
pub const MODEL_UNAVAILABLE: &str = "model_unavailable";
/// The same when the last answer was 401 or 403: the route's key or grant
/// at the provider is wrong, and a retry gets the same.
pub const MODEL_ACCESS_REFUSED: &str = "model_access_refused";

/// Whether a request's outcome is the model failing (`Some(true)`), the
/// model answering (`Some(false)`), or neither (a refusal of the gateway's
/// own, a client error such as 400 or 404): only the first two count. An
/// answer below 400 is the model answering even when the client hung up
/// before its end (`client_closed`) or a budget cut it: the model is up.
fn model_failed(o: &Outcome) -> Option<bool> {
    if o.code
        .as_deref()
        .is_some_and(|c| c.starts_with("upstream_"))
    {
        return Some(true);
    }
    match o.status {
        Some(s) if s >= 500 || matches!(s, 401 | 403 | 429) => Some(true),
        Some(s) if s < 400 => Some(false),
        _ => None,
    }
}

/// What was spent in the turn.
#[derive(Debug, Default)]
pub(super) struct Spent {
    pub(super) requests: u64,
    pub(super) bytes: u64,
    pub(super) tokens: u64,
}

/// What one model request did, for its event and audit record.
#[derive(Debug)]
pub(super) struct Outcome {
    pub(super) status: Option<u16>,
    pub(super) code: Option<String>,
    pub(super) request_bytes: u64,
    pub(super) response_bytes: u64,
    pub(super) usage: Option<TokenUsage>,
    pub(super) estimated_tokens: Option<u64>,
    /// The first bytes of an answer of status 400 or more, as the plugin
    /// got them (the key masked), for the turn's account of why the model
    /// failed; never in an event or the audit.
    pub(super) error_head: Option<Vec<u8>>,
}

/// How many bytes of a failed answer's body the turn's account keeps.
pub(super) const ERROR_HEAD_BYTES: usize = 256;

/// What the turn's result says of its egress besides the events' counts:
/// the last failed answer, and the last request the kernel refused.
#[derive(Debug, Default)]
struct Account {
    last_error: Option<serde_json::Value>,
    refused: Option<serde_json::Value>,
}

/// A request or tunnel the kernel authorized and that has not ended yet.
#[derive(Debug)]
struct OpenEffect {
    path: Vec<String>,
    action: &'static str,
    started: Instant,
}

/// The handle of an [`OpenEffect`]: whoever ends it first (the request,
/// or the turn's end) writes its outcome, the other nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct EffectId(u64);

/// The turn a listener's traffic belongs to: whose grants decide, where
/// events go, what is left of the budget.
pub struct TurnBinding {
    pub(super) kernel: Arc<dyn KernelTurn>,
    pub(super) context: AccessContext,
    pub(super) events: mpsc::UnboundedSender<EgressEvent>,
    pub(super) spent: Mutex<Spent>,
    /// Each route's failed answers in a row.
    failures: Mutex<std::collections::HashMap<String, u32>>,
    /// Requests and tunnels authorized and not ended; `None` once the
    /// turn ended (a later end writes nothing: its outcome is written).
    open: Mutex<Option<std::collections::HashMap<EffectId, OpenEffect>>>,
    next_effect: std::sync::atomic::AtomicU64,
    account: Mutex<Account>,
}

impl TurnBinding {
    pub fn new(
        kernel: Arc<dyn KernelTurn>,
        context: AccessContext,
        events: mpsc::UnboundedSender<EgressEvent>,
    ) -> Self {
        Self {
            kernel,
            context,
            events,
            spent: Mutex::new(Spent::default()),
            failures: Mutex::new(std::collections::HashMap::new()),
            open: Mutex::new(Some(std::collections::HashMap::new())),
            next_effect: std::sync::atomic::AtomicU64::new(0),
            account: Mutex::new(Account::default()),
        }
    }

    /// `{lastError, refused}` of the turn's egress so far (each `null`
    /// when there was none): the last answer of status 400 or more with
    /// its route and the first bytes of its body, escaped; the last
    /// request the kernel refused, with the grant it lacked.
    pub fn account(&self) -> serde_json::Value {
        let account = lock(&self.account);
        serde_json::json!({"lastError": account.last_error, "refused": account.refused})
    }

    /// Notes a request the kernel refused: the capability it needed.
    pub(super) fn note_refused(&self, path: &[String], action: &str, code: &str) {
        lock(&self.account).refused = Some(serde_json::json!({
            "code": code,
            "needed": {"namespace": "egress", "path": path, "action": action},
        }));
    }

    /// Notes an authorized request or tunnel as open until
    /// [`Self::end_effect`] or the turn's end.
    pub(super) fn open_effect(
        &self,
        path: &[String],
        action: &'static str,
        started: Instant,
    ) -> EffectId {
        let id = EffectId(
            self.next_effect
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        if let Ok(mut open) = self.open.lock()
            && let Some(open) = open.as_mut()
        {
            let path = path.to_vec();
            open.insert(
                id,
                OpenEffect {
                    path,
                    action,
                    started,
                },
            );
        }
        id
    }

    /// Ends an open effect: `true` when its caller writes the outcome,
    /// `false` when the turn's end already wrote it (`interrupted`).
    pub(super) fn end_effect(&self, id: EffectId) -> bool {
        match self.open.lock() {
            Ok(mut open) => match open.as_mut() {
                Some(open) => open.remove(&id).is_some(),
                None => false,
            },
            Err(_) => true,
        }
    }

    /// At the turn's end, before its ending is written: every request and
    /// tunnel still open gets its event and its `effect.completed`
    /// (failed, `interrupted`), so the audit closes every effect it
    /// authorized. Later ends of those write nothing.
    pub async fn close_open_effects(&self) {
        let open = match self.open.lock() {
            Ok(mut open) => open.take().unwrap_or_default(),
            Err(_) => return,
        };
        let mut open: Vec<OpenEffect> = open.into_values().collect();
        open.sort_by_key(|e| e.started);
        for e in open {
            let name = e.path.first().cloned().unwrap_or_default();
            let duration_ms = e.started.elapsed().as_millis() as u64;
            let event = if e.action == "connect" {
                EgressEvent::Connection {
                    destination: name,
                    code: Some(INTERRUPTED.to_owned()),
                    bytes_up: 0,
                    bytes_down: 0,
                    duration_ms,
                }
            } else {
                EgressEvent::Request {
                    route: name,
                    status: None,
                    code: Some(INTERRUPTED.to_owned()),
                    request_bytes: 0,
                    response_bytes: 0,
                    duration_ms,
                    usage: None,
                    estimated_tokens: None,
                }
            };
            let meta = meta_of(&event);
            self.emit(event);
            self.record(&e.path, e.action, false, meta).await;
        }
    }

    /// Whether `route` already failed its `max` answers in a row in this
    /// turn: its later requests are refused without reaching the model
    /// (the turn is ending).
    pub(super) fn gave_up(&self, route: &str, max: u32) -> bool {
        max > 0
            && self
                .failures
                .lock()
                .map(|c| c.get(route).is_some_and(|n| *n >= max))
                .unwrap_or(false)
    }

    /// Counts a model request's outcome against its route's failures in a
    /// row; at `max` (not 0) the turn is told to end.
    fn count_failure(&self, route: &str, max: u32, o: &Outcome) {
        let Some(failed) = model_failed(o) else {
            return;
        };
        let in_a_row = {
            let Ok(mut counts) = self.failures.lock() else {
                return;
            };
            let n = counts.entry(route.to_owned()).or_insert(0);
            *n = if failed { n.saturating_add(1) } else { 0 };
            *n
        };
        if failed && max > 0 && in_a_row == max {
            self.emit(EgressEvent::ModelFailing {
                route: route.to_owned(),
                failures: in_a_row,
                status: o.status,
                code: o.code.clone(),
            });
        }
    }

    pub(super) fn emit(&self, event: EgressEvent) {
        // A turn that stopped listening has ended; its audit still holds
        // the outcome.
        let _ = self.events.send(event);
    }

    /// Asks the kernel; `Err` is the refusal code.
    pub(super) async fn authorize(&self, path: &[String], action: &str) -> Result<(), String> {
        match self
            .kernel
            .authorize_effect(&self.context, "egress", path, action)
            .await
        {
            Ok(EffectDecision::Allowed { .. }) => Ok(()),
            Ok(EffectDecision::Denied { reason_code }) => Err(reason_code),
            Err(_) => Err("audit_unavailable".into()),
        }
    }

    pub(super) async fn record(&self, path: &[String], action: &str, ok: bool, meta: JsonObject) {
        self.kernel
            .record_effect_outcome(&self.context, "egress", path, action, ok, meta)
            .await;
    }

    /// Charges `n` bytes to the turn; `false` once the byte budget is
    /// over.
    pub(super) fn take_bytes(&self, budget: &EgressBudget, n: u64) -> bool {
        let Ok(mut spent) = self.spent.lock() else {
            return false;
        };
        spent.bytes = spent.bytes.saturating_add(n);
        budget.bytes.is_none_or(|l| spent.bytes <= l)
    }

    /// Charges the tokens a request reported (or its estimate); `true`
    /// once the token budget is over.
    pub(super) fn take_tokens(&self, budget: &EgressBudget, tokens: u64) -> bool {
        self.spent
            .lock()
            .map(|mut s| {
                s.tokens = s.tokens.saturating_add(tokens);
                budget.tokens.is_some_and(|l| s.tokens > l)
            })
            .unwrap_or(true)
    }

    /// Emits a model request's event now and returns the write of its
    /// outcome record, which the caller awaits before the client sees
    /// the answer end.
    pub(super) fn finish_request(
        self: &Arc<Self>,
        (path, effect): (&[String], EffectId),
        max_failures: u32,
        o: Outcome,
        started: Instant,
    ) -> impl Future<Output = ()> + Send + 'static {
        // Ended with its turn already: its outcome is on the audit.
        let open = self.end_effect(effect);
        let ok = o.code.is_none() && o.status.is_some_and(|s| s < 400);
        let route = path.first().map(String::as_str).unwrap_or_default();
        if let (Some(status), Some(head)) = (o.status.filter(|s| *s >= 400), &o.error_head) {
            lock(&self.account).last_error = Some(serde_json::json!({
                "route": route,
                "status": status,
                "bodyHead": sharedos_protocol::text::escape_text(&String::from_utf8_lossy(head)),
            }));
        }
        self.count_failure(route, max_failures, &o);
        let event = EgressEvent::Request {
            route: path.first().cloned().unwrap_or_default(),
            status: o.status,
            code: o.code,
            request_bytes: o.request_bytes,
            response_bytes: o.response_bytes,
            duration_ms: started.elapsed().as_millis() as u64,
            usage: o.usage,
            estimated_tokens: o.estimated_tokens,
        };
        let meta = meta_of(&event);
        if open {
            self.emit(event);
        }
        let (binding, path) = (Arc::clone(self), path.to_vec());
        async move {
            if open {
                binding.record(&path, "request", ok, meta).await;
            }
        }
    }
}

/// The account's lock; a panic while it was held leaves a value that is
/// still whole (each field is replaced at once).
fn lock(m: &Mutex<Account>) -> std::sync::MutexGuard<'_, Account> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The audit metadata of an event: counts and codes only.
pub(super) fn meta_of(event: &EgressEvent) -> JsonObject {
    let value = match event {
        EgressEvent::Request {
            status,
            code,
            request_bytes,
            response_bytes,
            duration_ms,
            usage,
            estimated_tokens,
            ..
        } => json!({
            "status": status,
            "code": code,
            "requestBytes": request_bytes,
            "responseBytes": response_bytes,
            "durationMs": duration_ms,
            "inputTokens": usage.map(|u| u.input),
            "outputTokens": usage.map(|u| u.output),
            "estimatedTokens": estimated_tokens,
        }),
        EgressEvent::Connection {
            code,
            bytes_up,
            bytes_down,
            duration_ms,
            ..
        } => json!({
            "code": code,
            "bytesUp": bytes_up,
            "bytesDown": bytes_down,
            "durationMs": duration_ms,
        }),
        EgressEvent::BudgetExceeded { budget } => json!({"budget": budget}),
        EgressEvent::ModelFailing {
            failures,
            status,
            code,
            ..
        } => json!({"failures": failures, "status": status, "code": code}),
    };
    match value {
        Value::Object(m) => m.into_iter().filter(|(_, v)| !v.is_null()).collect(),
        _ => JsonObject::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::{Outcome, model_failed};

    fn outcome(status: Option<u16>, code: Option<&str>) -> Outcome {
        Outcome {
            status,
            code: code.map(str::to_owned),
            request_bytes: 0,
            response_bytes: 0,
            usage: None,
            estimated_tokens: None,
            error_head: None,
        }
    }

    #[test]
    fn what_counts_as_the_model_failing_or_answering() {
        for (status, code, want) in [
            (Some(500), None, Some(true)),
            (Some(503), None, Some(true)),
            (Some(429), None, Some(true)),
            (Some(401), None, Some(true)),
            (None, Some("upstream_timeout"), Some(true)),
            (Some(200), Some("upstream_failed"), Some(true)),
            (Some(200), None, Some(false)),
            // The client hung up before the answer's end: the model is up.
            (Some(200), Some("client_closed"), Some(false)),
            (Some(200), Some("egress_budget_exceeded"), Some(false)),
            (Some(400), None, None),
            (Some(404), None, None),
            (None, Some("egress_endpoint_refused"), None),
        ] {
            assert_eq!(
                model_failed(&outcome(status, code)),
                want,
                "{status:?} {code:?}"
            );
        }
    }
}
