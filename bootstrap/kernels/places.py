"""Where a venv's kernel server lives: ``<user cache dir>/kernels/<venv, escaped>/``, 0700 and
the user's, holding ``sock`` (the AF_UNIX socket), ``lock`` (an flock the live server holds: one
server per venv) and ``log`` (a detached server's stderr).

Only ``os``: the client imports this on the warm path. Paths in a pytest tmp dir exceed the
108 bytes an AF_UNIX address holds, so the socket is bound and connected through
``/proc/self/fd/<dirfd>/sock``, with the directory opened ``O_PATH`` without following a
symlink and checked to be the user's and closed to others: a directory someone else made (or a
symlink to one) is no place to put a socket that runs code.
"""

from __future__ import annotations

import os
import stat

SOCK = "sock"
LOCK = "lock"
LOG = "log"
_MAX_NAME = 200  # as bootstrap.warm's fingerprint names: longer means no server


def server_dir(venv: str) -> str | None:
    """The server directory of ``venv`` (an absolute path, as the config names it); None when
    its escaped name would be unreasonably long."""
    from bootstrap.warm import cache_dir  # loaded already wherever this runs from the tool

    name = os.path.abspath(venv).replace("%", "%25").replace(os.sep, "%2F")
    if len(name) > _MAX_NAME:
        return None
    return os.path.join(cache_dir(), "kernels", name)


def open_dir(path: str, *, create: bool) -> int:
    """An ``O_PATH`` descriptor of the server directory ``path`` (made, 0700, with its parents
    when ``create``); OSError when it is missing, a symlink, not ours or open to others."""
    if create:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:  # noqa: SIM105  # contextlib: an import the warm path does not pay
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        os.close(fd)
        raise PermissionError(f"{path}: not a directory of this user's closed to others")
    return fd


def server_running(lock: str, dir_fd: int | None = None) -> bool:
    """Whether a server holds the ``lock`` file (a path, or a name in ``dir_fd``): one that is
    starting holds it before it listens."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def sock_path(dirfd: int) -> str:
    """The socket's address through the directory's descriptor (short, whatever the path)."""
    return f"/proc/self/fd/{dirfd}/{SOCK}"
