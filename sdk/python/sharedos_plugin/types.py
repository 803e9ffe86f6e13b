"""Typed values of the sharedos protocol v1, as plain dataclasses.

Each class names the ``$defs`` entry of
``schema/sharedos-protocol-v1.schema.json`` it mirrors (``SCHEMA_DEF``) and
lists its wire fields in ``WIRE`` as ``(python_name, wire_name, required)``.
``tests/test_schema.py`` compares both with the schema, so a field added to
the protocol and not here fails the tests instead of being dropped silently.

Large request shapes (``RuntimeTurnRequest`` and what it contains) stay plain
``dict``s: the host has already checked them, and a plugin reads only the
few members it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union

PROTOCOL_VERSION = 1
CONTRACT_VERSION = "1"

Wire = Tuple[Tuple[str, str, bool], ...]


def now() -> str:
    """An RFC 3339 timestamp with an offset, as the protocol requires."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _dump(obj: Any, wire: Wire) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for py, name, required in wire:
        value = getattr(obj, py)
        if value is None and not required:
            continue
        out[name] = value.to_json() if hasattr(value, "to_json") else value
    return out


def _check_text(value: Any, what: str, max_len: int = 256) -> str:
    if not isinstance(value, str) or not (1 <= len(value.strip()) <= max_len):
        raise ValueError(f"{what} must be a string of 1..{max_len} characters after trimming")
    return value


@dataclass
class RuntimeManifest:
    """The plugin's identity; must equal the host's registry entry."""

    SCHEMA_DEF = "RuntimeManifest"
    WIRE: ClassVar[Wire] = (("id", "id", True), ("version", "version", True),
                  ("protocol_version", "protocolVersion", True), ("metadata", "metadata", False))
    id: str
    version: str
    protocol_version: str = CONTRACT_VERSION
    metadata: Optional[Dict[str, Any]] = None

    def to_json(self) -> Dict[str, Any]:
        _check_text(self.id, "manifest.id")
        _check_text(self.version, "manifest.version")
        return _dump(self, self.WIRE)


@dataclass
class RuntimeLimits:
    """The turn's limits, from ``turn/run``."""

    SCHEMA_DEF = "RuntimeLimits"
    WIRE: ClassVar[Wire] = (("max_steps", "maxSteps", True), ("max_tool_calls", "maxToolCalls", True),
                  ("timeout_ms", "timeoutMs", True), ("drain_grace_ms", "drainGraceMs", False),
                  ("drain_at_ms", "drainAtMs", False))
    max_steps: int
    max_tool_calls: int
    #: The deadline, in ms from the start of the turn.
    timeout_ms: int
    #: The host's drain grace (``turn/draining`` comes this long before the
    #: deadline); None when the host has none.
    drain_grace_ms: Optional[int] = None
    #: When the drain starts, in ms from the start of the turn; None with no grace.
    drain_at_ms: Optional[int] = None

    @classmethod
    def from_json(cls, v: Dict[str, Any]) -> "RuntimeLimits":
        def opt(key: str) -> Optional[int]:
            return None if v.get(key) is None else int(v[key])
        return cls(int(v["maxSteps"]), int(v["maxToolCalls"]), int(v["timeoutMs"]),
                   opt("drainGraceMs"), opt("drainAtMs"))


@dataclass
class ProtocolError:
    """An error value carried in results and outcomes."""

    SCHEMA_DEF = "ProtocolError"
    WIRE: ClassVar[Wire] = (("code", "code", True), ("message", "message", True),
                  ("retryable", "retryable", False), ("details", "details", False))
    code: str
    message: str
    retryable: Optional[bool] = None
    details: Optional[Dict[str, Any]] = None

    def to_json(self) -> Dict[str, Any]:
        _check_text(self.code, "error.code")
        _check_text(self.message, "error.message", 4096)
        return _dump(self, self.WIRE)

    @classmethod
    def from_json(cls, v: Dict[str, Any]) -> "ProtocolError":
        return cls(v["code"], v["message"], v.get("retryable"), v.get("details"))


@dataclass
class ToolCall:
    """A tool call as the runtime asks for it. ``trace_id`` must be the
    turn's (``request["context"]["traceId"]``), or the call is refused."""

    SCHEMA_DEF = "ToolCall"
    WIRE: ClassVar[Wire] = (("id", "id", True), ("tool", "tool", True), ("arguments", "arguments", True),
                  ("trace_id", "traceId", True), ("requested_at", "requestedAt", True))
    id: str
    tool: str
    arguments: Dict[str, Any]
    trace_id: str
    requested_at: str = field(default_factory=now)

    def to_json(self) -> Dict[str, Any]:
        _check_text(self.id, "call.id")
        _check_text(self.tool, "call.tool")
        _check_text(self.trace_id, "call.traceId")
        if not isinstance(self.arguments, dict):
            raise ValueError("call.arguments must be an object")
        return _dump(self, self.WIRE)


