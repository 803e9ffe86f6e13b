import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { Plugin } from "./wire.mjs";

const TOOLS = [{ name: "files.read", description: "Read a file", namespace: "files", source: "kernel",
  readWrite: "read", inputSchema: { type: "object" }, requiredCapability: { resource: { namespace: "files", path: [] }, action: "read" } }];

test("the driver calls the tool the model asked for, then completes", async () => {
  const answers = [
    { choices: [{ message: { role: "assistant", content: null, tool_calls: [
      { id: "c1", type: "function", function: { name: "files__read", arguments: "{\"path\":\"notes.md\"}" } }] } }] },
    { choices: [{ message: { role: "assistant", content: "The notes say hi." } }] },
  ];
  const seen = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (d) => { body += d; });
    req.on("end", () => {
      seen.push({ path: req.url, auth: req.headers.authorization, body: JSON.parse(body) });
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify(answers.shift()));
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const p = new Plugin("model-driver.mjs", { SHAREDOS_MODEL_URL: `http://127.0.0.1:${server.address().port}/v1`, SHAREDOS_MODEL_KEY: "k-test" });
  try {
    await p.initialize();
    p.run("What do my notes say?", TOOLS);
    const call = await p.recv();
    assert.equal(call.method, "host/invokeTool");
    assert.equal(call.params.call.tool, "files.read");
    assert.deepEqual(call.params.call.arguments, { path: "notes.md" });
    assert.equal(call.params.step, 0);
    p.answer(call, { text: "hi" });
    const outcome = await p.recv();
    assert.deepEqual(outcome.result, { type: "complete", output: { text: "The notes say hi." } });
  } finally { p.kill(); server.close(); }
  assert.deepEqual(seen.map((s) => s.path), ["/v1/chat/completions", "/v1/chat/completions"]);
  assert.equal(seen[0].auth, "Bearer k-test");
  assert.equal(seen[0].body.tools[0].function.name, "files__read");
});

test("a driver without an endpoint fails the turn as driver_failed", async () => {
  const p = new Plugin("model-driver.mjs");
  try {
    await p.initialize();
    p.run("hello");
    const outcome = (await p.recv()).result;
    assert.equal(outcome.type, "fail");
    assert.equal(outcome.error.code, "driver_failed");
  } finally { p.kill(); }
});
