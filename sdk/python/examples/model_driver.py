#!/usr/bin/env python3
"""A model-driven plugin: the standard loop around a driver that asks an
OpenAI-compatible chat-completions endpoint what to do next.

Configuration (environment): ``SHAREDOS_MODEL_URL`` (a base URL; the driver
POSTs to ``<url>/chat/completions``), ``SHAREDOS_MODEL_KEY`` (sent as a
bearer token, optional) and ``SHAREDOS_MODEL_NAME`` (default ``default``).
The sandbox has no network: until the host's gateway route exists, the URL
must be reachable from inside the plugin (see docs/PLUGINS.md).
"""

import asyncio
import json
import os
import sys
import urllib.request
from pathlib import Path

try:
    import sharedos_plugin  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sharedos_plugin import (AgentTurnDriver, AgentTurnSession, CallTool, Complete,
                             RuntimeManifest, StandardRuntime, ToolCall, serve)


def _function_name(tool_name):
    # Chat APIs allow [A-Za-z0-9_-] in function names; sharedos tools use dots.
    return tool_name.replace(".", "__")


class ChatSession(AgentTurnSession):
    def __init__(self, request, url, key, model):
        self.url, self.key, self.model = url.rstrip("/"), key, model
        self.trace = request["context"]["traceId"]
        self.names = {_function_name(t["name"]): t["name"] for t in request.get("tools", [])}
        self.tools = [{"type": "function", "function": {
            "name": _function_name(t["name"]), "description": t["description"],
            "parameters": t["inputSchema"]}} for t in request.get("tools", [])]
        payload = request["message"]["payload"]
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self.messages = [{"role": "user", "content": text}]
        self.calls = 0
        self.queued = []  # tool calls of the last answer not yet made

    def _post(self):
        body = {"model": self.model, "messages": self.messages}
        if self.tools:
            body["tools"] = self.tools
        req = urllib.request.Request(self.url + "/chat/completions",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
        if self.key:
            req.add_header("authorization", f"Bearer {self.key}")
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)

    async def next(self, input, signal):
        if input is not None:
            self.messages.append({"role": "tool", "tool_call_id": input.call_id,
                                  "content": json.dumps(input.to_json())})
        if not self.queued:
            answer = await asyncio.get_running_loop().run_in_executor(None, self._post)
            message = answer["choices"][0]["message"]
            self.messages.append(message)
            self.queued = list(message.get("tool_calls") or [])
            if not self.queued:
                return Complete({"text": message.get("content") or ""})
        # One call per step: the loop hands its result back to `next`.
        tc = self.queued.pop(0)
        self.calls += 1
        fn = tc["function"]
        tool = self.names.get(fn["name"], fn["name"])
        args = json.loads(fn.get("arguments") or "{}")
        return CallTool(ToolCall(tc.get("id") or f"call-{self.calls}", tool, args, self.trace))


class ChatDriver(AgentTurnDriver):
    def manifest(self):
        return RuntimeManifest("sharedos-model-python", "0.1.0")

    def open(self, request, signal):
        url = os.environ.get("SHAREDOS_MODEL_URL")
        if not url:
            raise RuntimeError("SHAREDOS_MODEL_URL is not set")
        return ChatSession(request, url, os.environ.get("SHAREDOS_MODEL_KEY", ""),
                           os.environ.get("SHAREDOS_MODEL_NAME", "default"))


if __name__ == "__main__":
    sys.exit(serve(StandardRuntime(ChatDriver())))
