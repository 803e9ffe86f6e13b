//! `invoke_tool` in the check order of envelope.md C.1 (docs/KERNEL.md,
//! "the check order"): one function per step, each returning
//! `Result<_, Refusal>`, and one answer at the end (step 14), which is the
//! only place a call's `tool.invoked` is written.

use std::borrow::Cow;
use std::sync::Arc;

use sharedos_protocol::{AccessContext, CapabilityRequirement, ResourceRef, ToolCall, ToolResult};
use tokio_util::sync::CancellationToken;

use super::open::OpenTurn;
use super::records::{
    CallFacts, Checked, checked_entry, invoked_entry, resource_of, result_outcome,
};
use super::refusal::Refusal;
use super::{
    NOT_GRANTED_MESSAGE, TOOL_UNAVAILABLE_MESSAGE, declared_requirement, guarded, requirement_of,
    run,
};
use crate::audit::{AuditOutcome, RecordId, RecordIdentity};
use crate::grant::{Decision, DenyReason, Grant, Requirement, authorize, discover};
use crate::port::{AuditEffect, KernelError};
use crate::registry::RegisteredTool;

/// One call going through the checks.
struct Checks<'a> {
    turn: &'a OpenTurn,
    context: &'a AccessContext,
    call: &'a ToolCall,
    /// The identity fields of the call's records (the turn's, shared).
    identity: Cow<'a, RecordIdentity>,
    facts: CallFacts<'a>,
}

pub(super) async fn invoke_tool(
    turn: &OpenTurn,
    context: &AccessContext,
    call: &ToolCall,
    abort: CancellationToken,
) -> Result<ToolResult, KernelError> {
    // 1. Stopped before the port was entered: nothing written.
    if abort.is_cancelled() {
        return Err(KernelError::Aborted);
    }
    // The turn's opening records are durable before any of its calls.
    turn.opened().await?;
    let mut checks = Checks {
        turn,
        context,
        call,
        identity: turn.identity(context),
        facts: CallFacts::default(),
    };
    let answer = checks.pipeline(abort).await;
    checks.finish(answer).await
}

impl<'a> Checks<'a> {
    async fn pipeline(&mut self, abort: CancellationToken) -> Result<ToolResult, Refusal> {
        self.same_trace()?; // 2
        let grants = self.authority()?; // 3 (4: the turn's registry snapshot)
        let tool = self.registered()?; // 5
        self.enabled(tool)?; // 6
        let ceiling = self.discoverable(grants, tool).await?; // 7
        let parsed = self.arguments(tool)?; // 8
        let req = self.requirement(tool, &parsed, &ceiling)?; // 9
        self.same_owner(&req).await?; // 10
        self.within_ceiling(&req, &ceiling)?; // 11
        self.authorized(grants, tool, &req).await?; // 12
        if abort.is_cancelled() {
            return Err(Refusal::Reject(KernelError::Aborted));
        }
        let hook = self.turn.shared.recorder.hook.as_ref();
        run::handler(tool, self.context, &parsed, self.call, hook, abort).await // 13
    }

    /// Step 14, the one answer: `tool.invoked` (outcome path), then the
    /// result or the rejection.
    async fn finish(&self, answer: Result<ToolResult, Refusal>) -> Result<ToolResult, KernelError> {
        let (reply, interrupted) = match answer {
            Ok(result) => (Ok(result), None),
            Err(Refusal::Answer(result)) => (Ok(*result), None),
            Err(Refusal::Interrupted { reason, error }) => (Err(error), Some(reason)),
            Err(Refusal::Reject(error)) => return Err(error),
        };
        let (outcome, reason) = match &reply {
            Ok(result) => result_outcome(result),
            Err(_) => (AuditOutcome::Interrupted, interrupted),
        };
        let id = RecordId::new();
        let metadata = self.turn.catalog_metadata();
        let entry = invoked_entry(
            (&id, self.context, self.identity.view()),
            self.call,
            (outcome, reason),
            &self.facts,
            metadata.as_deref().map(|m| m.view()),
        );
        self.turn.shared.recorder.outcome(&entry).await;
        reply
    }

    fn denied(&self, code: &str, message: &str) -> Refusal {
        Refusal::Answer(Box::new(ToolResult::denied(
            self.call,
            code,
            message,
            self.context.now.clone(),
        )))
    }

    fn failed(&self, code: &str, message: &str) -> Refusal {
        Refusal::Answer(Box::new(ToolResult::failed(
            self.call,
            code,
            message,
            self.context.now.clone(),
        )))
    }

