"""The model-driver example against a local HTTP endpoint (a real socket)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from wire import Plugin

TOOLS = [{"name": "files.read", "description": "Read a file", "namespace": "files",
          "source": "kernel", "readWrite": "read", "inputSchema": {"type": "object"},
          "requiredCapability": {"resource": {"namespace": "files", "path": []},
                                 "action": "read"}}]


def serve_model(answers, seen):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append((self.path, self.headers.get("authorization"), body))
            data = json.dumps(answers.pop(0)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_driver_calls_the_tool_the_model_asked_for_and_completes():
    answers = [
        {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "files__read", "arguments": "{\"path\": \"notes.md\"}"}}]}}]},
        {"choices": [{"message": {"role": "assistant", "content": "The notes say hi."}}]},
    ]
    seen = []
    server = serve_model(answers, seen)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    plugin = Plugin("model_driver.py", env={"SHAREDOS_MODEL_URL": url,
                                            "SHAREDOS_MODEL_KEY": "k-test"})
    try:
        assert plugin.initialize()["result"]["manifest"]["id"] == "sharedos-model-python"
        plugin.run("What do my notes say?", tools=TOOLS)
        call = plugin.recv()
        assert call["method"] == "host/invokeTool"
        assert call["params"]["call"]["tool"] == "files.read"
        assert call["params"]["call"]["arguments"] == {"path": "notes.md"}
        assert call["params"]["step"] == 0
        plugin.answer(call, output={"text": "hi"})
        outcome = plugin.recv()
        assert outcome["result"] == {"type": "complete", "output": {"text": "The notes say hi."}}
    finally:
        plugin.kill()
        server.shutdown()
    assert [s[0] for s in seen] == ["/v1/chat/completions"] * 2
    assert seen[0][1] == "Bearer k-test"
    assert seen[0][2]["tools"][0]["function"]["name"] == "files__read"
    tool_msg = seen[1][2]["messages"][-1]
    assert tool_msg["role"] == "tool" and json.loads(tool_msg["content"])["output"] == {"text": "hi"}


def test_a_driver_without_an_endpoint_fails_the_turn_as_driver_failed():
    plugin = Plugin("model_driver.py")
    try:
        plugin.initialize()
        plugin.run("hello")
        outcome = plugin.recv()["result"]
        assert outcome["type"] == "fail" and outcome["error"]["code"] == "driver_failed"
    finally:
        plugin.kill()
