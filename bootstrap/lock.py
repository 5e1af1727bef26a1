"""The cross-process bootstrap lock: an OS lock beside the venv plus a record of its holder.

The lock file is a sibling of the venv (``<venv>.lock``), never inside it: a rebuild replaces
the venv directory, and a lock inside it would stop excluding anyone. It is an flock, so the
kernel releases it when the holder dies, even by SIGKILL; we never delete the file. The wait is
bounded: the system we replace waited forever and one user's kernel hung for 17 minutes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bootstrap import log
from bootstrap.errors import LockTimeout

ANNOUNCE_AFTER: Final = 2.0


def lock_path(venv: Path) -> Path:
    return venv.with_name(venv.name + ".lock")


def holder_path(venv: Path) -> Path:
    return venv.with_name(venv.name + ".lock.holder")


@dataclass(frozen=True)
class LockInfo:
    held: bool
    pid: int | None


def read_holder(venv: Path) -> int | None:
    """The pid recorded by the last holder; None when absent or unreadable."""
    try:
        obj = json.loads(holder_path(venv).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    pid = obj.get("pid") if isinstance(obj, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def probe(venv: Path) -> LockInfo:
    """Whether someone holds the lock, without waiting and without creating anything."""
    path = lock_path(venv)
    if sys.platform == "win32" or not path.exists():
        return LockInfo(False, None)
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return LockInfo(False, None)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return LockInfo(True, read_holder(venv))
    finally:
        os.close(fd)  # closing drops our probe lock too
    return LockInfo(False, None)


@contextlib.contextmanager
def hold(venv: Path, timeout: float, purpose: str = "bootstrap") -> Iterator[None]:
    """Hold the lock for ``venv``; say once who we wait for; give up after ``timeout`` s."""
    from filelock import FileLock, Timeout

    venv.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path(venv), timeout=timeout)
    started = time.monotonic()
    try:
        lock.acquire(timeout=min(ANNOUNCE_AFTER, timeout))
    except Timeout:
        pid = read_holder(venv)
        log.warning("waiting for the bootstrap lock", holder_pid=pid, lock=str(lock_path(venv)),
                    timeout_s=timeout)
        try:
            lock.acquire(timeout=max(0.0, timeout - (time.monotonic() - started)))
        except Timeout:
            raise LockTimeout(_timeout_message(venv, timeout, read_holder(venv))) from None
    try:
        _write_holder(venv, purpose)
        yield
    finally:
        with contextlib.suppress(OSError):
            holder_path(venv).unlink()
        lock.release()


def _timeout_message(venv: Path, timeout: float, pid: int | None) -> str:
    who = f"pid {pid}" if pid else "another process"
    return (
        f"timed out after {timeout:g} s waiting for the bootstrap lock of {venv}, held by {who}. "
        f"See `kernel-bootstrap status`; if {who} is stuck, stop it "
        f"({'kill ' + str(pid) if pid else 'find it with lsof ' + str(lock_path(venv))}), "
        "or pass --lock-timeout SECONDS to wait longer."
    )


def _write_holder(venv: Path, purpose: str) -> None:
    record = {"pid": os.getpid(), "started": time.time(), "purpose": purpose,
              "argv": sys.argv[:8]}
    # Not atomic on purpose: it is advisory (status only trusts it while the lock is held) and
    # a torn record reads as "unknown pid", never as an error.
    with contextlib.suppress(OSError):
        holder_path(venv).write_text(json.dumps(record), encoding="utf-8")
