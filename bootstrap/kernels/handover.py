"""``serve`` under a supervisor, when the venv's server lock is held already (issue 35, item 8).

A foreground server (``kernel-bootstrap serve``) used to exit 0 at once when another server held
the lock: under README's ``Restart=always`` unit, a restart storm until systemd gave up, whenever
a kernel start had spawned a detached server first. Now it takes the lock over: the holder,
asked over its socket, is a detached server (SIGTERM: it retires, lets go of the lock at once
and stays only until its kernels end) or another ``serve`` in the foreground, someone else's to
stop (waited for, as is a server that does not answer yet: it is still starting up).

The pid signalled is the one the server's own answer gives, through the checked server
directory: never one read from a file (the ``lock``'s pid line is for people).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

from bootstrap.kernels.serverlog import say

POLL = 0.2  # between attempts at the lock: a retiring server lets go of it at once


def take_lock(dirfd: int, lock: Callable[[int], int | None]) -> int:
    """The server lock's descriptor (``lock(dirfd)``: None while another holds it), once this
    process holds it; the holder is stopped when it is a detached server (see the module
    docstring)."""
    # ^C at a terminal while it waits ends it as SIGINT ends any process: no traceback.
    interrupt = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        return _wait(dirfd, lock)
    finally:
        signal.signal(signal.SIGINT, interrupt)


def _wait(dirfd: int, lock: Callable[[int], int | None]) -> int:
    from bootstrap.kernels import info

    told: set[object] = set()  # the holders said (or done) something about: once each
    while (fd := lock(dirfd)) is None:
        answer = info.query(dirfd) or {}
        pid: int | None = answer.get("pid")
        detached = answer.get("detached")
        if pid is not None and detached is True and pid not in told:
            say(f"taking over from the detached kernel server (pid {pid})")
            with contextlib.suppress(OSError):  # it ended meanwhile
                os.kill(pid, signal.SIGTERM)
        elif pid not in told:
            say("waiting for the kernel server " + (
                f"(pid {pid}) that runs in the foreground to stop" if detached is False
                else "that holds this venv's lock to answer or stop"))
        told.add(pid)
        time.sleep(POLL)
    return fd
