"""A CLI seated by the harness in the tests: the real Python `mcp` SDK client.

argv: stdio <relay command> <relay args...>
   or: http <mcp url> <bearer token>
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
from mcp.client.streamable_http import streamablehttp_client


def summary(step, res):
    text = "".join(getattr(c, "text", "") for c in res.content)
    return {"tool": step["tool"], "isError": res.isError, "meta": res.meta, "text": text}


async def call(session, step):
    await asyncio.sleep(step.get("delayMs", 0) / 1000)
    res = await session.call_tool(step["tool"], step.get("args", {}))
    return summary(step, res)


def unauthorized(url, token):
    """The statuses of a request without the token and with a wrong one."""
    import urllib.error
    import urllib.request

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    out = []
    for auth in (None, "Bearer " + "0" * len(token)):
        req = urllib.request.Request(url, data=body, method="POST")
        req.add_header("content-type", "application/json")
        req.add_header("accept", "application/json, text/event-stream")
        if auth:
            req.add_header("authorization", auth)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                out.append(r.status)
        except urllib.error.HTTPError as e:
            out.append(e.code)
    return out


def connect():
    transport = sys.argv[1]
    if transport == "stdio":
        params = StdioServerParameters(command=sys.argv[2], args=sys.argv[3:], env=dict(os.environ))
        return stdio_client(params)
    assert transport == "http", transport
    url, token = sys.argv[2], sys.argv[3]
    return streamablehttp_client(url, headers={"Authorization": "Bearer " + token})


async def main():
    steps = json.loads(os.environ.get("STEPS", "[]"))
    seen = {}
    if sys.argv[1] == "http":
        seen["unauthorized"] = unauthorized(sys.argv[2], sys.argv[3])
    async with connect() as streams:
        read, write = streams[0], streams[1]
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
