"""The cross-process bootstrap lock: an OS lock beside the venv plus a record of its holder.

The lock file is a sibling of the venv (``<venv>.lock``), never inside it: a rebuild replaces
the venv directory, and a lock inside it would stop excluding anyone. It is an flock, so the
kernel releases it when the holder dies, even by SIGKILL; we never delete the file. The wait is
bounded: the system we replace waited forever and one user's kernel hung for 17 minutes.

Every child started while the lock is held inherits its descriptor (``process.inherited``), so
the kernel keeps the lock until the last of them has exited: a SIGKILLed holder's surviving
child (uv's build backend) keeps the next session waiting, never working beside it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from bootstrap.errors import BootstrapError, ConfigError, LockTimeout
from bootstrap.primitives import log
from bootstrap.primitives.fs import pid_alive, read_state_file, remove_quietly, write_file

if TYPE_CHECKING:
    from filelock import BaseFileLock

ANNOUNCE_AFTER: Final = 2.0
VENV_LOCK: Final = "the bootstrap lock"
VENV_ADVICE: Final = ("See `kernel-bootstrap status`; if {who} is stuck, stop it ({stop}), or pass "
                      "--lock-timeout SECONDS to wait longer.")
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)


def lock_path(venv: Path) -> Path:
    return venv.with_name(venv.name + ".lock")


def holder_path(venv: Path) -> Path:
    return _holder_of(lock_path(venv))


def _holder_of(lock_file: Path) -> Path:
    return lock_file.with_name(lock_file.name + ".holder")


@dataclass(frozen=True)
class LockInfo:
    held: bool
    pid: int | None


def read_holder(venv: Path) -> int | None:
    """The pid recorded by the last holder of the venv's lock; None when absent or unreadable."""
    return _read_holder(lock_path(venv))


