#!/usr/bin/env python3
"""sharedos echo plugin (asyncio), the template for Python plugin authors.

For each entry of ``request.message.payload.calls``
(``[{"tool": "...", "arguments": {...}}]``) it calls the tool (all at once
when ``payload.parallel`` is true), emits a ``progress`` event after each
call, annotates how many calls it made, and completes with the results.
``payload.outcome`` set to ``fail`` or ``escalate`` ends the turn that way
instead; ``payload.noise`` prints to stdout and stderr (both land in the
host's log). This is the payload ``sharedos conformance`` drives; the Rust
and TypeScript echo plugins read it the same way.
"""

import asyncio
import sys
from pathlib import Path

try:
    import sharedos_plugin  # noqa: F401 - installed with pip
except ImportError:  # run from a checkout: the SDK is next to this directory
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sharedos_plugin import (Complete, Escalate, Fail, ProtocolError, RuntimeEvent,
                             RuntimeManifest, ToolCall, serve)


class Echo:
    # It keeps nothing between turns, so a host with session affinity may
    # give it the next turn of a session in the same process.
    many_turns = True

    def manifest(self):
        return RuntimeManifest("sharedos-echo-python", "0.1.0")

    async def run(self, request, host, abort):
        payload = request["message"]["payload"]
        payload = payload if isinstance(payload, dict) else {}
        if payload.get("noise"):
            print("a stray print: the SDK routes it to stderr")
            print("noise on stderr " * 64, file=sys.stderr)
        calls = payload.get("calls") or []
        trace = request["context"]["traceId"]
        done = []

        async def one(i, entry):
            # Start no new work once the host drains or aborts the turn.
            if host.draining.is_raised() or abort.is_raised():
                return None
            call = ToolCall(f"call-{i}", entry.get("tool", ""), entry.get("arguments") or {}, trace)
            result = await host.invoke_tool(call, step=i)
            done.append(i)
            host.emit(RuntimeEvent("progress", {"done": len(done), "total": len(calls)}))
            return result.to_json()

        if payload.get("parallel"):
            results = await asyncio.gather(*(one(i, c) for i, c in enumerate(calls)))
        else:
            results = [await one(i, c) for i, c in enumerate(calls)]
        results = [r for r in results if r is not None]
        # Annotations land in the result's metadata on every ending.
        host.annotate("echo.calls", len(results))
        kind = payload.get("outcome", "complete")
        if kind == "fail":
            return Fail(ProtocolError("echo_requested_failure", "The request asked to fail.", False))
        if kind == "escalate":
            return Escalate("The request asked for a human.")
        return Complete({"results": results})


if __name__ == "__main__":
    sys.exit(serve(Echo()))
