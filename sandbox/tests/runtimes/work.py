# Real work for the seccomp allowlist test: threads, a process pool,
# subprocesses, file I/O in the working directory (the workspace) and /tmp, timers, asyncio, JSON,
# hashing and the environment. Prints one JSON line; exits 0.
import asyncio
import concurrent.futures
import ctypes
import errno
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time


def digest(n):
    return hashlib.sha256(str(n).encode() * 1000).hexdigest()[:8]


def square(n):
    return n * n


async def tick(i):
    await asyncio.sleep(0.01 * i)
    return i


async def main_async():
    got = await asyncio.gather(*(tick(i) for i in range(3)))
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", "echo async:$((2+3))", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return sum(got), out.decode().strip(), proc.returncode


def main():
    r = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as ex:
        r["threads"] = list(ex.map(digest, range(4)))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        r["pool"] = pool.map(square, range(5))
    r["sh"] = subprocess.run(
        ["/bin/sh", "-c", "echo sub:$((6*7))"], capture_output=True, text=True, check=True
    ).stdout.strip()
    r["self"] = subprocess.run(
        [sys.executable, "-c", "print(2**10)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with open("py-out.json", "w") as f:
        json.dump({"k": [1, 2, 3]}, f)
    with open("py-out.json") as f:
        r["ws"] = json.load(f)["k"]
    with tempfile.NamedTemporaryFile("w+", dir="/tmp") as t:
        t.write("tmp-ok")
        t.flush()
        t.seek(0)
        r["tmp"] = t.read()
    fired = threading.Event()
    threading.Timer(0.02, fired.set).start()
    t0 = time.monotonic()
    time.sleep(0.02)
    r["timer"] = fired.wait(5) and time.monotonic() >= t0
    r["asyncio"] = list(asyncio.run(main_async()))
    r["env"] = os.environ.get("SHAREDOS_RUNTIME_PROBE")
    r["random"] = len(os.urandom(16))
    libc = ctypes.CDLL(None, use_errno=True)
    r["unknown_syscall"] = errno.errorcode.get(ctypes.get_errno(), "?") if libc.syscall(470) < 0 else "ran"
    r["sha"] = hashlib.sha256(b"sharedos").hexdigest()[:16]
    print(json.dumps(r, sort_keys=True))


if __name__ == "__main__":
    main()
