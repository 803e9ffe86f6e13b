// turns: "many" (docs/PROTOCOL.md section 4.6) over real pipes: the echo
// example says manyTurns, so a host that offers it may send the next
// turn/run on the same connection once the first was answered; a host that
// did not offer gets one turn per process.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Plugin, untilOutcome } from "./wire.mjs";

test("a second turn on the connection when the host offers", async () => {
  const p = new Plugin("echo.mjs");
  try {
    const init = await p.initialize([1], { turns: "many" });
    assert.deepEqual(init.result.capabilities, { turns: "many" });
    p.run({ calls: [] }, [], "t-1", 2);
    const [first] = await untilOutcome(p);
    assert.equal(first.id, 2);
    assert.equal(first.result.type, "complete");
    p.run({ calls: [] }, [], "t-2", 3);
    const [second] = await untilOutcome(p);
    assert.equal(second.id, 3);
    assert.equal(second.result?.type, "complete", JSON.stringify(second));
    assert.equal(await p.close(), 0);
  } finally { p.kill(); }
});

test("one turn when the host did not offer", async () => {
  const p = new Plugin("echo.mjs");
  try {
    const init = await p.initialize();
    assert.deepEqual(init.result.capabilities, { turns: "many" });
    p.run({ calls: [] }, [], "t-1", 2);
    const [first] = await untilOutcome(p);
    assert.equal(first.result.type, "complete");
    p.run({ calls: [] }, [], "t-2", 3);
    const [second] = await untilOutcome(p);
    assert.equal(second.id, 3);
    assert.ok(second.error, JSON.stringify(second));
    assert.equal(await p.close(), 0);
  } finally { p.kill(); }
});
