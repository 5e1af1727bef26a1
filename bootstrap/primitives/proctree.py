"""A child's process tree, found through /proc, frozen and killed whole (Linux).

Stopping uv must stop what uv started (its build backends), and they stay in our process group
(see process.py), so ``killpg`` is not the tool: it would take us and whatever shares our
group (the shell script that started us) with them. The tree is found by parent pid instead,
each process frozen as it is found (SIGSTOP: a stopped process neither forks nor exits, so its
children keep it as their parent until we have found them all), then all are killed at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Final

GONE_TIMEOUT: Final = 5.0  # how long killed processes may take to leave the process table
_MAX_LOOKS: Final = 10  # a tree that forks as fast as we look: stop looking somewhere


def kill(root: int, reap: Callable[[], object]) -> None:
    """SIGKILL ``root`` and its descendants; ``reap`` (root's parent waiting for it) is called
    before waiting, bounded, for the rest to leave the process table (init reaps orphans)."""
    tree = frozen(root)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    reap()
    deadline = time.monotonic() + GONE_TIMEOUT
    while any(alive(pid) for pid in tree[1:]) and time.monotonic() < deadline:
        time.sleep(0.005)


def frozen(root: int) -> list[int]:
    """``root`` and every descendant, each stopped; looks again until a look finds nothing new
    (a child may fork between a look and its stop)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(root, signal.SIGSTOP)  # at once: reading /proc takes a few ms
    stopped = [root]
    for _ in range(_MAX_LOOKS):
        new = [pid for pid in descendants(root) if pid not in stopped]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped += new
    return stopped


def descendants(root: int) -> list[int]:
    """``root`` (if alive) and its live descendants, parents first."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = [root] if alive(root) else []
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo += children.get(pid, [])
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _parents() -> Iterator[tuple[int, int]]:
    """(pid, parent pid) of every live process."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] not in ("Z", "X"):
                yield int(entry), int(fields[1])


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(b")") + 2:].decode(errors="replace").split()
