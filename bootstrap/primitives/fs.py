"""Filesystem primitives every other module uses: reading our own state files safely, writing
all of a buffer, removing trees, cleaning up on failure, temp names and pid liveness.

There is one of each on purpose. The copies these replaced had drifted: one rmtree followed a
planted symlink, one pid check called a zombie dead, one write loop forgot ``fsync``. The safety
rule they serve is in ``docs/architecture.md`` ("What the tool trusts on disk"): every file we
read from our own places is opened without following symlinks and without blocking, checked to
be a regular file and read with a size cap; everything we remove lies inside our own places.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

# Our state files are small: the marker of 1,000 skills is ~300 KiB. Anything near this is not
# ours, and reading a planted /dev/zero whole once took 10.9 GB before MemoryError.
STATE_FILE_LIMIT: Final = 16 * 1024 * 1024
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_BINARY: Final = getattr(os, "O_BINARY", 0)
# statx(2): struct statx is 256 bytes; stx_btime (a statx_timestamp: s64 seconds, u32 nanoseconds)
# sits at byte 80, after mask, blksize, attributes, nlink, uid, gid, mode, ino, size, blocks,
# attributes_mask and atime.
_AT_FDCWD: Final = -100
_STATX_BTIME: Final = 0x800
_STATX_SIZE: Final = 256
_STATX_BTIME_OFFSET: Final = 80


class NotRegularFile(OSError):
    """One of our state files is a symlink, FIFO, device or directory: not something we wrote."""


def read_state_file(path: Path, limit: int = STATE_FILE_LIMIT) -> bytes:
    """The bytes of ``path``, a file one of our earlier runs wrote; OSError if it is not one.

    Opened with ``O_NOFOLLOW`` (a planted symlink to /dev/zero or to a victim file is refused,
    not read) and ``O_NONBLOCK`` (a FIFO cannot hang us), then checked to be a regular file and
    read with a cap. Callers treat any OSError as "unreadable": a warning, never a hang.
    """
    fd = open_regular(path)
    try:
        if os.fstat(fd).st_size > limit:
            raise NotRegularFile(errno.EFBIG, f"is larger than {limit} bytes", str(path))
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # the size can grow after fstat: the cap holds regardless
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise NotRegularFile(errno.EFBIG, f"is larger than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_regular(path: Path, *, follow: bool = False) -> int:
    """A read-only descriptor of ``path`` if it is a regular file; NotRegularFile otherwise.

    Never blocks (a FIFO opens at once and is refused) and, unless ``follow``, never follows a
    symlink at ``path`` itself. The caller closes the descriptor.
    """
    nofollow = 0 if follow else _NOFOLLOW
    if not follow and _NOFOLLOW == 0 and os.path.islink(path):  # Windows: check first
        raise NotRegularFile(errno.ELOOP, "is a symbolic link, not a file we wrote", str(path))
    try:
        fd = os.open(path, os.O_RDONLY | nofollow | _NONBLOCK | _CLOEXEC | _BINARY)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise NotRegularFile(errno.ELOOP, "is a symbolic link, not a file we wrote",
                                 str(path)) from e
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, f"is a {_kind(mode)}, not a regular file",
                                 str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def special_kind(path: Path) -> str | None:
    """What ``path`` is when it is there but is not a regular file (a link is followed): "FIFO",
    "character device", "directory", ...; None for a regular file, and for nothing at all."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def is_real_dir(path: Path) -> bool:
    """A directory that is not a symlink (a symlink to a directory is someone else's tree)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


@functools.cache
def libc_function(name: str) -> Any | None:
    """The C library's function ``name`` through ctypes (errno kept for ``ctypes.get_errno``),
    looked up once; None where the C library has none. Cold paths only: ``import ctypes`` costs
    ~4 ms."""
    import ctypes

    return getattr(ctypes.CDLL(None, use_errno=True), name, None)


def birth_time_ns(path: Path) -> int | None:
    """When ``path`` (followed if a symlink) was created, in ns since the epoch; None where the
    C library, the kernel or the file system does not record it.

    ``os.stat`` has no birth time on Linux, so this asks ``statx(2)`` (Linux >= 4.11, glibc >=
    2.28) for ``STATX_BTIME``. Cold paths only: ``import ctypes`` costs ~4 ms.
    """
    import ctypes
    import struct

    statx = libc_function("statx")
    if statx is None:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if statx(_AT_FDCWD, os.fsencode(path), 0, _STATX_BTIME, buf) != 0:
        return None
    (mask,) = struct.unpack_from("=I", buf, 0)
    if not mask & _STATX_BTIME:
        return None
    seconds, nanos = struct.unpack_from("=qI", buf, _STATX_BTIME_OFFSET)
    return int(seconds) * 1_000_000_000 + int(nanos)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte: ``os.write`` may write less than it was given."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file(path: Path, data: bytes, *, exclusive: bool = False, sync: bool = False,
               mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` (created with ``mode``); ``sync`` fsyncs it before closing.

    ``exclusive`` refuses an existing path (and a symlink planted there) instead of truncating
    it. A failed write names the file: ``write(2)`` and ``fsync(2)`` name none, and a full disk
    once printed a bare "[Errno 28] No space left on device".
    """
    flags = os.O_WRONLY | os.O_CREAT | _CLOEXEC | _BINARY
    flags |= (os.O_EXCL | _NOFOLLOW) if exclusive else os.O_TRUNC
    fd = os.open(path, flags, mode)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    except OSError as e:
        e.filename = e.filename or str(path)
        raise
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable (no-op where directories cannot be opened)."""
    if sys.platform == "win32":
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def owned_token() -> str:
    """``<pid>-<token>``: unique, and naming the process that made it, so whatever carries it
    can be traced to its writer and reaped once that process is gone. Every temp, staging and
    retired name the tool makes ends with one."""
    # os.urandom, not secrets: the same bytes, without importing hmac and friends (~3 ms).
    return f"{os.getpid()}-{os.urandom(4).hex()}"


def temp_name(path: Path, tag: str = "tmp") -> Path:
    """A unique hidden sibling of ``path`` naming its writer's pid:
    ``.<name>.<tag>-<pid>-<token>``."""
    return path.with_name(f".{path.name}.{tag}-{owned_token()}")


def owner_pid(name: str, tag: str = "") -> int | None:
    """The pid in a name ``...<tag>-<pid>-<token>`` (:func:`temp_name`), or ``<pid>-<token>``
    with no tag (:func:`owned_token`); None if absent."""
    _, sep, rest = name.rpartition(f"{tag}-") if tag else ("", "-", name)
    pid_text = rest.split("-", 1)[0]
    return int(pid_text) if sep and pid_text.isdigit() and int(pid_text) > 0 else None


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` names a process; a zombie counts as alive (its parent has yet to reap it,
    so whatever it left may still be in use by a process tree we cannot see)."""
    if pid is None or pid <= 0:
        return False
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate it there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_tree(path: Path) -> None:
    """Remove ``path`` without ever following a symlink: a link is unlinked, never walked.

    Directories we made read-only (copied modes) are made writable on the way down, inside
    the tree only; a missing path is fine. Raises OSError when something could not go.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    top = os.path.abspath(path)

    def make_writable(func: Callable[..., Any], target: str, _exc: Any) -> None:
        # Deleting an entry needs write permission on its directory, which lies inside `top`
        # (rmtree never leaves the tree it was given, and never follows links).
        parent = os.path.dirname(os.path.abspath(target))
        if parent == top or parent.startswith(top + os.sep):
            with contextlib.suppress(OSError):
                os.chmod(parent, 0o700)
        func(target)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable)
    else:
        shutil.rmtree(path, onerror=make_writable)


def remove_quietly(path: Path) -> bool:
    """:func:`remove_tree` for tidying up: a failure is reported as False, never raised."""
    try:
        remove_tree(path)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def removed_on_failure(path: Path) -> Iterator[Path]:
    """Remove ``path`` if the block fails in any way: an error, ^C, SystemExit.

    BaseException on purpose: a half-built tree must not outlive an interrupt either. A SIGKILL
    leaves it; the owner's pid in its name lets the next run reap it.
    """
    try:
        yield path
    except BaseException:
        remove_quietly(path)
        raise


@contextlib.contextmanager
def removed_on_exit(path: Path) -> Iterator[Path]:
    """Remove ``path`` however the block ends (scratch space that never outlives its user)."""
    try:
        yield path
    finally:
        remove_quietly(path)
