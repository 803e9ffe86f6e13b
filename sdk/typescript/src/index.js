// @sharedos/plugin: write a sharedos runtime plugin in JavaScript or
// TypeScript (Node 20+, ESM, no dependencies). Types: index.d.ts (hand
// written) and protocol.d.ts (generated from the JSON Schema).
import { createInterface } from "node:readline";

export const PROTOCOL_VERSION = 1;
export const PLUGIN_ENV = "SHAREDOS_PLUGIN";
export const SDK_NAME = "sharedos-typescript/0.1.0";
export const NOT_A_TERMINAL_PROGRAM =
  "This program is a sharedos runtime plugin. It is meant to be started by a sharedos host, " +
  "which talks to it over stdin/stdout; it is not meant to be run by hand " +
  "(try: sharedos conformance -- <this command>).";

const ERROR_CODES = {
  invalid_request: -32600, method_not_found: -32601, invalid_params: -32602, internal: -32603,
  audit_unavailable: -32603, cancelled: -32800, unsupported_protocol_version: -32050,
  not_initialized: -32051, turn_not_active: -32052, overloaded: -32055, message_too_large: -32057,
};
const REFUSED_KEYS = new Set(["", "runtime", "__proto__"]);

/** A host call refused by the host (or checked locally first). */
export class HostCallError extends Error {
  constructor(kind, message, data = {}) {
    super(`${kind}: ${message}`);
    this.kind = kind;
    this.data = data;
  }
}

