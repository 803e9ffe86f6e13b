// A CLI seated by the harness in the tests: the real TypeScript MCP SDK
// client (@modelcontextprotocol/sdk, pinned in tests/vendor-cli) over
// streamable HTTP, the counterpart of mcp_client.py.
//
// argv: http <mcp url> <bearer token>
// env:  STEPS: a JSON array of steps, each {"tool", "args", "delayMs"?} or
//       {"parallel": [step, ...]} (run at once, each after its delay);
//       LOOP: "1" to repeat the steps until the turn ends.
// It prints one JSON line, what it saw, as its last line of stdout, in the
// shape mcp_client.py prints, so the same assertions apply.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function summary(step, res) {
  const text = (res.content ?? []).map((c) => c.text ?? '').join('');
  return { tool: step.tool, isError: res.isError ?? false, meta: res._meta ?? null, text };
}

async function call(client, step) {
  await sleep(step.delayMs ?? 0);
  const res = await client.callTool({ name: step.tool, arguments: step.args ?? {} });
  return summary(step, res);
}

// The statuses of a request without the token and with a wrong one, sent
// with Node's own fetch.
async function unauthorized(url, token) {
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' });
  const out = [];
  for (const auth of [null, 'Bearer ' + '0'.repeat(token.length)]) {
    const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
    if (auth) headers.authorization = auth;
    const r = await fetch(url, { method: 'POST', headers, body, signal: AbortSignal.timeout(5000) });
    await r.arrayBuffer();
    out.push(r.status);
  }
  return out;
}

async function main() {
  const [transportName, url, token] = process.argv.slice(2);
  if (transportName !== 'http') throw new Error(`only the http transport: ${transportName}`);
  const steps = JSON.parse(process.env.STEPS ?? '[]');
  const seen = { unauthorized: await unauthorized(url, token) };
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: 'Bearer ' + token } },
  });
  const client = new Client({ name: 'sharedos-test-ts-client', version: '0.1.0' });
  await client.connect(transport);
  seen.protocolVersion = transport.protocolVersion;
  seen.serverName = client.getServerVersion()?.name;
  const listed = await client.listTools();
  seen.listedAt = Date.now() / 1000;
  seen.tools = listed.tools.map((t) => t.name).sort();
  seen.catalogHash = listed._meta?.['sharedos/catalogHash'] ?? null;
  const results = [];
  for (;;) {
    for (const step of steps) {
      if (step.parallel) {
        results.push(...(await Promise.all(step.parallel.map((s) => call(client, s)))));
      } else {
        results.push(await call(client, step));
      }
    }
    if (process.env.LOOP !== '1') break;
  }
  seen.results = results;
  await client.close();
  console.log('progress line that is not the answer');
  console.log(JSON.stringify(seen));
}

main().catch((e) => {
  console.error(e?.stack ?? String(e));
  process.exitCode = 1;
});
