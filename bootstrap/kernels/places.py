"""Where a venv's kernel server lives: ``<user cache dir>/kernels/<venv, escaped>/``, 0700 and
the user's, holding ``sock`` (the AF_UNIX socket), ``lock`` (an flock the live server holds: one
server per venv) and ``log`` (a detached server's stderr).

Only ``os`` (and ``bootstrap.warm``, loaded already wherever this runs from the tool): the client
imports this on the warm path. Paths in a pytest tmp dir exceed the 108 bytes an AF_UNIX address
holds, so the socket is bound and connected through ``/proc/self/fd/<dirfd>/sock``.

Trusted as the tool's other caches are (:mod:`bootstrap.places`, issue 35): the cache root and
``kernels/`` must be this user's (or root's) and writable by nobody else
(:func:`bootstrap.warm.untrusted`), a server directory this user's and 0700. They are reached one
directory descriptor at a time (``O_PATH|O_NOFOLLOW``), so no symlink is followed at any level. A
cache root another user can write means no kernel server at all: that user could rename a server
directory of ours into another venv's place, and our kernel would be forked by its server.
``lock``, ``log`` and ``sock`` are used only as what they must be, a regular file or a socket of
this user's, and opened ``O_NONBLOCK``: a FIFO or a device planted there is refused at once
instead of hanging every kernel start (a FIFO at ``lock`` once did, and hung ``gc``).
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing's import is not paid on the warm path
    from collections.abc import Callable

    Problem = Callable[[os.stat_result], "str | None"]

SOCK = "sock"
LOCK = "lock"
LOG = "log"
PROGRESS = "progress"  # how far a starting server is (bootstrap.kernels.progress)
KERNELS = "kernels"
_MAX_NAME = 200  # as bootstrap.warm's fingerprint names: longer means no server
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Never through a symlink, never blocking (a FIFO's open waits for its other end), never a
# controlling terminal. On the regular files that are all we then keep, O_NONBLOCK does nothing.
_FILE = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


class Untrusted(PermissionError):
    """A directory or file of the server's that is a symlink, not what it must be, someone
    else's, or open to others: no kernel server there."""


def server_dir(venv: str) -> str | None:
    """The server directory of ``venv`` (an absolute path, as the config names it); None when
    its escaped name would be unreasonably long."""
    from bootstrap.warm import cache_dir  # loaded already wherever this runs from the tool

    name = os.path.abspath(venv).replace("%", "%25").replace(os.sep, "%2F")
    if len(name) > _MAX_NAME:
        return None
    return os.path.join(cache_dir(), KERNELS, name)


def open_dir(path: str, *, create: bool) -> int:
    """An ``O_PATH`` descriptor of the server directory ``path`` (``<root>/kernels/<name>``,
    made when ``create``: the root 0755, the rest 0700), reached from the root without following
    a symlink; :class:`Untrusted` when the root, ``kernels/`` or the directory is not one of
    ours (see the module docstring), FileNotFoundError when one is missing."""
    kernels = os.path.dirname(path)
    parent = open_kernels(os.path.dirname(kernels), create=create, name=os.path.basename(kernels))
    try:
        return open_server(parent, os.path.basename(path), create=create)
    finally:
        os.close(parent)


def open_kernels(root: str, *, create: bool, name: str = KERNELS) -> int:
    """An ``O_PATH`` descriptor of ``root/kernels``, both checked as the tool's caches are."""
    if create:
        # The root's parents as the rest of the tool makes them; the root never open to others.
        os.makedirs(os.path.dirname(root), exist_ok=True)
        _mkdir(root, 0o755, None)
    fd = _opened(root, None, _shared_problem)
    try:
        if create:
            _mkdir(name, 0o700, fd)
        return _opened(name, fd, _shared_problem, shown=os.path.join(root, name))
    finally:
        os.close(fd)


def open_server(kernels: int, name: str, *, create: bool = False) -> int:
    """An ``O_PATH`` descriptor of the server directory ``name`` in ``kernels`` (a descriptor),
    this user's and 0700."""
    if create:
        _mkdir(name, 0o700, kernels)
    return _opened(name, kernels, _private_problem)


