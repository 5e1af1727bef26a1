"""The kernel server's process, in the venv's interpreter: take the venv's server lock, do a
kernel's start-up that does not depend on the request, listen, serve (:mod:`loop`).

Started by :mod:`bootstrap.kernels.server` as ``<venv>/bin/python -c BOOT serve <package dir>
--config F <settings>``: through ``<venv>/bin/python``, so the generation pin pins it as it pins
any process of the venv, and without a ``sys.path`` entry for the tool (``BOOT`` registers the
``bootstrap`` package by its directory; the forked kernel drops it again).

Before any request: the preload (:mod:`preload`: a kernel's own imports, overlapping the first
start without slowing it, and ``kernel-preload``'s, bounded in time, checked for threads; how far
it is, in ``progress`` for the starts meanwhile: :mod:`progress`), the server's own context and
what it compares requests with (:mod:`admission`), the modules a kernel lists for its debugger
(:mod:`module_list`), then ``gc.freeze()`` so that forked kernels share those pages instead of
copying them at their first collection. No thread, zmq context or event loop exists before a
fork: none survives one.
"""

from __future__ import annotations

import gc
import json
import os
import sys

from bootstrap.kernels import handover, module_list, places, preload, title
from bootstrap.kernels.progress import Progress
from bootstrap.kernels.serverlog import say

# `-c` puts "" (the start's directory) first on sys.path: the server drops it and works in "/",
# so that a `sqlite3.py` where the first kernel started is not what every later kernel imports.
BOOT = ("import os, sys; os.chdir('/'); sys.path[:1] == [''] and sys.path.pop(0); "
        "m = type(sys)('bootstrap'); m.__path__ = [sys.argv[2]]; "
        "sys.modules['bootstrap'] = m; from bootstrap.kernels.template import main; "
        "job = main(sys.argv[3:]); job is None or job()")


def main(argv: list[str]):  # type: ignore[no-untyped-def]  # -> Callable | None, see BOOT
    """The server's main: None when it is done (idle, stale, SIGTERM), or, in a forked kernel,
    what the kernel runs at the top level of ``BOOT`` (so that nothing of the server's stack
    unwinds through the kernel's exit)."""
    settings = json.loads(argv[2])
    directory, detached = settings["dir"], bool(settings.get("detached"))
    title.set_title(["kernel-bootstrap", "kernel", "server", settings["venv"]])  # seen in `ps`
    try:
        dirfd = places.open_dir(directory, create=True)
        if detached:
            _to_log(dirfd)
        lockfd = _lock(dirfd)
        if lockfd is None and not detached:  # `serve` under a supervisor: never exit 0 here
            lockfd = handover.take_lock(dirfd, _lock)
    except OSError as e:
        say(f"cannot use {directory}: {e}")
        sys.exit(1)
    if lockfd is None:  # spawned by a kernel start that raced another: that one serves
        say("another kernel server serves this venv")
        return None
    started = dict(os.environ)
    extras = settings.get("preload", [])
    loaded = preload.run(extras, float(settings.get("preload_timeout", 60)), settings.get("after"),
                         Progress(dirfd, extras))
    if loaded is None:
        sys.exit(1)
    from bootstrap.kernels.admission import Server as Served
    from bootstrap.kernels.key import Key
    from bootstrap.kernels.loop import Server

    key = Key.now(settings["venv"], argv[1])
    served = Served.now(settings["venv"], key.generation, argv[1], started, loaded.not_serving)
    module_list.list_now()
    gc.freeze()
    server = Server(dirfd, lockfd, key, float(settings.get("idle", 900.0)), served, loaded,
                    spares=int(settings.get("spares", 0)))
    server.detached = detached
    return server.run()


def _to_log(dirfd: int) -> None:
    """A detached server's stdin and stdout are /dev/null, its stderr the directory's log
    (restarted when it passed 1 MiB). A ``log`` that is not a regular file of ours (a FIFO
    would hold the server in its open forever) is refused: the server runs without a log."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    try:
        fd = places.open_file(places.LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, dir_fd=dirfd)
        if os.fstat(fd).st_size > 1024 * 1024:
            os.ftruncate(fd, 0)
        os.dup2(fd, 2)
        os.close(fd)
    except OSError:
        pass


def _lock(dirfd: int) -> int | None:
    """The server lock's descriptor, held (with our pid written in it, for ``status`` and
    ``gc``); None when another server holds it. OSError when ``lock`` is not a regular file
    of ours (:func:`bootstrap.kernels.places.open_file`)."""
    import fcntl

    fd = places.open_file(places.LOCK, os.O_RDWR | os.O_CREAT, dir_fd=dirfd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
