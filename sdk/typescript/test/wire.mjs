// A host side for the tests: starts a plugin as a real child process on
// real pipes and speaks the protocol to it line by line.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

export const EXAMPLES = join(dirname(fileURLToPath(import.meta.url)), "..", "examples");

export function turnRequest(payload, tools = []) {
  return { version: "1", executionId: "exec-1", agent: { kind: "agent", agentId: "a1" },
    context: { traceId: "trace-1" }, message: { payload }, tools };
}

export class Plugin {
  constructor(script, env = {}) {
    this.proc = spawn(process.execPath, [join(EXAMPLES, script)], {
      env: { PATH: process.env.PATH, SHAREDOS_PLUGIN: "1", ...env }, stdio: ["pipe", "pipe", "pipe"] });
    this.queue = [];
    this.waiters = [];
    this.raw = [];
    this.stderr = "";
    this.proc.stderr.on("data", (d) => { this.stderr += d; });
    createInterface({ input: this.proc.stdout }).on("line", (line) => {
      this.raw.push(line);
      this.push(JSON.parse(line));
    }).on("close", () => this.push(null));
    this.exited = new Promise((r) => this.proc.on("exit", (code) => r(code)));
  }
  push(m) { const w = this.waiters.shift(); if (w) w(m); else this.queue.push(m); }
  async recv() {
    const m = this.queue.length ? this.queue.shift() : await new Promise((r) => this.waiters.push(r));
    if (m === null) throw new Error("the plugin closed its stdout");
    return m;
  }
  send(m) { this.proc.stdin.write(JSON.stringify(m) + "\n"); }
  initialize(versions = [1], capabilities = {}) {
    this.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersions: versions,
      host: { name: "test", version: "0" }, limits: { maxMessageBytes: 8388608, maxInflightToolCalls: 64, maxConcurrentTurns: 1 }, capabilities } });
    return this.recv();
  }
  run(payload, tools, turnId = "t-1", id = 2) {
    this.send({ jsonrpc: "2.0", id, method: "turn/run", params: { turnId, request: turnRequest(payload, tools),
      limits: { maxSteps: 16, maxToolCalls: 64, timeoutMs: 60000 } } });
  }
  answer(req, output) {
    const c = req.params.call;
    this.send({ jsonrpc: "2.0", id: req.id, result: { status: "succeeded", callId: c.id, tool: c.tool,
      completedAt: "2026-01-01T00:00:00Z", output: output ?? c.arguments } });
  }
  async close() { this.proc.stdin.end(); return this.exited; }
  kill() { if (this.proc.exitCode === null) this.proc.kill("SIGKILL"); }
}

export async function untilOutcome(p) {
  const notes = [];
  for (;;) {
    const m = await p.recv();
    if (m.method === "host/invokeTool") p.answer(m);
    else if (m.method) notes.push(m);
    else return [m, notes];
  }
}
