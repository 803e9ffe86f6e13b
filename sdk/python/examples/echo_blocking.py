#!/usr/bin/env python3
"""The echo plugin written as a plain function: the blocking variant of the
SDK (``run`` is not ``async``; the host's calls block). Same payload as
``echo.py``; ``parallel`` calls run on a thread pool."""

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    import sharedos_plugin  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sharedos_plugin import (Complete, Escalate, Fail, ProtocolError, RuntimeEvent,
                             RuntimeManifest, ToolCall, serve)


class Echo:
    # It keeps nothing between turns, so a host with session affinity may
    # give it the next turn of a session in the same process.
    many_turns = True

    def manifest(self):
        return RuntimeManifest("sharedos-echo-python", "0.1.0")

    def run(self, request, host, abort):
        payload = request["message"]["payload"]
        payload = payload if isinstance(payload, dict) else {}
        if payload.get("noise"):
            print("a stray print: the SDK routes it to stderr")
            print("noise on stderr " * 64, file=sys.stderr)
        calls = payload.get("calls") or []
        trace = request["context"]["traceId"]

        def one(i, entry):
            if host.draining.is_raised() or abort.is_raised():
                return None
            call = ToolCall(f"call-{i}", entry.get("tool", ""), entry.get("arguments") or {}, trace)
            result = host.invoke_tool(call, step=i)
            host.emit(RuntimeEvent("progress", {"done": i + 1, "total": len(calls)}))
            return result.to_json()

        if payload.get("parallel") and calls:
            with ThreadPoolExecutor(max_workers=min(64, len(calls))) as pool:
                results = list(pool.map(lambda a: one(*a), enumerate(calls)))
        else:
            results = [one(i, c) for i, c in enumerate(calls)]
        results = [r for r in results if r is not None]
        host.annotate("echo.calls", len(results))
        kind = payload.get("outcome", "complete")
        if kind == "fail":
            return Fail(ProtocolError("echo_requested_failure", "The request asked to fail.", False))
        if kind == "escalate":
            return Escalate("The request asked for a human.")
        return Complete({"results": results})


if __name__ == "__main__":
    sys.exit(serve(Echo()))