def _mkdir(name: str, mode: int, dir_fd: int | None) -> None:
    try:  # noqa: SIM105  # contextlib: an import the warm path does not pay
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        pass  # whatever is there is checked next


def _opened(name: str, dir_fd: int | None, problem: Problem, shown: str | None = None) -> int:
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except NotADirectoryError as e:  # O_NOFOLLOW: a symlink is not a directory either
        raise Untrusted(1, "is a symbolic link or not a directory", shown or name) from e
    why = problem(os.fstat(fd))
    if why is not None:
        os.close(fd)
        raise Untrusted(1, why, shown or name)  # 1: EPERM (errno: an import not paid)
    return fd


def _shared_problem(st: os.stat_result) -> str | None:
    from bootstrap.warm import untrusted

    return "is not a directory" if not stat.S_ISDIR(st.st_mode) else untrusted(st)


def _private_problem(st: os.stat_result) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return "is not a directory of this user's closed to others"
    return None


def open_file(name: str, flags: int, dir_fd: int | None = None) -> int:
    """``name`` (``lock`` or ``log``) opened with ``flags`` (and ``O_CREAT`` made 0600),
    without following a symlink or blocking; :class:`Untrusted` unless it is a regular file of
    this user's (a FIFO, a device, a symlink). Looked at before it is opened (a device is never
    opened: that alone may act) and after (what was opened)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(1, "is not a regular file of this user's", name)
    fd = os.open(name, flags | _FILE, 0o600, dir_fd=dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise Untrusted(1, "is not a regular file of this user's", name)
    return fd


def write_record(name: str, fields: dict[str, object], dir_fd: int) -> None:
    """Write ``name`` (a regular file of ours, :func:`open_file`) as one line of
    ``key=value`` pairs ending in ``end=1``; best effort. One small ``pwrite``: a reader sees
    the old line or the new one, and a torn read misses ``end``."""
    line = (" ".join(f"{k}={v}" for k, v in fields.items()) + " end=1\n").encode()
    try:
        fd = open_file(name, os.O_WRONLY | os.O_CREAT, dir_fd=dir_fd)
    except OSError:
        return
    try:
        os.pwrite(fd, line, 0)
        os.ftruncate(fd, len(line))
    except OSError:
        pass
    finally:
        os.close(fd)


def read_record(name: str, dir_fd: int) -> dict[str, str]:
    """What :func:`write_record` wrote in ``name``; empty when there is none (or a torn one)."""
    try:
        fd = open_file(name, os.O_RDONLY, dir_fd=dir_fd)
    except OSError:
        return {}
    try:
        data = os.read(fd, 4096)
    except OSError:
        return {}
    finally:
        os.close(fd)
    pairs = [p.split("=", 1) for p in data.decode(errors="replace").split("\n")[0].split()]
    record = {p[0]: p[1] for p in pairs if len(p) == 2}
    return record if record.pop("end", None) == "1" else {}


def server_running(lock: str, dir_fd: int | None = None) -> bool:
    """Whether a server holds the ``lock`` file (a path, or a name in ``dir_fd``): one that is
    starting holds it before it listens. A ``lock`` that is not a regular file of ours is no
    server's (:func:`open_file`): the answer is at once."""
    import fcntl

    try:
        fd = open_file(lock, os.O_RDONLY, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def ours(dirfd: int, name: str, kinds: tuple[int, ...]) -> bool:
    """Whether ``name`` in ``dirfd`` is, itself (not what a symlink names), one of ``kinds``
    (``stat.S_IFSOCK``, ...) and this user's."""
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_IFMT(st.st_mode) in kinds and st.st_uid == os.geteuid()


def sock_path(dirfd: int) -> str:
    """The socket's address through the directory's descriptor (short, whatever the path)."""
    return f"/proc/self/fd/{dirfd}/{SOCK}"


def connect_path(dirfd: int) -> str:
    """:func:`sock_path`, once ``sock`` is a socket of ours: ``connect`` follows a symlink, and
    one there would hand our request (and our descriptors) to whatever socket it names."""
    if not ours(dirfd, SOCK, (stat.S_IFSOCK,)):
        raise Untrusted(1, "is not a socket of this user's", SOCK)
    return sock_path(dirfd)