@dataclass
class ToolResult:
    """The answer to a tool call: ``succeeded`` (with ``output``), ``denied``
    or ``failed`` (with ``error``). Refusals are values, not exceptions."""

    SCHEMA_DEF = "ToolResult"
    WIRE: ClassVar[Wire] = (("status", "status", True), ("call_id", "callId", True), ("tool", "tool", True),
                  ("completed_at", "completedAt", True), ("output", "output", False),
                  ("error", "error", False), ("metadata", "metadata", False))
    status: str
    call_id: str
    tool: str
    completed_at: str
    output: Any = None
    error: Optional[ProtocolError] = None
    metadata: Optional[Dict[str, Any]] = None

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def to_json(self) -> Dict[str, Any]:
        out = _dump(self, self.WIRE)
        if self.status == "succeeded":
            out["output"] = self.output
        return out

    @classmethod
    def from_json(cls, v: Dict[str, Any]) -> "ToolResult":
        if v.get("status") not in ("succeeded", "denied", "failed"):
            raise ValueError(f"unknown tool result status {v.get('status')!r}")
        err = v.get("error")
        return cls(v["status"], v["callId"], v["tool"], v["completedAt"], v.get("output"),
                   ProtocolError.from_json(err) if err else None, v.get("metadata"))


@dataclass
class RuntimeEvent:
    """Something that happened, as the plugin states it (``emit``)."""

    SCHEMA_DEF = "RuntimeEvent"
    WIRE: ClassVar[Wire] = (("type", "type", True), ("data", "data", True))
    type: str
    data: Any

    def to_json(self) -> Dict[str, Any]:
        _check_text(self.type, "event.type")
        return {"type": self.type, "data": self.data}


@dataclass
class Complete:
    """Outcome: the turn succeeded with ``output`` (any JSON, ``None`` too)."""

    SCHEMA_DEF = "RuntimeTurnOutcome/complete"
    WIRE: ClassVar[Wire] = (("type", "type", True), ("output", "output", True), ("metadata", "metadata", False))
    output: Any
    metadata: Optional[Dict[str, Any]] = None
    type: str = "complete"

    def to_json(self) -> Dict[str, Any]:
        return _dump(self, self.WIRE)


@dataclass
class Fail:
    """Outcome: the turn failed with a ``ProtocolError``."""

    SCHEMA_DEF = "RuntimeTurnOutcome/fail"
    WIRE: ClassVar[Wire] = (("type", "type", True), ("error", "error", True), ("metadata", "metadata", False))
    error: ProtocolError
    metadata: Optional[Dict[str, Any]] = None
    type: str = "fail"

    def to_json(self) -> Dict[str, Any]:
        return _dump(self, self.WIRE)


@dataclass
class Escalate:
    """Outcome: a human is needed (``reason``, 1..512 characters)."""

    SCHEMA_DEF = "RuntimeTurnOutcome/escalate"
    WIRE: ClassVar[Wire] = (("type", "type", True), ("reason", "reason", True), ("metadata", "metadata", False))
    reason: str
    metadata: Optional[Dict[str, Any]] = None
    type: str = "escalate"

    def to_json(self) -> Dict[str, Any]:
        _check_text(self.reason, "reason", 512)
        return _dump(self, self.WIRE)


Outcome = Union[Complete, Fail, Escalate]

#: Every typed class, for the schema test.
TYPED: List[type] = [RuntimeManifest, RuntimeLimits, ProtocolError, ToolCall, ToolResult,
                     RuntimeEvent, Complete, Fail, Escalate]

#: Annotation keys the host refuses.
REFUSED_ANNOTATION_KEYS = ("", "runtime", "__proto__")

#: JSON-RPC error codes and their ``data.kind`` (docs/PROTOCOL.md, section 6).
ERROR_CODES: Dict[str, int] = {
    "invalid_request": -32600, "method_not_found": -32601, "invalid_params": -32602,
    "internal": -32603, "audit_unavailable": -32603, "cancelled": -32800,
    "unsupported_protocol_version": -32050, "not_initialized": -32051,
    "turn_not_active": -32052, "overloaded": -32055, "message_too_large": -32057,
}
