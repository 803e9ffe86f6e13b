"""sharedos-plugin: write a sharedos runtime plugin in Python (3.9+,
standard library only). See docs/PROTOCOL.md and docs/PLUGINS.md.

    from sharedos_plugin import serve, RuntimeManifest, Complete

    class Hello:
        def manifest(self):
            return RuntimeManifest("hello", "1.0.0")

        def run(self, request, host, abort):
            host.emit(RuntimeEvent("greeting", {"text": "hello"}))
            return Complete({"said": "hello"})

    raise SystemExit(serve(Hello()))
"""

from .connection import HostCallError, Signal
from .host import AsyncHost, BlockingHost
from .serve import NOT_A_TERMINAL_PROGRAM, PLUGIN_ENV, serve, started_by_host
from .standard import AgentTurnDriver, AgentTurnSession, CallTool, InvalidDecision, StandardRuntime
from .types import (Complete, Escalate, Fail, ProtocolError, RuntimeEvent, RuntimeLimits,
                    RuntimeManifest, ToolCall, ToolResult, now)

__all__ = [
    "AgentTurnDriver", "AgentTurnSession", "AsyncHost", "BlockingHost", "CallTool", "Complete",
    "Escalate", "Fail", "HostCallError", "InvalidDecision", "NOT_A_TERMINAL_PROGRAM",
    "PLUGIN_ENV", "ProtocolError", "RuntimeEvent", "RuntimeLimits", "RuntimeManifest", "Signal",
    "StandardRuntime", "ToolCall", "ToolResult", "now", "serve", "started_by_host",
]
__version__ = "0.1.0"
