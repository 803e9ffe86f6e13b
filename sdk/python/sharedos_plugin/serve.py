"""``serve(plugin)``: makes a Python program a sharedos runtime plugin.

A plugin is an object with ``manifest() -> RuntimeManifest`` and
``run(request, host, abort) -> Complete | Fail | Escalate``. If ``run`` is a
coroutine function the plugin gets an ``AsyncHost`` and runs on asyncio;
otherwise a ``BlockingHost`` and a thread of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
import traceback
from typing import Any, Dict

from .connection import Connection, Turn, wire_error
from .host import AsyncHost, BlockingHost, outcome_json

PLUGIN_ENV = "SHAREDOS_PLUGIN"
NOT_A_TERMINAL_PROGRAM = (
    "This program is a sharedos runtime plugin. It is meant to be started by a sharedos host, "
    "which talks to it over stdin/stdout; it is not meant to be run by hand "
    "(try: sharedos conformance -- <this command>).")


def started_by_host() -> bool:
    """Whether a host started us: its variable is set and stdin is no terminal."""
    if os.environ.get(PLUGIN_ENV) is None:
        return False
    try:
        return not os.isatty(0)
    except OSError:
        return True


def _take_stdio() -> "tuple[int, int]":
    """Our own handles on fds 0 and 1; fd 1 (and ``print``) then reach stderr,
    so a stray print lands in the log instead of ending the turn."""
    rfd = os.dup(0)
    wfd = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    return rfd, wfd


def _finish(conn: Connection, turn: Turn, rid: Any, outcome: Any) -> None:
    turn.closed = True
    try:
        conn.respond(rid, outcome_json(outcome))
    except Exception as e:  # the plugin returned something that is not an outcome
        conn.respond_error(rid, wire_error("internal", f"the runtime failed: {e}"))


def _failed(conn: Connection, turn: Turn, rid: Any, e: BaseException) -> None:
    turn.closed = True
    traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    conn.respond_error(rid, wire_error("internal", f"the runtime failed: {e!r}"[:4096]))


def _many_turns(plugin: Any) -> bool:
    """``plugin.many_turns`` (an attribute or a method), ``False`` if absent:
    whether it may serve several turns of one session in one process
    (docs/PROTOCOL.md section 4.6)."""
    many = getattr(plugin, "many_turns", False)
    return bool(many() if callable(many) else many)


def serve(plugin: Any) -> int:
    """Serves ``plugin`` on stdin/stdout until the host closes stdin.

    Returns the exit status (use ``sys.exit(serve(MyPlugin()))``): 2 when
    run by hand, with one line saying what this program is.
    """
    if not started_by_host():
        print(NOT_A_TERMINAL_PROGRAM, file=sys.stderr)
        return 2
    manifest = plugin.manifest().to_json()
    rfd, wfd = _take_stdio()
    if inspect.iscoroutinefunction(plugin.run):
        return asyncio.run(_serve_async(plugin, manifest, rfd, wfd))
    return _serve_blocking(plugin, manifest, rfd, wfd)


def _serve_blocking(plugin: Any, manifest: Dict[str, Any], rfd: int, wfd: int) -> int:
    workers = []

    def start(conn: Connection, turn: Turn, request: Dict[str, Any], rid: Any) -> None:
        def body() -> None:
            try:
                outcome = plugin.run(request, BlockingHost(conn, turn), turn.abort)
            except BaseException as e:  # noqa: BLE001 - reported to the host as a failure
                _failed(conn, turn, rid, e)
                return
            _finish(conn, turn, rid, outcome)

        worker = threading.Thread(target=body, name="sharedos-turn", daemon=True)
        workers.append(worker)
        worker.start()

    conn = Connection(manifest, rfd, wfd, start, _many_turns(plugin))
    conn.read_until_eof()
    for worker in workers:
        worker.join(timeout=1.0)
    return 0


async def _serve_async(plugin: Any, manifest: Dict[str, Any], rfd: int, wfd: int) -> int:
    loop = asyncio.get_running_loop()
    tasks = []

    async def body(conn: Connection, turn: Turn, request: Dict[str, Any], rid: Any) -> None:
        try:
            outcome = await plugin.run(request, AsyncHost(conn, turn), turn.abort)
        except BaseException as e:  # noqa: BLE001 - reported to the host as a failure
            _failed(conn, turn, rid, e)
            return
        _finish(conn, turn, rid, outcome)

    def start(conn: Connection, turn: Turn, request: Dict[str, Any], rid: Any) -> None:
        def spawn() -> None:
            tasks.append(loop.create_task(body(conn, turn, request, rid)))

        loop.call_soon_threadsafe(spawn)

    conn = Connection(manifest, rfd, wfd, start, _many_turns(plugin))
    await loop.run_in_executor(None, conn.read_until_eof)
    if tasks:
        await asyncio.wait(tasks, timeout=1.0)
    return 0
