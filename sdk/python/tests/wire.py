"""A host side for the tests: starts a plugin as a real child process on
real pipes and speaks the protocol to it line by line."""

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def turn_request(payload, tools=None):
    return {"version": "1", "executionId": "exec-1",
            "agent": {"kind": "agent", "agentId": "a1"},
            "context": {"traceId": "trace-1"},
            "message": {"payload": payload}, "tools": tools or []}


class Plugin:
    def __init__(self, script, env=None):
        full_env = {"PATH": os.environ.get("PATH", ""), "SHAREDOS_PLUGIN": "1"}
        full_env.update(env or {})
        self.proc = subprocess.Popen([sys.executable, str(EXAMPLES / script)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=full_env)
        self.lines = queue.Queue()
        self.stdout_raw = []
        self._out_reader = threading.Thread(target=self._read, daemon=True)
        self._out_reader.start()
        self.stderr = b""
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            self.stdout_raw.append(raw)
            self.lines.put(json.loads(raw))
        self.lines.put(None)

    def _read_err(self):
        self.stderr = self.proc.stderr.read()

    def send(self, msg):
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout=10):
        msg = self.lines.get(timeout=timeout)
        assert msg is not None, "the plugin closed its stdout"
        return msg

    def initialize(self, versions=(1,), max_bytes=8 * 1024 * 1024, capabilities=None):
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersions": list(versions), "host": {"name": "test", "version": "0"},
            "limits": {"maxMessageBytes": max_bytes, "maxInflightToolCalls": 64,
                       "maxConcurrentTurns": 1}, "capabilities": capabilities or {}}})
        return self.recv()

    def run(self, payload, turn_id="t-1", tools=None, rid=2):
        self.send({"jsonrpc": "2.0", "id": rid, "method": "turn/run", "params": {
            "turnId": turn_id, "request": turn_request(payload, tools),
            "limits": {"maxSteps": 16, "maxToolCalls": 64, "timeoutMs": 60000}}})

    def answer(self, req, output=None):
        call = req["params"]["call"]
        self.send({"jsonrpc": "2.0", "id": req["id"], "result": {
            "status": "succeeded", "callId": call["id"], "tool": call["tool"],
            "completedAt": "2026-01-01T00:00:00Z",
            "output": call["arguments"] if output is None else output}})

    def close(self, timeout=10):
        """Closes the plugin's stdin, waits for it to exit and for both
        readers to reach end-of-file, so `stderr` and `stdout_raw` hold
        everything the plugin wrote."""
        self.proc.stdin.close()
        code = self.proc.wait(timeout=timeout)
        self._out_reader.join(timeout=timeout)
        self._err_reader.join(timeout=timeout)
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
