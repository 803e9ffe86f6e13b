#!/usr/bin/env python3
"""A complete sharedos plugin in 50 lines, standard library only, no SDK:
the echo payload of docs/PROTOCOL.md, section 9, one call at a time."""
import json, os, sys

if "SHAREDOS_PLUGIN" not in os.environ or sys.stdin.isatty():
    sys.exit("This program is a sharedos runtime plugin, run by a sharedos host.")
out = os.fdopen(os.dup(1), "w", encoding="utf-8")  # protocol lines only
os.dup2(2, 1)                                       # print() now goes to stderr
draining = False

def send(msg):
    out.write(json.dumps(dict(msg, jsonrpc="2.0"), separators=(",", ":"), allow_nan=False) + "\n")
    out.flush()

def read():  # the next host message; None at end of input
    global draining
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("method") == "turn/draining":
            draining = True
        elif msg.get("method") == "turn/abort":
            sys.exit(0)
        else:
            return msg
    return None

def run(turn_id, request):
    calls, results = request["message"]["payload"].get("calls", []), []
    for i, c in enumerate(calls):
        if draining:
            break  # start no new work once the host drains the turn
        call = {"id": f"call-{i}", "tool": c["tool"], "arguments": c.get("arguments", {}),
                "traceId": request["context"]["traceId"], "requestedAt": "2026-01-01T00:00:00Z"}
        send({"id": i + 100, "method": "host/invokeTool", "params": {"turnId": turn_id, "call": call, "step": i}})
        answer = read()  # one call in flight, so the next response is its answer
        results.append(answer.get("result", answer.get("error")))
        send({"method": "host/emit", "params": {"turnId": turn_id, "event": {"type": "progress", "data": {"done": i + 1}}}})
    send({"method": "host/annotate", "params": {"turnId": turn_id, "key": "echo.calls", "value": len(results)}})
    return {"type": "complete", "output": {"results": results}}

while (msg := read()) is not None:
    if msg.get("method") == "initialize":
        if 1 not in msg["params"]["protocolVersions"]:
            send({"id": msg["id"], "error": {"code": -32050, "message": "no common version",
                  "data": {"kind": "unsupported_protocol_version", "supported": [1]}}})
            continue
        manifest = {"id": "echo-no-sdk", "version": "1.0.0", "protocolVersion": "1"}
        send({"id": msg["id"], "result": {"protocolVersion": 1, "manifest": manifest}})
    elif msg.get("method") == "turn/run":
        send({"id": msg["id"], "result": run(msg["params"]["turnId"], msg["params"]["request"])})
