"""The cross-process bootstrap lock: an OS lock beside the venv plus a record of its holder.

The lock file is a sibling of the venv (``<venv>.lock``), never inside it: a rebuild replaces
the venv directory, and a lock inside it would stop excluding anyone. It is an flock, so the
kernel releases it when the holder dies, even by SIGKILL; we never delete the file. The wait is
bounded: the system we replace waited forever and one user's kernel hung for 17 minutes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from bootstrap import log
from bootstrap.errors import LockTimeout

if TYPE_CHECKING:
    from filelock import BaseFileLock

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
    except OSError as e:
        # Some filesystems report contention as EACCES rather than EWOULDBLOCK.
        if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return LockInfo(False, None)
        return LockInfo(True, read_holder(venv))
    finally:
        os.close(fd)  # closing drops our probe lock too
    return LockInfo(False, None)


@contextlib.contextmanager
def hold(venv: Path, timeout: float, purpose: str = "bootstrap") -> Iterator[None]:
    """Hold the lock for ``venv``; say once who we wait for; give up after ``timeout`` s."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock = _file_lock(lock_path(venv))
    _acquire(lock, venv, timeout)
    try:
        _write_holder(venv, purpose)
        yield
    finally:
        with contextlib.suppress(OSError):
            holder_path(venv).unlink()
        lock.release()


def _file_lock(path: Path) -> BaseFileLock:
    from filelock import FileLock

    try:
        # preserve_lock_file (filelock >= 4): keep the file on release, so that every waiter
        # locks the same inode (Windows unlinks it by default), and never fall back to a soft
        # lock, which the kernel does not release when its holder is SIGKILLed.
        return FileLock(path, preserve_lock_file=True)
    except TypeError:  # filelock 3: Unix keeps the file and has no soft fallback anyway
        return FileLock(path)


def _acquire(lock: BaseFileLock, venv: Path, timeout: float) -> None:
    """Wait at most ``timeout`` s; say so once, naming the holder, if it takes over ~2 s."""
    started = time.monotonic()
    quiet = min(ANNOUNCE_AFTER, timeout)
    if _try_acquire(lock, quiet):
        return
    if timeout > quiet:
        pid = _holder_now(venv)
        log.warning(f"waiting for {_who(pid)} to release the bootstrap lock", holder_pid=pid,
                    lock=str(lock_path(venv)), timeout_s=timeout)
        if _try_acquire(lock, max(0.0, timeout - (time.monotonic() - started))):
            return
    raise LockTimeout(_timeout_message(venv, timeout, _holder_now(venv)))


def _try_acquire(lock: BaseFileLock, timeout: float) -> bool:
    from filelock import Timeout

    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        return False
    return True


def _holder_now(venv: Path) -> int | None:
    # The holder writes its record just after it gets the lock; a waiter looking in between
    # finds none, so look again briefly before settling for "another process".
    for _ in range(5):
        pid = read_holder(venv)
        if pid is not None:
            return pid
        time.sleep(0.02)
    return None


def _who(pid: int | None) -> str:
    return f"pid {pid}" if pid else "another process"


def _timeout_message(venv: Path, timeout: float, pid: int | None) -> str:
    who = _who(pid)
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
