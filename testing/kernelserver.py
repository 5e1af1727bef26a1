"""A venv's kernel server seen from outside, as a test or a benchmark needs it: which process it
is, what runs below it, when it is up, stopping it, and waiting until the kernels of a run are
gone.

From outside on purpose: the server is found in /proc (the process of the test's that holds a
``kernels/*/lock`` open, testing.kernels.holds_server_lock), not by trusting what it says of
itself, so that a benchmark counts what the system shows and a test sees a server that stopped
answering. Only "up" asks the server (``bootstrap.kernels.info.describe``): it answers once its
imports are done, and before that it may idle on purpose while the first start settles, which a
CPU-quiet check alone would take for ready. Linux only (it reads /proc).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from testing import kernels


def find(tag: str) -> kernels.Proc | None:
    """The live kernel server among the processes tagged ``tag`` (testing.reaper)."""
    return next((p for p in kernels.of_test(tag) if kernels.holds_server_lock(p.pid)), None)


def tree(tag: str, table: dict[int, kernels.Proc] | None = None) -> set[int]:
    """The server, everything below it, and any tagged process with its command line (a fork of
    it reparented elsewhere); empty without a server."""
    table = kernels.processes() if table is None else table
    server = find(tag)
    if server is None:
        return set()
    forks = {p.pid for p in kernels.of_test(tag, table=table) if p.argv == server.argv}
    return kernels.descendants([server.pid], table) | forks


def wait_up(tag: str, venv: Path, timeout: float = 120.0, spares: int = 0) -> None:
    """Until ``venv``'s server answers with at least ``spares`` spares ready and it and its
    spares used no CPU for 0.5 s (imports, preloads and spares done)."""
    from bootstrap.kernels.info import describe

    deadline = time.monotonic() + timeout
    before = -1.0
    while time.monotonic() < deadline:
        answer = describe(venv)
        up = answer is not None and answer["spares"] >= spares
        pids = tree(tag) if up else set()
        cpu = sum(map(kernels.cpu_seconds, pids)) if pids else -1.0
        if pids and cpu == before:
            return
        before = cpu
        time.sleep(0.5)
    raise RuntimeError("no kernel server came up: is the served path wired into `run`?")


def stop(tag: str, grace: float = 10.0) -> None:
    """SIGTERM the server, if one runs, and wait until it has let go of its lock (its kernels
    live on; it retires, and ends with the last of them)."""
    server = find(tag)
    if server is not None:
        os.kill(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while kernels.holds_server_lock(server.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the kernel server {server.pid} did not stop on SIGTERM")
            time.sleep(0.05)


def settle(tag: str, timeout: float = 10.0) -> None:
    """Until no kernel-like process tagged ``tag`` is left but the server and its spares: a
    kernel still dying must not eat into the next measurement (a served kernel ends within
    ~1 s of its stand-in's SIGKILL)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spares = tree(tag)
        if all(p.pid in spares for p in kernels.kernel_processes(tag)):
            return
        time.sleep(0.05)
    raise RuntimeError("kernels outlived their shutdown")