/** A one-way flag: the drain and the abort. */
export class Signal {
  #raised = false;
  #waiters = [];
  get raised() { return this.#raised; }
  isRaised() { return this.#raised; }
  raise() {
    if (this.#raised) return;
    this.#raised = true;
    for (const w of this.#waiters.splice(0)) w();
  }
  onRaise(cb) { if (this.#raised) cb(); else this.#waiters.push(cb); }
  wait() { return new Promise((resolve) => this.onRaise(resolve)); }
}

import { now } from "./outcome.js";
export { complete, escalate, fail, now, toolCall } from "./outcome.js";

function text(value, what, max = 256) {
  if (typeof value !== "string" || value.trim().length < 1 || value.trim().length > max) {
    throw new HostCallError("invalid_params", `${what} must be a string of 1..${max} characters after trimming`);
  }
}

function encode(message) {
  const line = JSON.stringify(message, (_k, v) => {
    if (typeof v === "number" && !Number.isFinite(v)) throw new HostCallError("invalid_params", "NaN and Infinity are not JSON");
    if (typeof v === "bigint") throw new HostCallError("invalid_params", "BigInt is not JSON");
    return v;
  });
  if (line === undefined) throw new HostCallError("invalid_params", "the message is not JSON");
  return line;
}

function wireError(kind, message, data = {}) {
  return { code: ERROR_CODES[kind], message, data: { kind, ...data } };
}

function checkOutcome(o) {
  if (!o || !["complete", "fail", "escalate"].includes(o.type)) {
    throw new Error("run() must resolve to complete(...), fail(...) or escalate(...)");
  }
  if (o.type === "fail") { text(o.error?.code, "error.code"); text(o.error?.message, "error.message", 4096); }
  if (o.type === "escalate") text(o.reason, "reason", 512);
  return o;
}

class Connection {
  constructor(manifest, write) {
    this.manifest = manifest;
    this.write = write;
    this.pending = new Map();
    this.nextId = 1;
    this.maxMessageBytes = 8 * 1024 * 1024;
    this.initialized = false;
    this.turn = null;
  }
  send(message) {
    const line = encode(message);
    if (Buffer.byteLength(line) > this.maxMessageBytes) {
      throw new HostCallError("message_too_large", `the message exceeds maxMessageBytes (${this.maxMessageBytes})`);
    }
    this.write(line + "\n");
  }
  respond(id, result) {
    try { this.send({ jsonrpc: "2.0", id, result }); } catch (e) {
      this.respondError(id, wireError(e.kind ?? "internal", e.message));
    }
  }
  respondError(id, error) {
    try { this.send({ jsonrpc: "2.0", id, error }); } catch { /* nothing left to tell */ }
  }
  request(method, params) {
    const id = this.nextId++;
    const line = { jsonrpc: "2.0", id, method, params };
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      try { this.send(line); } catch (e) { this.pending.delete(id); reject(e); }
    });
  }
  cancelPending() {
    for (const { reject } of this.pending.values()) reject(new HostCallError("cancelled", "the turn was aborted"));
    this.pending.clear();
  }
}

function makeHost(conn, turn) {
  const open = () => {
    if (turn.abort.raised || turn.closed) throw new HostCallError("turn_not_active", "Runtime host is closed");
  };
  return Object.freeze({
    limits: turn.limits,
    draining: turn.draining,
    async invokeTool(call, step) {
      open();
      text(call?.id, "call.id"); text(call?.tool, "call.tool"); text(call?.traceId, "call.traceId");
      if (typeof call.arguments !== "object" || call.arguments === null || Array.isArray(call.arguments)) {
        throw new HostCallError("invalid_params", "call.arguments must be an object");
      }
      const params = { turnId: turn.turnId, call: { requestedAt: now(), ...call } };
      if (step !== undefined && step !== null) {
        if (!Number.isSafeInteger(step) || step < 0) throw new HostCallError("invalid_params", "step must be an integer >= 0");
        params.step = step;
      }
      for (;;) {
        try {
          return await conn.request("host/invokeTool", params);
        } catch (e) {
          if (e.kind !== "overloaded") throw e;
          await new Promise((r) => setTimeout(r, Math.max(1, e.data?.retryAfterMs ?? 100)));
          open();
        }
      }
    },
    emit(event) {
      open();
      text(event?.type, "event.type");
      if (!("data" in event)) throw new HostCallError("invalid_params", "event.data is required");
      conn.send({ jsonrpc: "2.0", method: "host/emit", params: { turnId: turn.turnId, event: { type: event.type, data: event.data } } });
    },
    annotate(key, value) {
      open();
      if (typeof key !== "string" || REFUSED_KEYS.has(key)) {
        throw new HostCallError("invalid_params", "annotation keys must not be empty, 'runtime' or '__proto__'");
      }
      conn.send({ jsonrpc: "2.0", method: "host/annotate", params: { turnId: turn.turnId, key, value } });
    },
  });
}

/** `plugin.manyTurns` (a property or a method), false when absent. */
function manyTurnsOf(plugin) {
  const many = plugin.manyTurns;
  return Boolean(typeof many === "function" ? many.call(plugin) : many);
}

function onRequest(conn, plugin, { id, method, params = {} }) {
  if (method === "initialize") {
    const offered = params.protocolVersions;
    if (!Array.isArray(offered) || !offered.includes(PROTOCOL_VERSION)) {
      return conn.respondError(id, wireError("unsupported_protocol_version", "no common protocol version", { supported: [PROTOCOL_VERSION] }));
    }
    if (Number.isSafeInteger(params.limits?.maxMessageBytes)) conn.maxMessageBytes = params.limits.maxMessageBytes;
    conn.initialized = true;
    // turns: "many" (docs/PROTOCOL.md section 4.6): the plugin says it may
    // serve several turns in one process; both sides must say it.
    const manyTurns = manyTurnsOf(plugin);
    conn.many = manyTurns && params.capabilities?.turns === "many";
    const capabilities = manyTurns ? { turns: "many" } : {};
    return conn.respond(id, { protocolVersion: PROTOCOL_VERSION, manifest: conn.manifest, sdk: SDK_NAME, capabilities });
  }
  if (method !== "turn/run") return conn.respondError(id, wireError("method_not_found", "method not found"));
  if (!conn.initialized) return conn.respondError(id, wireError("not_initialized", "initialize first"));
  if (conn.turn && !(conn.many && conn.turn.closed)) {
    return conn.respondError(id, wireError("not_initialized", "a turn is already running"));
  }
  if (typeof params.turnId !== "string" || typeof params.request !== "object" || typeof params.limits !== "object") {
    return conn.respondError(id, wireError("invalid_params", "invalid turn/run params"));
  }
  const turn = { turnId: params.turnId, limits: Object.freeze({ ...params.limits }), draining: new Signal(), abort: new Signal(), closed: false };
  const previous = conn.turn;
  if (previous) {
    // The answered turn's signals and calls: nothing of it keeps running.
    previous.draining.raise(); previous.abort.raise(); conn.cancelPending();
  }
  conn.turn = turn;
  Promise.resolve()
    .then(() => plugin.run(params.request, makeHost(conn, turn), turn.abort))
    .then((outcome) => { turn.closed = true; conn.respond(id, checkOutcome(outcome)); })
    .catch((e) => {
      turn.closed = true;
      process.stderr.write(`sharedos plugin: the runtime failed: ${e?.stack ?? e}\n`);
      conn.respondError(id, wireError("internal", `the runtime failed: ${e?.message ?? e}`.slice(0, 4096)));
    });
}

function dispatch(conn, plugin, msg) {
  if (typeof msg !== "object" || msg === null || Array.isArray(msg)) return;
  if (msg.method === undefined) {
    const waiter = conn.pending.get(msg.id);
    if (!waiter) return;
    conn.pending.delete(msg.id);
    if (msg.error) waiter.reject(new HostCallError(msg.error.data?.kind ?? "internal", String(msg.error.message ?? ""), msg.error.data ?? {}));
    else waiter.resolve(msg.result);
  } else if ("id" in msg) {
    onRequest(conn, plugin, msg);
  } else if (conn.turn && msg.params?.turnId === conn.turn.turnId) {
    if (msg.method === "turn/draining") conn.turn.draining.raise();
    if (msg.method === "turn/abort") { conn.turn.draining.raise(); conn.turn.abort.raise(); conn.cancelPending(); }
  }
}

/** Whether a host started us: its variable is set and stdin is no terminal. */
export function startedByHost() {
  return process.env[PLUGIN_ENV] !== undefined && !process.stdin.isTTY;
}

/**
 * Serves `plugin` on stdin/stdout until the host closes stdin. Run by hand,
 * prints one line saying what this program is and exits with status 2.
 * `console.log` and `process.stdout.write` are sent to stderr so that a
 * stray print lands in the log instead of ending the turn.
 */
export function serve(plugin) {
  if (!startedByHost()) {
    process.stderr.write(NOT_A_TERMINAL_PROGRAM + "\n");
    process.exitCode = 2;
    return Promise.resolve(2);
  }
  const protocolWrite = process.stdout.write.bind(process.stdout);
  process.stdout.write = process.stderr.write.bind(process.stderr);
  console.log = console.error;
  console.info = console.error;
  const conn = new Connection(plugin.manifest(), (line) => protocolWrite(line));
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  return new Promise((resolve) => {
    lines.on("line", (line) => {
      if (!line.trim()) return;
      let msg;
      try { msg = JSON.parse(line); } catch {
        process.stderr.write("sharedos plugin: the host sent a line that is not JSON\n");
        return;
      }
      dispatch(conn, plugin, msg);
    });
    lines.on("close", () => {
      if (conn.turn) { conn.turn.draining.raise(); conn.turn.abort.raise(); }
      conn.cancelPending();
      // Stdin is closed: the host is done with us.
      setTimeout(() => { resolve(0); process.exit(0); }, 50).unref();
    });
  });
}

export { createStandardRuntime, standardRuntimeManifest } from "./standard.js";
