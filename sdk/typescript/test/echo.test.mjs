import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { EXAMPLES, Plugin, untilOutcome } from "./wire.mjs";

test("handshake and a tool call round trip", async () => {
  const p = new Plugin("echo.mjs");
  try {
    const init = await p.initialize();
    assert.equal(init.result.protocolVersion, 1);
    assert.deepEqual(init.result.manifest, { id: "sharedos-echo-typescript", version: "0.1.0", protocolVersion: "1" });
    p.run({ calls: [{ tool: "files.read", arguments: { path: "a" } }, { tool: "files.read", arguments: { path: "b" } }] });
    const [outcome, notes] = await untilOutcome(p);
    assert.deepEqual(notes.map((n) => n.method), ["host/emit", "host/emit", "host/annotate"]);
    assert.deepEqual(notes[2].params, { turnId: "t-1", key: "echo.calls", value: 2 });
    assert.deepEqual(outcome.result.output.results.map((r) => r.output.path), ["a", "b"]);
    assert.equal(await p.close(), 0);
  } finally { p.kill(); }
});

test("parallel calls answered out of order land on their own call", async () => {
  const p = new Plugin("echo.mjs");
  try {
    await p.initialize();
    const n = 64;
    p.run({ parallel: true, calls: Array.from({ length: n }, (_, i) => ({ tool: "t", arguments: { n: i } })) });
    const pending = [];
    for (let i = 0; i < n; i++) pending.push(await p.recv());
    for (const req of pending.reverse()) p.answer(req, { for: req.params.call.id });
    let m;
    do { m = await p.recv(); } while (m.method);
    assert.equal(m.result.output.results.length, n);
    for (const r of m.result.output.results) assert.deepEqual(r.output, { for: r.callId });
  } finally { p.kill(); }
});

test("a newer host gets version 1; a host without 1 gets -32050", async () => {
  const a = new Plugin("echo.mjs");
  const b = new Plugin("echo.mjs");
  try {
    assert.equal((await a.initialize([1, 2])).result.protocolVersion, 1);
    const err = (await b.initialize([2])).error;
    assert.equal(err.code, -32050);
    assert.deepEqual(err.data, { kind: "unsupported_protocol_version", supported: [1] });
  } finally { a.kill(); b.kill(); }
});

for (const kind of ["fail", "escalate"]) {
  test(`outcome ${kind}`, async () => {
    const p = new Plugin("echo.mjs");
    try {
      await p.initialize();
      p.run({ outcome: kind });
      const [outcome] = await untilOutcome(p);
      assert.equal(outcome.result.type, kind);
    } finally { p.kill(); }
  });
}

test("the drain stops new calls and the outcome still lands", async () => {
  const p = new Plugin("echo.mjs");
  try {
    await p.initialize();
    p.run({ calls: [{ tool: "t", arguments: {} }, { tool: "t", arguments: {} }, { tool: "t", arguments: {} }] });
    const first = await p.recv();
    p.send({ jsonrpc: "2.0", method: "turn/draining", params: { turnId: "t-1" } });
    p.answer(first);
    const [outcome, notes] = await untilOutcome(p);
    assert.ok(!notes.some((n) => n.method === "host/invokeTool"));
    assert.equal(outcome.result.output.results.length, 1);
  } finally { p.kill(); }
});

test("abort then end of input: the plugin exits", async () => {
  const p = new Plugin("echo.mjs");
  try {
    await p.initialize();
    p.run({ calls: [{ tool: "t", arguments: {} }] });
    assert.equal((await p.recv()).method, "host/invokeTool");
    p.send({ jsonrpc: "2.0", method: "turn/abort", params: { turnId: "t-1" } });
    assert.equal(await p.close(), 0);
  } finally { p.kill(); }
});

test("stray console.log goes to stderr, stdout carries only the protocol", async () => {
  const p = new Plugin("echo.mjs");
  try {
    await p.initialize();
    p.run({ noise: true });
    await untilOutcome(p);
    await p.close();
    assert.match(p.stderr, /a stray console.log/);
    for (const line of p.raw) assert.ok(line.startsWith('{"jsonrpc":"2.0"'), line);
  } finally { p.kill(); }
});

test("run by hand: one line saying what it is, exit 2", () => {
  const env = { ...process.env };
  delete env.SHAREDOS_PLUGIN;
  const done = spawnSync(process.execPath, [join(EXAMPLES, "echo.mjs")], { env, stdio: ["ignore", "pipe", "pipe"] });
  assert.equal(done.status, 2);
  assert.equal(done.stdout.length, 0);
  const lines = done.stderr.toString().trim().split("\n");
  assert.equal(lines.length, 1);
  assert.match(lines[0], /sharedos runtime plugin/);
});
