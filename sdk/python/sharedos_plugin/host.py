"""The host a plugin is handed: exactly five members (``limits``,
``invoke_tool``, ``emit``, ``annotate``, ``draining``), plus the abort
signal passed to ``run``. ``BlockingHost`` for plain functions,
``AsyncHost`` for asyncio code; both check locally what the host would
drop silently (docs/PROTOCOL.md, section 4.4).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Dict, Optional

from .connection import Connection, HostCallError, Signal, Turn, _RemoteError
from .types import REFUSED_ANNOTATION_KEYS, RuntimeEvent, RuntimeLimits, ToolCall, ToolResult


class _HostBase:
    def __init__(self, conn: Connection, turn: Turn) -> None:
        self._conn = conn
        self._turn = turn

    @property
    def limits(self) -> RuntimeLimits:
        """The turn's step, tool-call and deadline limits."""
        return self._turn.limits

    @property
    def draining(self) -> Signal:
        """Raised by ``turn/draining``: start no new work, answer soon."""
        return self._turn.draining

    def _check_open(self) -> None:
        if self._turn.abort.is_raised() or self._turn.closed:
            raise HostCallError("turn_not_active", "Runtime host is closed")

    def _call_params(self, call: ToolCall, step: Optional[int]) -> Dict[str, Any]:
        self._check_open()
        try:
            params: Dict[str, Any] = {"turnId": self._turn.turn_id, "call": call.to_json()}
        except ValueError as e:
            raise HostCallError("invalid_params", str(e)) from None
        if step is not None:
            if not isinstance(step, int) or step < 0:
                raise HostCallError("invalid_params", "step must be an integer >= 0")
            params["step"] = step
        return params

    def emit(self, event: RuntimeEvent) -> None:
        """Records an event (a notification: no answer)."""
        self._check_open()
        try:
            body = event.to_json()
        except ValueError as e:
            raise HostCallError("invalid_params", str(e)) from None
        self._conn.notify("host/emit", {"turnId": self._turn.turn_id, "event": body})

    def annotate(self, key: str, value: Any) -> None:
        """States ``key = value`` for the result's metadata (last one wins)."""
        self._check_open()
        if not isinstance(key, str) or key in REFUSED_ANNOTATION_KEYS:
            raise HostCallError("invalid_params",
                                "annotation keys must not be empty, 'runtime' or '__proto__'")
        self._conn.notify("host/annotate",
                          {"turnId": self._turn.turn_id, "key": key, "value": value})


def _result(raw: Any) -> ToolResult:
    try:
        return ToolResult.from_json(raw)
    except (KeyError, TypeError, ValueError):
        raise HostCallError("internal", "the host returned an invalid tool result") from None


def _retry_after(e: HostCallError) -> Optional[float]:
    if e.kind == "overloaded" and isinstance(e, _RemoteError):
        return max(1, int(e.data.get("retryAfterMs", 100))) / 1000.0
    return None


class BlockingHost(_HostBase):
    """For plugins written as plain functions; safe to use from threads."""

    def invoke_tool(self, call: ToolCall, step: Optional[int] = None) -> ToolResult:
        """Asks the host to run a tool; blocks until its ``ToolResult``."""
        params = self._call_params(call, step)
        while True:
            fut = self._conn.request("host/invokeTool", params)
            try:
                return _result(fut.result())
            except HostCallError as e:
                wait = _retry_after(e)
                if wait is None or self._turn.abort.wait(wait):
                    raise
                self._check_open()


class AsyncHost(_HostBase):
    """For asyncio plugins: ``invoke_tool`` is a coroutine."""

    async def invoke_tool(self, call: ToolCall, step: Optional[int] = None) -> ToolResult:
        """Asks the host to run a tool; resolves to its ``ToolResult``.
        Several calls may be in flight at once (``asyncio.gather``)."""
        params = self._call_params(call, step)
        while True:
            fut = self._conn.request("host/invokeTool", params)
            try:
                return _result(await asyncio.wrap_future(fut))
            except asyncio.CancelledError:
                self._conn.forget(fut)
                raise
            except HostCallError as e:
                wait = _retry_after(e)
                if wait is None:
                    raise
                await asyncio.sleep(wait)
                self._check_open()


def outcome_json(outcome: Any) -> Dict[str, Any]:
    """The wire form of an outcome, checked before it is sent."""
    if not hasattr(outcome, "to_json") or getattr(outcome, "type", None) not in (
            "complete", "fail", "escalate"):
        raise TypeError("run() must return Complete, Fail or Escalate")
    body = outcome.to_json()
    json.dumps(body, allow_nan=False)
    return body


def monotonic_deadline(limits: RuntimeLimits) -> float:
    """When the turn's deadline passes, on ``time.monotonic()``'s clock."""
    return time.monotonic() + limits.timeout_ms / 1000.0
