"""The wire: one JSON-RPC 2.0 object per line on stdin/stdout.

One reader thread reads the host's lines and dispatches them; writes go
through one lock. The turn itself runs elsewhere (a thread for the blocking
front end, the asyncio loop for the async one): see ``serve.py``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, Optional

from .types import ERROR_CODES, PROTOCOL_VERSION, RuntimeLimits

SDK_NAME = "sharedos-python/0.1.0"
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


class HostCallError(Exception):
    """A host call the host (or the SDK, checking locally first) refused.

    ``kind`` is the stable contract (``turn_not_active``, ``cancelled``,
    ``invalid_params``, ``message_too_large``, ...). Tool refusals are not
    errors: they are ``ToolResult`` values with status ``denied``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class Signal:
    """A one-way flag (draining, abort) usable from threads and asyncio."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list = []

    def is_raised(self) -> bool:
        return self._event.is_set()

    def raise_(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()

    def on_raise(self, cb: Callable[[], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(cb)
                return
        cb()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until raised (or the timeout); returns whether it was."""
        return self._event.wait(timeout)

    async def raised(self) -> None:
        """Awaits the signal in asyncio code."""
        import asyncio

        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))

        self.on_raise(wake)
        await fut


def encode(message: Dict[str, Any]) -> bytes:
    """Compact JSON, no NaN/Infinity (the host cannot parse them)."""
    try:
        text = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8") + b"\n"
    except (ValueError, TypeError, UnicodeEncodeError) as e:
        raise HostCallError("invalid_params", f"the message is not valid JSON: {e}") from None


def wire_error(kind: str, message: str, **data: Any) -> Dict[str, Any]:
    return {"code": ERROR_CODES[kind], "message": message, "data": dict(kind=kind, **data)}


class Turn:
    """The state of the one turn of this process."""

    def __init__(self, turn_id: str, limits: RuntimeLimits) -> None:
        self.turn_id = turn_id
        self.limits = limits
        self.draining = Signal()
        self.abort = Signal()
        self.closed = False