    /// Steps 5–7 answer alike; the audit's `cause` tells them apart.
    fn unavailable(&mut self, cause: &'static str) -> Refusal {
        self.facts.cause = Some(cause);
        self.denied("tool_unavailable", TOOL_UNAVAILABLE_MESSAGE)
    }

    /// The resource of `req` for a record: the call's own once step 9 made
    /// it (no second validation of its segments).
    fn resource(&self, req: &Requirement) -> Cow<'_, ResourceRef> {
        match &self.facts.resource {
            Some(resource) => Cow::Borrowed(resource),
            None => Cow::Owned(resource_of(req)),
        }
    }

    /// Writes a denied `authorization.checked` that consumed nothing.
    async fn record_refusal(&self, req: &Requirement, reason: DenyReason) -> Result<(), Refusal> {
        let decision = Decision::Denied {
            reason,
            grant_id: None,
        };
        self.record_decision(&self.resource(req), &req.action, &decision)
            .await
    }

    /// Writes the call's `authorization.checked` (decision path).
    async fn record_decision(
        &self,
        resource: &ResourceRef,
        action: &str,
        decision: &Decision,
    ) -> Result<(), Refusal> {
        let id = RecordId::new();
        let checked = Checked {
            resource,
            action,
            decision,
            operation_id: Some(self.call.id.as_str()),
            tool: Some(self.call.tool.as_str()),
        };
        let entry = checked_entry(&id, self.context, self.identity.view(), checked);
        let recorder = &self.turn.shared.recorder;
        Ok(recorder.decision(&entry, AuditEffect::None).await?)
    }

    /// Step 2: the call belongs to this trace (no use spent).
    fn same_trace(&self) -> Result<(), Refusal> {
        if self.call.trace_id != self.context.trace_id {
            return Err(self.denied("trace_mismatch", "The tool call belongs to another trace."));
        }
        Ok(())
    }

    /// Step 3: the turn's authority was loaded.
    fn authority(&mut self) -> Result<&'a [Grant], Refusal> {
        let turn: &'a OpenTurn = self.turn;
        match &turn.grants {
            Ok(grants) => Ok(grants.as_slice()),
            Err(cause) => {
                self.facts.cause = Some(cause);
                Err(self.denied("authority_unavailable", NOT_GRANTED_MESSAGE))
            }
        }
    }

    /// Step 5: A handler in the turn's registry.
    fn registered(&mut self) -> Result<&'a Arc<RegisteredTool>, Refusal> {
        let turn: &'a OpenTurn = self.turn;
        turn.registry
            .get(self.call.tool.as_str())
            .ok_or_else(|| self.unavailable("not_registered"))
    }

    /// Step 6: its namespace is enabled for the turn.
    fn enabled(&mut self, tool: &RegisteredTool) -> Result<(), Refusal> {
        let namespace = &tool.definition.namespace;
        if !self
            .context
            .enabled_tool_namespaces
            .iter()
            .any(|n| n == namespace)
        {
            return Err(self.unavailable("namespace_disabled"));
        }
        Ok(())
    }

    /// Step 7: discovery, non-consuming. Answers the declared requirement, the
    /// ceiling of step 11.
    async fn discoverable(
        &mut self,
        grants: &[Grant],
        tool: &'a RegisteredTool,
    ) -> Result<Cow<'a, Requirement>, Refusal> {
        let ceiling = declared_requirement(tool, self.context);
        let usage = self.turn.shared.usage.as_ref();
        if let Err(reason) = discover(grants, usage, self.context, &ceiling).await {
            self.record_refusal(&ceiling, reason).await?;
            return Err(self.unavailable(reason.code()));
        }
        Ok(ceiling)
    }

    /// Step 8: arguments: the schema (compiled once), then the handler's own
    /// parse. No authorization is attempted when they fail. What runs is
    /// the parsed call.
    fn arguments(&self, tool: &RegisteredTool) -> Result<ToolCall, Refusal> {
        let arguments = &self.call.arguments;
        let parsed = tool.check_arguments(arguments).and_then(|()| {
            guarded(|| tool.handler.parse_arguments(arguments))
                .unwrap_or_else(|| Err("the tool could not parse its arguments".into()))
        });
        match parsed {
            Ok(arguments) => Ok(ToolCall {
                id: self.call.id.clone(),
                tool: self.call.tool.clone(),
                arguments,
                trace_id: self.call.trace_id.clone(),
                requested_at: self.call.requested_at.clone(),
            }),
            Err(message) => Err(self.failed(
                "invalid_tool_arguments",
                &format!("Invalid tool arguments: {message}"),
            )),
        }
    }

    /// Step 9: the exact requirement of this call (the declared one when the
    /// handler names none: that is the ceiling step 7 already made, so it is
    /// borrowed, not made again). Its text on failure goes to the error hook.
    fn requirement<'c>(
        &mut self,
        tool: &'a RegisteredTool,
        parsed: &ToolCall,
        ceiling: &'c Requirement,
    ) -> Result<Cow<'c, Requirement>, Refusal> {
        let resolved = guarded(|| tool.handler.resolve_requirement(self.context, parsed))
            .unwrap_or_else(|| Err("resolve_requirement panicked".into()));
        let resolved: Cow<'_, CapabilityRequirement> = match resolved {
            Ok(Some(r)) => Cow::Owned(r),
            Ok(None) => Cow::Borrowed(&tool.definition.required_capability),
            Err(text) => {
                let hook = &self.turn.shared.recorder.hook;
                hook.tool_error(self.call.tool.as_str(), self.call.id.as_str(), &text);
                return Err(self.failed(
                    "tool_requirement_resolution_failed",
                    "The tool could not resolve what this call needs.",
                ));
            }
        };
        let req = if matches!(resolved, Cow::Borrowed(_)) {
            Cow::Borrowed(ceiling)
        } else {
            Cow::Owned(requirement_of(&resolved, self.context))
        };
        // Already-validated parts: no string goes through validation again.
        self.facts.resource = Some(ResourceRef {
            namespace: resolved.resource.namespace.clone(),
            path: resolved.resource.path.clone(),
            owner: Some(req.owner.clone()),
        });
        self.facts.action = Some(match &resolved {
            Cow::Borrowed(declared) => Cow::Borrowed(declared.action.as_str()),
            Cow::Owned(_) => Cow::Owned(req.action.clone()),
        });
        Ok(req)
    }

    /// Step 10: world boundary: the owner is the context's.
    async fn same_owner(&self, req: &Requirement) -> Result<(), Refusal> {
        if req.owner != self.context.owner {
            self.record_refusal(req, DenyReason::InvalidRequest).await?;
            return Err(self.denied("invalid_request", NOT_GRANTED_MESSAGE));
        }
        Ok(())
    }

    /// Step 11: ceiling: same namespace, action and owner as declared; the
    /// declared path is a segment prefix of the requested one.
    fn within_ceiling(&self, req: &Requirement, ceiling: &Requirement) -> Result<(), Refusal> {
        // The declared requirement itself (step 9 borrowed the ceiling) is
        // within it: no string is compared with itself.
        let within = std::ptr::eq(req, ceiling)
            || req.namespace == ceiling.namespace
                && req.action == ceiling.action
                && req.owner == ceiling.owner
                && ceiling.path.len() <= req.path.len()
                && ceiling.path.iter().zip(&req.path).all(|(a, b)| a == b);
        if !within {
            return Err(self.failed(
                "invalid_tool_requirement",
                "The tool asked for more than its declared capability.",
            ));
        }
        Ok(())
    }

    /// Step 12: the host's ceiling (consumes nothing), then exact
    /// re-authorization, consuming; `authorization.checked` is written
    /// before anything runs. The call's outcome record carries the same
    /// resource, action and grant.
    async fn authorized(
        &mut self,
        grants: &[Grant],
        tool: &RegisteredTool,
        req: &Requirement,
    ) -> Result<(), Refusal> {
        let shared = &self.turn.shared;
        let frozen =
            shared
                .current_policy()
                .refuses(&req.namespace, &req.path, tool.definition.read_write);
        let decision = if frozen {
            Decision::Denied {
                reason: DenyReason::HostPolicyDenied,
                grant_id: None,
            }
        } else {
            authorize(grants, shared.usage.as_ref(), self.context, req, true).await
        };
        // Step 9 named them; both records borrow them from here on.
        if self.facts.resource.is_none() {
            self.facts.resource = Some(resource_of(req));
        }
        if self.facts.action.is_none() {
            self.facts.action = Some(Cow::Owned(req.action.clone()));
        }
        let (Some(resource), Some(action)) = (&self.facts.resource, &self.facts.action) else {
            let missing = "the call's resource was not named before its decision";
            return Err(Refusal::Reject(KernelError::Failed(missing.into())));
        };
        self.record_decision(resource, action, &decision).await?;
        match decision {
            Decision::Allowed { grant_id, .. } => {
                self.facts.grant_id = Some(grant_id);
                Ok(())
            }
            Decision::Denied { reason, grant_id } => {
                self.facts.grant_id = grant_id;
                Err(self.denied(reason.code(), NOT_GRANTED_MESSAGE))
            }
        }
    }
}
