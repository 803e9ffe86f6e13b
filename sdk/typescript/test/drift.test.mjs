import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { generate, OUTPUT_PATH, SCHEMA_PATH } from "../scripts/gen-types.mjs";

test("src/protocol.d.ts is what the JSON Schema generates", () => {
  assert.equal(readFileSync(OUTPUT_PATH, "utf8"), generate(),
    "src/protocol.d.ts is stale: run node sdk/typescript/scripts/gen-types.mjs");
});

test("every $defs entry and error kind of the schema is a type", () => {
  const schema = JSON.parse(readFileSync(SCHEMA_PATH, "utf8"));
  const dts = readFileSync(OUTPUT_PATH, "utf8");
  for (const name of Object.keys(schema.$defs)) assert.match(dts, new RegExp(`export type ${name} =`));
  for (const e of schema.errors) assert.ok(dts.includes(JSON.stringify(e.kind)), e.kind);
});
