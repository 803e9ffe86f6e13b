"""A raw sharedos plugin (no SDK) for tests/tests/conformance_real.rs: the
echo payload one call at a time, or, by its one argument, a broken variant:

  ok          follows the echo payload (a real turn passes)
  crash       dies at start on an import of a module that does not exist
  silent      never answers initialize
  null-id     sends host/invokeTool with "id": null
  long-line   writes a line longer than limits.maxMessageBytes
  unlisted    calls a tool that is not in the turn's catalogue
  ignore-drain  keeps starting calls after turn/draining
  stdout-noise  prints a log line on stdout when the payload asks for noise
  ignore-abort  ignores turn/abort and keeps running after its input ended
  bad-emit    sends two host/emit without an event before its outcome
  bad-annotate  sends a host/annotate without a key before its outcome
  wrong-outcome answers a requested fail with an outcome kind that does not
              exist ("failed")
"""
import json, os, sys, time

if "SHAREDOS_PLUGIN" not in os.environ or sys.stdin.isatty():
    sys.exit("This program is a sharedos runtime plugin, run by a sharedos host.")
MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
if MODE == "crash":
    print("variants: loading the model client", file=sys.stderr)
    import sharedos_conformance_missing_module  # noqa: F401
out = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
draining = False
max_bytes = 1 << 20


def send(msg):
    try:
        out.write(json.dumps(dict(msg, jsonrpc="2.0"), separators=(",", ":")) + "\n")
        out.flush()
    except BrokenPipeError:
        # The host stopped reading (the turn was aborted): ignore-abort
        # keeps running regardless, the others end here.
        if MODE == "ignore-abort":
            time.sleep(3600)
        raise


def read():
    global draining
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("method") == "turn/draining":
            draining = True
        elif msg.get("method") == "turn/abort":
            if MODE != "ignore-abort":
                sys.exit(0)
            time.sleep(3600)
        else:
            return msg
    if MODE == "ignore-abort":
        time.sleep(3600)
    return None


def run(turn_id, request):
    calls = request["message"]["payload"].get("calls", [])
    if MODE == "stdout-noise" and request["message"]["payload"].get("noise"):
        out.write("variants: a log line on stdout\n")
        out.flush()
    if MODE == "unlisted":
        calls = [{"tool": "conformance.undeclared", "arguments": {}}]
    results = []
    for i, c in enumerate(calls):
        if draining and MODE != "ignore-drain":
            break
        call = {"id": f"call-{i}", "tool": c["tool"], "arguments": c.get("arguments", {}),
                "traceId": request["context"]["traceId"], "requestedAt": "2026-01-01T00:00:00Z"}
        rid = None if MODE == "null-id" else i + 100
        send({"id": rid, "method": "host/invokeTool",
              "params": {"turnId": turn_id, "call": call, "step": i}})
        answer = read()
        if answer is None:
            sys.exit(0)
        results.append(answer.get("result", answer.get("error")))
    if MODE == "long-line":
        send({"method": "host/emit", "params": {"turnId": turn_id, "event": {
            "type": "progress", "data": {"pad": "x" * (max_bytes + 1024)}}}})
    if MODE == "bad-emit":
        for _ in range(2):
            send({"method": "host/emit", "params": {"turnId": turn_id}})
    if MODE == "bad-annotate":
        send({"method": "host/annotate", "params": {"turnId": turn_id, "value": 1}})
    kind = request["message"]["payload"].get("outcome", "complete")
    if kind == "fail":
        return {"type": "failed" if MODE == "wrong-outcome" else "fail",
                "error": {"code": "echo_requested_failure", "message": "The request asked to fail."}}
    if kind == "escalate":
        return {"type": "escalate", "reason": "The request asked for a human."}
    return {"type": "complete", "output": {"results": results}}


while (msg := read()) is not None:
    if msg.get("method") == "initialize":
        if MODE == "silent":
            continue
        max_bytes = msg["params"]["limits"]["maxMessageBytes"]
        if 1 not in msg["params"]["protocolVersions"]:
            send({"id": msg["id"], "error": {"code": -32050, "message": "no common version",
                  "data": {"kind": "unsupported_protocol_version", "supported": [1]}}})
            continue
        manifest = {"id": "conformance-variants", "version": "1.0.0", "protocolVersion": "1"}
        send({"id": msg["id"], "result": {"protocolVersion": 1, "manifest": manifest}})
    elif msg.get("method") == "turn/run":
        send({"id": msg["id"], "result": run(msg["params"]["turnId"], msg["params"]["request"])})