def _read_holder(lock_file: Path) -> int | None:
    try:
        obj = json.loads(read_state_file(_holder_of(lock_file)))
    except (OSError, ValueError, RecursionError):
        return None
    pid = obj.get("pid") if isinstance(obj, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def inspect(venv: Path) -> LockInfo:
    """Whether someone holds the lock, without waiting and without creating anything."""
    path = lock_path(venv)
    if sys.platform == "win32" or not path.exists():
        return LockInfo(False, None)
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
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
def hold(lock_file: Path, timeout: float, purpose: str = "bootstrap", *,
         name: str = VENV_LOCK, advice: str = VENV_ADVICE) -> Iterator[None]:
    """Hold the OS lock on ``lock_file``; say once who we wait for; give up after ``timeout`` s.

    ``name`` says what is locked and ``advice`` what to do on a timeout (``{who}`` and
    ``{stop}`` are filled in): the defaults are those of the venv's bootstrap lock.
    """
    from bootstrap.primitives import process
    try:
        _make_parent(lock_file.parent)
        _refuse_planted(lock_file)
        lock = _file_lock(lock_file)
        _acquire(lock, lock_file, timeout, name, advice)
    except OSError as e:
        # A read-only volume (readOnlyRootFilesystem) raised a bare "[Errno 30]" through
        # `run`, which starts the earlier runtime only on our own error: the kernel never
        # started.
        raise BootstrapError(f"cannot take {name} ({lock_file}): {e.strerror or e}; nothing "
                             f"was changed. Taking it needs write access to "
                             f"{lock_file.parent}.") from e
    try:
        _write_holder(lock_file, purpose)
        fd = _descriptor(lock, lock_file)
        with process.inherited(fd) if fd is not None else contextlib.nullcontext():
            yield
    finally:
        remove_quietly(_holder_of(lock_file))
        lock.release()


def _descriptor(lock: BaseFileLock, lock_file: Path) -> int | None:
    """The descriptor filelock holds the flock through, checked to be ``lock_file``'s.

    filelock does not publish it; ``_context.lock_file_fd`` has held it since filelock 3.12 (our
    floor) and still does in 4.x. Where it is missing, children just do not extend the lock.
    """
    if sys.platform == "win32":  # msvcrt locks belong to the process, not the open file
        return None
    fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
    if not isinstance(fd, int):
        return None
    try:
        return fd if os.path.samestat(os.fstat(fd), os.stat(lock_file)) else None
    except OSError:
        return None


def _make_parent(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError as e:
        # mkdir reports a symlink loop on the way as "File exists", which said nothing useful.
        try:
            os.stat(directory)
        except OSError as loop:
            if loop.errno == errno.ELOOP:
                raise ConfigError(f"{directory}: the path runs into a symlink loop; point the "
                                  "venv at a directory you can create") from loop
        raise ConfigError(f"{directory}: exists and is not a directory ({e.strerror})") from e


def _refuse_planted(lock_file: Path) -> None:
    """A lock is never taken through a link, nor on what is not a file: say what is there.

    Not replaced: a waiter that unlinked a planted link could, in a race, unlink a real lock
    file another process had just created and locked, and two processes would then each hold
    "the" lock on different inodes. filelock itself only said "[Errno 40] Too many levels of
    symbolic links" or "[Errno 21] Is a directory", with no hint.
    """
    try:
        st = os.lstat(lock_file)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode):
        found, remove = f"a symbolic link (to {_target(lock_file)})", f"rm {lock_file}"
    elif stat.S_ISDIR(st.st_mode):
        found, remove = "a directory", f"rm -r {lock_file}"
    else:
        found, remove = "not a regular file", f"rm {lock_file}"
    raise BootstrapError(f"{lock_file} is {found}, not a lock file: a lock is never taken "
                         f"through it, and nothing was written through it. Remove it ({remove}) "
                         "and run again; if it comes back, find what plants it there.")


def _target(link: Path) -> str:
    try:
        return os.readlink(link)
    except OSError:
        return "?"


def _file_lock(path: Path) -> BaseFileLock:
    from filelock import FileLock

    try:
        # preserve_lock_file (filelock >= 4): keep the file on release, so that every waiter
        # locks the same inode (Windows unlinks it by default), and never fall back to a soft
        # lock, which the kernel does not release when its holder is SIGKILLed.
        return FileLock(path, preserve_lock_file=True)
    except TypeError:  # filelock 3: Unix keeps the file and has no soft fallback anyway
        return FileLock(path)


def _acquire(lock: BaseFileLock, lock_file: Path, timeout: float, name: str,
             advice: str) -> None:
    """Wait at most ``timeout`` s; say so once, naming the holder, if it takes over ~2 s."""
    started = time.monotonic()
    quiet = min(ANNOUNCE_AFTER, timeout)
    if _try_acquire(lock, quiet):
        return
    if timeout > quiet:
        pid = _holder_now(lock_file)
        log.warning(f"waiting for {_who(pid)} to release {name}", holder_pid=pid,
                    lock=str(lock_file), timeout_s=timeout)
        if _try_acquire(lock, max(0.0, timeout - (time.monotonic() - started))):
            return
    pid = _holder_now(lock_file)
    # A holder that exited while what it started goes on (SIGKILLed `ensure`, its uv still
    # installing) still holds the lock through them: only lsof finds them.
    stop = f"kill {pid}" if pid and pid_alive(pid) else f"find them with lsof {lock_file}"
    raise LockTimeout(f"timed out after {timeout:g} s waiting for {name} ({lock_file}), held "
                      f"by {_who(pid)}. " + advice.format(who=_who(pid), stop=stop))


def _try_acquire(lock: BaseFileLock, timeout: float) -> bool:
    from filelock import Timeout

    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        return False
    return True


def _holder_now(lock_file: Path) -> int | None:
    # The holder writes its record just after it gets the lock; a waiter looking in between
    # finds none, so look again briefly before settling for "another process".
    for _ in range(5):
        pid = _read_holder(lock_file)
        if pid is not None:
            return pid
        time.sleep(0.02)
    return None


def _who(pid: int | None) -> str:
    if pid and not pid_alive(pid):
        return f"what pid {pid} started (pid {pid} has exited)"
    return f"pid {pid}" if pid else "another process"


def _write_holder(lock_file: Path, purpose: str) -> None:
    """Record who holds the lock. Advisory: status trusts it only while the lock is held, and a
    torn or missing record reads as "unknown pid", never as an error."""
    record = json.dumps({"pid": os.getpid(), "started": time.time(), "purpose": purpose,
                         "argv": sys.argv[:8]}).encode()
    path = _holder_of(lock_file)
    # Unlink, then create exclusively without following links: whatever was planted at this
    # name (a symlink or hard link to someone's file) loses its name and is never written
    # through. Only the lock holder writes here, so losing the race to a planter just means
    # no record this time.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        write_file(path, record, exclusive=True)