class Connection:
    """Reads and writes the protocol; ``start_turn`` runs the plugin's turn."""

    def __init__(self, manifest: Dict[str, Any], rfd: int, wfd: int,
                 start_turn: Callable[["Connection", Turn, Dict[str, Any], Any], None],
                 many_turns: bool = False) -> None:
        self.manifest = manifest
        # The plugin may serve several turns (docs/PROTOCOL.md section 4.6);
        # ``many`` once the host offered it too.
        self.many_turns = many_turns
        self.many = False
        self._rfile = os.fdopen(rfd, "rb", buffering=65536)
        self._wfd = wfd
        self._wlock = threading.Lock()
        self._plock = threading.Lock()
        self._pending: Dict[int, Future] = {}
        self._next_id = 1
        self.max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES
        self.max_inflight = 8
        self.initialized = False
        self.turn: Optional[Turn] = None
        self._start_turn = start_turn

    # -- writing ---------------------------------------------------------
    def send(self, message: Dict[str, Any]) -> None:
        line = encode(message)
        if len(line) - 1 > self.max_message_bytes:
            raise HostCallError("message_too_large",
                                f"the message exceeds maxMessageBytes ({self.max_message_bytes})")
        with self._wlock:
            view = memoryview(line)
            while view:
                written = os.write(self._wfd, view)
                view = view[written:]

    def respond(self, rid: Any, result: Any) -> None:
        try:
            self.send({"jsonrpc": "2.0", "id": rid, "result": result})
        except HostCallError as e:
            self.respond_error(rid, wire_error(e.kind, e.message))

    def respond_error(self, rid: Any, error: Dict[str, Any]) -> None:
        try:
            self.send({"jsonrpc": "2.0", "id": rid, "error": error})
        except (HostCallError, OSError):
            pass

    def request(self, method: str, params: Dict[str, Any]) -> "Future[Any]":
        fut: Future = Future()
        with self._plock:
            rid = self._next_id
            self._next_id += 1
            self._pending[rid] = fut
        try:
            self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        except BaseException:
            with self._plock:
                self._pending.pop(rid, None)
            raise
        return fut

    def forget(self, fut: "Future[Any]") -> None:
        with self._plock:
            for k, v in list(self._pending.items()):
                if v is fut:
                    del self._pending[k]

    def notify(self, method: str, params: Dict[str, Any]) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def cancel_pending(self) -> None:
        with self._plock:
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(HostCallError("cancelled", "the turn was aborted"))

    # -- reading ---------------------------------------------------------
    def read_until_eof(self) -> None:
        """Dispatches every line until the host closes stdin."""
        for raw in self._rfile:
            line = raw.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                print(f"sharedos plugin: the host sent a line that is not JSON", file=sys.stderr)
                break
            if isinstance(msg, dict):
                self._dispatch(msg)
        if self.turn is not None:
            self.turn.draining.raise_()
            self.turn.abort.raise_()
        self.cancel_pending()

    def _dispatch(self, msg: Dict[str, Any]) -> None:
        method = msg.get("method")
        params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
        if method is None:
            self._on_response(msg)
        elif "id" in msg:
            self._on_request(msg["id"], method, params)
        else:
            self._on_notification(method, params)

    def _on_response(self, msg: Dict[str, Any]) -> None:
        with self._plock:
            fut = self._pending.pop(msg.get("id"), None) if isinstance(msg.get("id"), int) else None
        if fut is None or fut.done():
            return
        if "error" in msg:
            err = msg["error"] if isinstance(msg["error"], dict) else {}
            data = err.get("data") if isinstance(err.get("data"), dict) else {}
            fut.set_exception(_RemoteError(data.get("kind") or "internal",
                                           str(err.get("message", "")), data))
        else:
            fut.set_result(msg.get("result"))

    def _on_request(self, rid: Any, method: str, params: Dict[str, Any]) -> None:
        if method == "initialize":
            self._on_initialize(rid, params)
        elif method == "turn/run":
            if not self.initialized:
                self.respond_error(rid, wire_error("not_initialized", "initialize first"))
            elif self.turn is not None and not (self.many and self.turn.closed):
                self.respond_error(rid, wire_error("not_initialized", "a turn is already running"))
            else:
                try:
                    turn = Turn(str(params["turnId"]), RuntimeLimits.from_json(params["limits"]))
                    request = params["request"]
                    if not isinstance(request, dict):
                        raise TypeError("request")
                except (KeyError, TypeError, ValueError):
                    self.respond_error(rid, wire_error("invalid_params", "invalid turn/run params"))
                    return
                previous, self.turn = self.turn, turn
                if previous is not None:
                    # The answered turn's signals: nothing of it keeps running.
                    previous.draining.raise_()
                    previous.abort.raise_()
                    self.cancel_pending()
                self._start_turn(self, turn, request, rid)
        else:
            self.respond_error(rid, wire_error("method_not_found", "method not found"))

    def _on_initialize(self, rid: Any, params: Dict[str, Any]) -> None:
        offered = params.get("protocolVersions")
        if not isinstance(offered, list) or PROTOCOL_VERSION not in offered:
            self.respond_error(rid, wire_error("unsupported_protocol_version",
                                               "no common protocol version",
                                               supported=[PROTOCOL_VERSION]))
            return
        limits = params.get("limits") if isinstance(params.get("limits"), dict) else {}
        if isinstance(limits.get("maxMessageBytes"), int):
            self.max_message_bytes = limits["maxMessageBytes"]
        if isinstance(limits.get("maxInflightToolCalls"), int):
            self.max_inflight = max(1, limits["maxInflightToolCalls"])
        self.initialized = True
        offered = params.get("capabilities") if isinstance(params.get("capabilities"), dict) else {}
        self.many = self.many_turns and offered.get("turns") == "many"
        caps = {"turns": "many"} if self.many_turns else {}
        self.respond(rid, {"protocolVersion": PROTOCOL_VERSION, "manifest": self.manifest,
                           "sdk": SDK_NAME, "capabilities": caps})

    def _on_notification(self, method: str, params: Dict[str, Any]) -> None:
        turn = self.turn
        if turn is None or params.get("turnId") != turn.turn_id:
            return
        if method == "turn/draining":
            turn.draining.raise_()
        elif method == "turn/abort":
            turn.draining.raise_()
            turn.abort.raise_()
            self.cancel_pending()


class _RemoteError(HostCallError):
    def __init__(self, kind: str, message: str, data: Dict[str, Any]) -> None:
        super().__init__(kind, message)
        self.data = data
