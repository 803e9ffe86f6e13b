"""The echo examples (async and blocking) over real pipes."""

import os
import pty
import subprocess
import sys

import pytest
from wire import EXAMPLES, Plugin

SCRIPTS = ["echo.py", "echo_blocking.py"]


@pytest.fixture(params=SCRIPTS)
def plugin(request):
    p = Plugin(request.param)
    yield p
    p.kill()


def test_handshake_and_round_trip(plugin):
    init = plugin.initialize()
    assert init["result"]["protocolVersion"] == 1
    assert init["result"]["manifest"] == {"id": "sharedos-echo-python", "version": "0.1.0",
                                          "protocolVersion": "1"}
    plugin.run({"calls": [{"tool": "files.read", "arguments": {"path": "a"}},
                          {"tool": "files.read", "arguments": {"path": "b"}}]})
    seen = []
    while True:
        msg = plugin.recv()
        if msg.get("method") == "host/invokeTool":
            assert msg["params"]["turnId"] == "t-1"
            assert msg["params"]["call"]["traceId"] == "trace-1"
            plugin.answer(msg)
        elif "method" in msg:
            seen.append((msg["method"], msg["params"]))
        else:
            outcome = msg
            break
    assert [m for m, _ in seen] == ["host/emit", "host/emit", "host/annotate"]
    assert seen[2][1] == {"turnId": "t-1", "key": "echo.calls", "value": 2}
    results = outcome["result"]["output"]["results"]
    assert [r["output"]["path"] for r in results] == ["a", "b"]
    assert plugin.close() == 0


def test_parallel_calls_answered_out_of_order(plugin):
    plugin.initialize()
    n = 16
    plugin.run({"parallel": True,
                "calls": [{"tool": "t", "arguments": {"n": i}} for i in range(n)]})
    pending = [plugin.recv() for _ in range(n)]
    assert all(m["method"] == "host/invokeTool" for m in pending)
    for req in reversed(pending):
        plugin.answer(req, output={"for": req["params"]["call"]["id"]})
    while True:
        msg = plugin.recv()
        if "method" not in msg:
            break
    for r in msg["result"]["output"]["results"]:
        assert r["output"] == {"for": r["callId"]}
    assert len(msg["result"]["output"]["results"]) == n


def test_a_newer_host_gets_version_1_and_an_unknown_one_an_error(plugin):
    assert plugin.initialize(versions=(1, 2))["result"]["protocolVersion"] == 1
    other = Plugin("echo.py")
    try:
        err = other.initialize(versions=(2,))["error"]
        assert err["code"] == -32050
        assert err["data"] == {"kind": "unsupported_protocol_version", "supported": [1]}
    finally:
        other.kill()


@pytest.mark.parametrize("kind,expected", [("fail", "fail"), ("escalate", "escalate")])
def test_outcome_kinds(plugin, kind, expected):
    plugin.initialize()
    plugin.run({"outcome": kind})
    while True:
        msg = plugin.recv()
        if "method" not in msg:
            break
    assert msg["result"]["type"] == expected


def test_drain_stops_new_calls_and_still_answers(plugin):
    plugin.initialize()
    plugin.run({"calls": [{"tool": "t", "arguments": {}}] * 3})
    first = plugin.recv()
    plugin.send({"jsonrpc": "2.0", "method": "turn/draining", "params": {"turnId": "t-1"}})
    plugin.answer(first)
    methods = []
    while True:
        msg = plugin.recv()
        if "method" not in msg:
            break
        methods.append(msg["method"])
    assert "host/invokeTool" not in methods
    assert len(msg["result"]["output"]["results"]) == 1


def test_abort_then_eof_exits(plugin):
    plugin.initialize()
    plugin.run({"calls": [{"tool": "t", "arguments": {}}]})
    assert plugin.recv()["method"] == "host/invokeTool"
    plugin.send({"jsonrpc": "2.0", "method": "turn/abort", "params": {"turnId": "t-1"}})
    assert plugin.close(timeout=10) == 0


def test_stray_prints_do_not_reach_the_protocol(plugin):
    plugin.initialize()
    plugin.run({"noise": True})
    while "method" in plugin.recv():
        pass
    plugin.close()
    assert b"a stray print" in plugin.stderr
    assert all(line.startswith(b'{"jsonrpc":"2.0"') for line in plugin.stdout_raw)


@pytest.mark.parametrize("script", SCRIPTS)
def test_run_by_hand_says_what_it_is(script):
    env = {k: v for k, v in os.environ.items() if k != "SHAREDOS_PLUGIN"}
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], stdin=subprocess.DEVNULL,
                          capture_output=True, env=env, timeout=30)
    assert done.returncode == 2
    assert done.stdout == b""
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "sharedos runtime plugin" in lines[0]


def test_a_terminal_on_stdin_is_a_person_even_with_the_variable():
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([sys.executable, str(EXAMPLES / "echo.py")], stdin=follower,
                              capture_output=True, timeout=30,
                              env=dict(os.environ, SHAREDOS_PLUGIN="1"))
    finally:
        os.close(leader)
        os.close(follower)
    assert done.returncode == 2
    assert b"sharedos runtime plugin" in done.stderr
