"""Crash-safe file and directory replacement.

Everything that another process reads while we change it goes through here: a reader sees the
old bytes or the new bytes, never a mix, and a crash at any instant leaves one of the two.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Final

from bootstrap.errors import BootstrapError
from bootstrap.primitives.fs import fsync_dir, temp_name, write_file


class DiskError(BootstrapError, OSError):
    """A failed write or swap, with a message that names what failed and what was kept.

    Still an OSError with the errno, so code that handled the bare OSError still does; the CLI
    prints it as one line (exit 1), as for every BootstrapError.
    """

    def __init__(self, message: str, cause: OSError) -> None:
        super().__init__(message)
        self.errno = cause.errno

    def __str__(self) -> str:
        return str(self.args[0])


WRITE_ATTEMPTS: Final = 3
RETRY_DELAY: Final = 0.05
_RENAME_EXCHANGE: Final = 2
_AT_FDCWD: Final = -100
# SYS_renameat2 per architecture, for a libc that predates its wrapper (glibc < 2.28).
_SYS_RENAMEAT2: Final = {"x86_64": 316, "aarch64": 276, "i686": 353, "armv7l": 382}
_UNSUPPORTED: Final = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


@contextlib.contextmanager
def writing(path: Path, *, durable: bool = True) -> Iterator[BinaryIO]:
    """A new file whose bytes replace ``path`` only once the block ends without an error.

    For content streamed in (a snapshot archive of hundreds of MB) where :func:`write_atomic`
    would need it all in memory. The temp file is a :func:`fs.temp_name` sibling, so a killed
    writer's leftover names its pid; on any error it is removed and ``path`` is untouched.
    ``durable`` fsyncs the file before the rename and the directory after it: a power loss
    then leaves the old bytes or the new, never an empty file under the new name.
    """
    tmp = temp_name(path)
    try:
        with open(tmp, "xb") as out:
            yield out
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes, *, attempts: int = WRITE_ATTEMPTS,
                 durable: bool = True, sync_dir: bool = True, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: temp file beside it, fsync, ``os.replace``, fsync dir.

    Writing in place would leave a truncated file if we were killed mid-write (the marker of a
    SIGKILLed session must stay valid). The replace is retried because on Windows it fails while
    a reader holds the file open; if every attempt fails the temp file is removed, ``path`` keeps
    its previous bytes, and the last error is raised. ``durable`` as for :func:`writing`.
    ``sync_dir=False`` (with ``durable``) leaves the directory's fsync to the caller: for
    several files of one directory, one fsync after the last rename makes every rename before
    it durable. Until then a power loss leaves the old bytes or the new (the file's are synced
    before its rename), so nothing that depends on the new bytes may be written before it.
    """
    tmp = temp_name(path)
    try:
        for attempt in range(1, attempts + 1):
            try:
                write_file(tmp, data, sync=durable, mode=mode)
                os.replace(tmp, path)
                break
            except OSError as e:
                if attempt < attempts:
                    time.sleep(RETRY_DELAY)
                    continue
                if e.errno is None:
                    raise
                raise _naming(e, path) from e
    finally:
        if tmp.exists():
            _unlink_quietly(tmp)
    if not (durable and sync_dir):
        return
    try:
        fsync_dir(path.parent)
    except OSError as e:
        if e.errno is None:
            raise
        raise _naming(e, path.parent) from e


def _naming(e: OSError, path: Path) -> OSError:
    """``e`` about ``path``: os.write and os.fsync name no file at all, and the temp file a
    failed replace names is gone by the time anyone reads the message (a full disk used to
    print "[Errno 28] No space left on device" and nothing else)."""
    return OSError(e.errno, e.strerror, str(path))  # keeps the subclass: PermissionError, ...


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


_renameat2: Callable[..., int] | None = None


def _load_renameat2() -> Callable[..., int]:
    # ctypes (~2 ms to import) only when a swap needs it; the interpreter's own symbols include
    # libc's, where ctypes.util.find_library("c") would run `ldconfig -p` in a child.
    import ctypes

    global _renameat2
    if _renameat2 is None:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, "renameat2", None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
            fn.restype = ctypes.c_int
            _renameat2 = fn
        else:
            _renameat2 = libc.syscall
    return _renameat2


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths; False where the OS or filesystem cannot.

    Uses Linux ``renameat2(RENAME_EXCHANGE)``: at every instant both names exist, so a reader of
    ``b`` sees the old tree or the new one, never nothing (rename-aside has that window).
    ``KERNEL_BOOTSTRAP_NO_EXCHANGE=1`` forces the fallback, for tests and for debugging.
    """
    if not sys.platform.startswith("linux") or os.environ.get("KERNEL_BOOTSTRAP_NO_EXCHANGE"):
        return False
    fn = _load_renameat2()
    src, dst = os.fsencode(a), os.fsencode(b)
    libc_fn = getattr(fn, "argtypes", None) is not None
    if libc_fn:
        rc = fn(_AT_FDCWD, src, _AT_FDCWD, dst, _RENAME_EXCHANGE)
    else:
        nr = _SYS_RENAMEAT2.get(os.uname().machine)
        if nr is None:
            return False
        rc = fn(nr, _AT_FDCWD, src, _AT_FDCWD, dst, _RENAME_EXCHANGE)
    if rc == 0:
        return True
    import ctypes

    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))
