#!/usr/bin/env node
// A model-driven plugin: the standard loop around a driver that asks an
// OpenAI-compatible chat-completions endpoint what to do next.
// Environment: SHAREDOS_MODEL_URL (base URL; POST <url>/chat/completions),
// SHAREDOS_MODEL_KEY (bearer token, optional), SHAREDOS_MODEL_NAME.
// The sandbox has no network: see docs/PLUGINS.md.
import { complete, createStandardRuntime, serve, toolCall } from "../src/index.js";

// Chat APIs allow [A-Za-z0-9_-] in function names; sharedos tools use dots.
const fnName = (tool) => tool.replaceAll(".", "__");

function openSession(request, url, key, model) {
  const names = new Map(request.tools.map((t) => [fnName(t.name), t.name]));
  const tools = request.tools.map((t) => ({ type: "function", function: { name: fnName(t.name), description: t.description, parameters: t.inputSchema } }));
  const payload = request.message.payload;
  const messages = [{ role: "user", content: typeof payload === "string" ? payload : JSON.stringify(payload) }];
  const traceId = request.context.traceId;
  let queued = [];
  let calls = 0;
  return {
    async next(input) {
      if (input.type === "tool_result") {
        messages.push({ role: "tool", tool_call_id: input.result.callId, content: JSON.stringify(input.result) });
      }
      if (queued.length === 0) {
        const body = { model, messages, ...(tools.length ? { tools } : {}) };
        const headers = { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) };
        const res = await fetch(`${url.replace(/\/$/, "")}/chat/completions`, { method: "POST", headers, body: JSON.stringify(body) });
        if (!res.ok) throw new Error(`the model endpoint answered ${res.status}`);
        const message = (await res.json()).choices[0].message;
        messages.push(message);
        queued = [...(message.tool_calls ?? [])];
        if (queued.length === 0) return complete({ text: message.content ?? "" });
      }
      // One call per step: the loop hands its result back to `next`.
      const tc = queued.shift();
      calls += 1;
      const call = toolCall({ id: tc.id ?? `call-${calls}`, tool: names.get(tc.function.name) ?? tc.function.name,
        arguments: JSON.parse(tc.function.arguments || "{}"), traceId });
      return { type: "tool_call", call };
    },
  };
}

const driver = {
  manifest: () => ({ id: "sharedos-model-typescript", version: "0.1.0", protocolVersion: "1" }),
  open(request) {
    const url = process.env.SHAREDOS_MODEL_URL;
    if (!url) throw new Error("SHAREDOS_MODEL_URL is not set");
    return openSession(request, url, process.env.SHAREDOS_MODEL_KEY ?? "", process.env.SHAREDOS_MODEL_NAME ?? "default");
  },
};

serve(createStandardRuntime(driver));
