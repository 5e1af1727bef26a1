"""What a test leaves running: its processes carry a tag in their environment, and every one
still alive when the test ends is killed.

A test that failed half-way (a signal its child ignored, a timeout) used to leave ``ensure``
and its uv running for good, holding locks and CPU while the rest of the suite ran. Neither
the test's process groups nor pytest's descendants find them all: a child in a session of its
own starts uv in a group of its own, and a killed parent's children are reparented away from
pytest. The environment survives both: every child a test starts inherits ``os.environ`` (or
a copy of it, as ``World.env``), and kernel-bootstrap keeps unknown variables for its own
children. Linux only (it reads /proc); elsewhere nothing is found.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Final

TAG: Final = "KB_TEST_PROCESS_TAG"  # not KERNEL_BOOTSTRAP_*: no setting of the tool
_counter = itertools.count()


def new_tag() -> str:
    """A value of :data:`TAG` no other test of any worker uses."""
    return f"{os.getpid()}-{next(_counter)}"


def tagged(tag: str) -> list[tuple[int, str]]:
    """The live processes (zombies have no environment) whose environment has ``TAG=tag``, as
    (pid, command line); not this process."""
    wanted = f"{TAG}={tag}".encode()
    found = []
    for entry in _pids():
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # it ended while we looked, or it is another user's
        found.append((entry, cmdline))
    return found


def kill_tagged(tag: str, rounds: int = 100) -> list[str]:
    """SIGKILL every process :func:`tagged` finds, until none is left (a dying parent may have
    started one more); returns them as ``pid command`` lines."""
    killed: list[str] = []
    for _ in range(rounds):
        found = tagged(tag)
        if not found:
            return killed
        for pid, cmdline in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.append(f"{pid} {cmdline}")
        time.sleep(0.01)  # until the kernel has turned them into zombies
    raise AssertionError(f"processes tagged {tag} kept appearing: {killed[-5:]}")


def _pids() -> list[int]:
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    me = os.getpid()
    return [int(e) for e in entries if e.isdigit() and int(e) != me]
