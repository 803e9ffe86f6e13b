"""A CLI seated by the harness in the tests: the real Python `mcp` SDK client.

argv: <transport> <relay command> <relay args...>   (transport: stdio)
env:  STEPS: a JSON array of steps, each {"tool", "args", "delayMs"?} or
      {"parallel": [step, ...]} (run at once, each after its delay);
      LOOP: "1" to repeat the steps until the turn ends.
It prints one JSON line, what it saw, as its last line of stdout.
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def summary(step, res):
    text = "".join(getattr(c, "text", "") for c in res.content)
    return {"tool": step["tool"], "isError": res.isError, "meta": res.meta, "text": text}


async def call(session, step):
    await asyncio.sleep(step.get("delayMs", 0) / 1000)
    res = await session.call_tool(step["tool"], step.get("args", {}))
    return summary(step, res)


async def main():
    transport, command, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    assert transport == "stdio", transport
    steps = json.loads(os.environ.get("STEPS", "[]"))
    seen = {}
    params = StdioServerParameters(command=command, args=args, env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            seen["protocolVersion"] = init.protocolVersion
            seen["serverName"] = init.serverInfo.name
            listed = await session.list_tools()
            seen["listedAt"] = time.time()
            seen["tools"] = sorted(t.name for t in listed.tools)
            seen["catalogHash"] = (listed.meta or {}).get("sharedos/catalogHash")
            results = []
            while True:
                for step in steps:
                    if "parallel" in step:
                        results.extend(await asyncio.gather(*(call(session, s) for s in step["parallel"])))
                    else:
                        results.append(await call(session, step))
                if os.environ.get("LOOP") != "1":
                    break
            seen["results"] = results
    print("progress line that is not the answer")
    print(json.dumps(seen))


asyncio.run(main())
