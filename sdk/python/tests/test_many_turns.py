"""``turns: "many"`` (docs/PROTOCOL.md section 4.6) over real pipes: the
echo examples say ``many_turns``, so a host that offers it may send the
next ``turn/run`` on the same connection once the first was answered; a
host that did not offer gets one turn per process."""

import pytest
from wire import Plugin

SCRIPTS = ["echo.py", "echo_blocking.py"]


@pytest.fixture(params=SCRIPTS)
def plugin(request):
    p = Plugin(request.param)
    yield p
    p.kill()


def outcome(plugin):
    while True:
        msg = plugin.recv()
        if "method" not in msg:
            return msg


def test_a_second_turn_on_the_connection_when_the_host_offers(plugin):
    init = plugin.initialize(capabilities={"turns": "many"})
    assert init["result"]["capabilities"] == {"turns": "many"}
    plugin.run({"calls": []}, turn_id="t-1", rid=2)
    first = outcome(plugin)
    assert first["id"] == 2 and first["result"]["type"] == "complete"
    plugin.run({"calls": []}, turn_id="t-2", rid=3)
    second = outcome(plugin)
    assert second["id"] == 3 and second["result"]["type"] == "complete", second
    assert plugin.close() == 0


def test_one_turn_when_the_host_did_not_offer(plugin):
    init = plugin.initialize()
    assert init["result"]["capabilities"] == {"turns": "many"}
    plugin.run({"calls": []}, turn_id="t-1", rid=2)
    assert outcome(plugin)["result"]["type"] == "complete"
    plugin.run({"calls": []}, turn_id="t-2", rid=3)
    second = outcome(plugin)
    assert second["id"] == 3 and "error" in second, second
    assert plugin.close() == 0
