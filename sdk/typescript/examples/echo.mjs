#!/usr/bin/env node
// sharedos echo plugin in JavaScript: the template for Node plugin authors.
// For each entry of request.message.payload.calls ([{tool, arguments}]) it
// calls the tool (all at once when payload.parallel is true), emits a
// `progress` event after each call, annotates how many calls it made and
// completes with the results. payload.outcome "fail" / "escalate" ends the
// turn that way; payload.noise prints to stdout and stderr (both land in
// the host's log). The same payload as the Rust and Python echo plugins:
// the one `sharedos conformance` drives.
import { complete, escalate, fail, serve, toolCall } from "../src/index.js";

const echo = {
  manifest: () => ({ id: "sharedos-echo-typescript", version: "0.1.0", protocolVersion: "1" }),
  // It keeps nothing between turns: a host with session affinity may give
  // it the next turn of a session in the same process.
  manyTurns: true,

  async run(request, host, abort) {
    const payload = typeof request.message.payload === "object" && request.message.payload !== null ? request.message.payload : {};
    if (payload.noise) {
      console.log("a stray console.log: the SDK routes it to stderr");
      process.stderr.write("noise on stderr ".repeat(64) + "\n");
    }
    const calls = Array.isArray(payload.calls) ? payload.calls : [];
    const traceId = request.context.traceId;
    let done = 0;
    const one = async (entry, i) => {
      // Start no new work once the host drains or aborts the turn.
      if (host.draining.raised || abort.raised) return null;
      const call = toolCall({ id: `call-${i}`, tool: entry.tool ?? "", arguments: entry.arguments ?? {}, traceId });
      const result = await host.invokeTool(call, i);
      done += 1;
      host.emit({ type: "progress", data: { done, total: calls.length } });
      return result;
    };
    let results;
    if (payload.parallel) {
      results = await Promise.all(calls.map(one));
    } else {
      results = [];
      for (const [i, c] of calls.entries()) results.push(await one(c, i));
    }
    results = results.filter((r) => r !== null);
    // Annotations land in the result's metadata on every ending.
    host.annotate("echo.calls", results.length);
    if (payload.outcome === "fail") return fail("echo_requested_failure", "The request asked to fail.", false);
    if (payload.outcome === "escalate") return escalate("The request asked for a human.");
    return complete({ results });
  },
};

serve(echo);
