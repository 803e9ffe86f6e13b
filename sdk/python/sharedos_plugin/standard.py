"""The standard loop: a bounded agent loop around a driver (a model).

A driver opens one session per turn; the session decides, one step at a
time, what to do next: call a tool, complete, fail or escalate. The loop
forwards each tool call to the host, stops at ``limits.max_steps``, starts
no new step while draining, and turns a driver's exception into the
``driver_failed`` outcome. Driver methods may be plain or ``async``.
Mirrors ``plugin-sdk/src/standard.rs``.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from .connection import Signal
from .host import AsyncHost
from .types import Complete, Escalate, Fail, ProtocolError, RuntimeManifest, ToolCall, ToolResult


@dataclass
class CallTool:
    """Decision: call ``call`` (at ``step``, default the loop's position)."""

    call: ToolCall
    step: Optional[int] = None


Decision = Union[CallTool, Complete, Fail, Escalate]


class InvalidDecision(Exception):
    """A driver's decision that does not match the contract."""


class AgentTurnSession:
    """One turn's conversation with the model. ``input`` is ``None`` at the
    start, then the ``ToolResult`` of the previous call."""

    def next(self, input: Optional[ToolResult], signal: Signal) -> Decision:  # pragma: no cover
        raise NotImplementedError

    def close(self, outcome: str) -> None:
        """Told how the turn ended (succeeded, failed, escalated, cancelled)."""


class AgentTurnDriver:
    """The model seam: opens a session per turn."""

    def manifest(self) -> Optional[RuntimeManifest]:
        return None

    def open(self, request: Dict[str, Any], signal: Signal) -> AgentTurnSession:  # pragma: no cover
        raise NotImplementedError


async def _call(fn: Any, *args: Any) -> Any:
    value = fn(*args)
    if inspect.isawaitable(value):
        value = await value
    return value


class _Cancelled(Exception):
    pass


class StandardRuntime:
    """The plugin built around ``driver``: hand it to ``serve``."""

    def __init__(self, driver: AgentTurnDriver, close_timeout: float = 1.0) -> None:
        self.driver = driver
        self.close_timeout = close_timeout

    def manifest(self) -> RuntimeManifest:
        return self.driver.manifest() or RuntimeManifest(
            "sharedos.standard", "0.1.0",
            metadata={"package": "sharedos-plugin", "executionModel": "bounded-driver-loop"})

    async def run(self, request: Dict[str, Any], host: AsyncHost, abort: Signal) -> Any:
        session = None
        try:
            session = await _call(self.driver.open, request, abort)
            outcome, ended = await self._drive(session, host, abort)
        except (_Cancelled, asyncio.CancelledError):
            await self._close(session, "cancelled")
            raise RuntimeError("the turn was cancelled") from None
        except InvalidDecision:
            outcome, ended = _fail("invalid_driver_decision",
                                   "The agent turn driver returned an invalid decision."), "failed"
        except Exception as e:  # noqa: BLE001 - a driver failure is an outcome
            if abort.is_raised() or host.draining.is_raised():
                await self._close(session, "cancelled")
                raise RuntimeError("the turn was cancelled") from None
            print(f"sharedos standard loop: the driver failed: {e!r}", file=sys.stderr)
            outcome, ended = _fail("driver_failed", "The agent turn driver failed.", True), "failed"
        await self._close(session, ended)
        return outcome

    async def _drive(self, session: Any, host: AsyncHost, abort: Signal) -> Any:
        result: Optional[ToolResult] = None
        for step in range(host.limits.max_steps):
            if host.draining.is_raised() or abort.is_raised():
                raise _Cancelled()
            decision = await _call(session.next, result, abort)
            if isinstance(decision, (Complete, Fail)):
                return decision, "succeeded" if isinstance(decision, Complete) else "failed"
            if isinstance(decision, Escalate):
                host.annotate("escalationAsked",
                              {"tool": "sharedos.escalate", "reason": decision.reason})
                return decision, "escalated"
            if not isinstance(decision, CallTool):
                raise InvalidDecision(type(decision).__name__)
            if decision.step is not None and decision.step < step:
                return _fail("invalid_driver_decision",
                             "The agent turn driver declared a step behind the loop's own "
                             "position."), "failed"
            target = step if decision.step is None else decision.step
            result = await host.invoke_tool(decision.call, target)
            if host.draining.is_raised():
                raise _Cancelled()
        return _fail("step_limit_exceeded",
                     "The agent turn reached its maximum number of steps."), "failed"

    async def _close(self, session: Any, outcome: str) -> None:
        if session is None:
            return
        try:
            await asyncio.wait_for(_call(session.close, outcome), self.close_timeout)
        except Exception:  # noqa: BLE001 - close changes nothing about the turn
            pass


def _fail(code: str, message: str, retryable: bool = False) -> Fail:
    return Fail(ProtocolError(code, message, retryable))
