// The standard loop: a bounded agent loop around a driver (a model).
// Mirrors plugin-sdk/src/standard.rs and sdk/python/sharedos_plugin/standard.py.
import { fail } from "./outcome.js";

export function standardRuntimeManifest() {
  return { id: "sharedos.standard", version: "0.1.0", protocolVersion: "1",
    metadata: { package: "@sharedos/plugin", executionModel: "bounded-driver-loop" } };
}

class Cancelled extends Error {}
class Invalid extends Error {}

async function drive(session, host, abort) {
  let input = { type: "start" };
  for (let step = 0; step < host.limits.maxSteps; step++) {
    if (host.draining.raised || abort.raised) throw new Cancelled();
    const d = await session.next(input, abort);
    if (d?.type === "complete" || d?.type === "fail") {
      const { type, ...rest } = d;
      return [{ type, ...rest }, type === "complete" ? "succeeded" : "failed"];
    }
    if (d?.type === "escalate") {
      host.annotate("escalationAsked", { tool: "sharedos.escalate", reason: d.reason });
      return [{ type: "escalate", reason: d.reason, ...(d.metadata ? { metadata: d.metadata } : {}) }, "escalated"];
    }
    if (d?.type !== "tool_call" || typeof d.call !== "object") throw new Invalid();
    if (d.step !== undefined && d.step < step) {
      return [fail("invalid_driver_decision", "The agent turn driver declared a step behind the loop's own position.", false), "failed"];
    }
    const result = await host.invokeTool(d.call, d.step ?? step);
    if (host.draining.raised) throw new Cancelled();
    input = { type: "tool_result", result };
  }
  return [fail("step_limit_exceeded", "The agent turn reached its maximum number of steps.", false), "failed"];
}

/**
 * The plugin built around `driver` ({ manifest?(), open(request, signal) →
 * session { next(input, signal) → decision, close?(outcome) } }). A decision
 * is { type: "tool_call", call, step? } | complete | fail | escalate.
 */
export function createStandardRuntime(driver, { closeTimeoutMs = 1000 } = {}) {
  const close = async (session, outcome) => {
    if (!session?.close) return;
    let timer;
    const limit = new Promise((r) => { timer = setTimeout(r, closeTimeoutMs); });
    try { await Promise.race([Promise.resolve().then(() => session.close(outcome)), limit]); } catch { /* swallowed */ }
    clearTimeout(timer);
  };
  return {
    manifest: () => driver.manifest?.() ?? standardRuntimeManifest(),
    async run(request, host, abort) {
      let session;
      try {
        session = await driver.open(request, abort);
        const [outcome, ended] = await drive(session, host, abort);
        await close(session, ended);
        return outcome;
      } catch (e) {
        if (e instanceof Invalid) {
          await close(session, "failed");
          return fail("invalid_driver_decision", "The agent turn driver returned an invalid decision.", false);
        }
        if (e instanceof Cancelled || abort.raised || host.draining.raised) {
          await close(session, "cancelled");
          throw new Error("the turn was cancelled");
        }
        process.stderr.write(`sharedos standard loop: the driver failed: ${e?.stack ?? e}\n`);
        await close(session, "failed");
        return fail("driver_failed", "The agent turn driver failed.", true);
      }
    },
  };
}
