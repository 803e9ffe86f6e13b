"""What the host interface refuses locally (the host would drop it silently)."""

import os

import pytest

from sharedos_plugin import HostCallError, RuntimeEvent, RuntimeLimits, ToolCall
from sharedos_plugin.connection import Connection, Turn
from sharedos_plugin.host import BlockingHost


@pytest.fixture
def host():
    r, w = os.pipe()
    rr, ww = os.pipe()
    conn = Connection({}, r, ww, lambda *a: None)
    conn.max_message_bytes = 4096
    turn = Turn("t-1", RuntimeLimits(4, 4, 1000))
    yield BlockingHost(conn, turn), turn, rr
    for fd in (w, rr, ww):
        os.close(fd)


@pytest.mark.parametrize("key", ["", "runtime", "__proto__"])
def test_refused_annotation_keys(host, key):
    with pytest.raises(HostCallError) as e:
        host[0].annotate(key, 1)
    assert e.value.kind == "invalid_params"


def test_nan_is_refused_before_it_reaches_the_wire(host):
    with pytest.raises(HostCallError):
        host[0].emit(RuntimeEvent("x", float("nan")))


def test_a_line_over_the_limit_is_refused(host):
    with pytest.raises(HostCallError) as e:
        host[0].emit(RuntimeEvent("x", "a" * 5000))
    assert e.value.kind == "message_too_large"


def test_a_call_with_an_empty_tool_is_refused(host):
    with pytest.raises(HostCallError) as e:
        host[0].invoke_tool(ToolCall("c", " ", {}, "trace"))
    assert e.value.kind == "invalid_params"


def test_after_abort_the_host_is_closed(host):
    h, turn, _ = host
    turn.abort.raise_()
    with pytest.raises(HostCallError) as e:
        h.emit(RuntimeEvent("x", 1))
    assert e.value.kind == "turn_not_active"


def test_a_valid_emit_is_one_compact_line(host):
    h, _, rr = host
    h.emit(RuntimeEvent("progress", {"done": 1}))
    assert os.read(rr, 4096) == (b'{"jsonrpc":"2.0","method":"host/emit","params":'
                                 b'{"turnId":"t-1","event":{"type":"progress","data":{"done":1}}}}\n')
