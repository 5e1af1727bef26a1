"""The kernel server's process, in the venv's interpreter: take the venv's server lock, do a
kernel's start-up that does not depend on the request, listen, serve (:mod:`loop`).

Started by :mod:`bootstrap.kernels.server` as ``<venv>/bin/python -c BOOT serve <package dir>
--config F <settings>``: through ``<venv>/bin/python``, so the generation pin pins it as it pins
any process of the venv, and without a ``sys.path`` entry for the tool (``BOOT`` registers the
``bootstrap`` package by its directory; the forked kernel drops it again).

Before any request: ipykernel and what ``IPKernelApp.initialize()`` imports (measured: 0.9 s
import + 0.8 s initialize of a bare start, most of it imports), then ``kernel-preload`` (a module
that fails to import is one warning, and the server serves without it), then ``gc.freeze()`` so
that forked kernels share those pages instead of copying them at their first collection. No
thread, zmq context or event loop exists before a fork: none survives one.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

from bootstrap.kernels import places
from bootstrap.kernels.serverlog import say

# A kernel's own start-up, module by module (a bare ipykernel 7 start, measured: what
# IPKernelApp.initialize() and the first kernel_info reply add to `import ipykernel.kernelapp`).
# A missing one is skipped: another ipykernel version imports another set.
KERNEL_MODULES = (
    "zmq", "tornado.ioloop", "jupyter_client", "IPython", "ipykernel.kernelapp",
    "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.debugger", "IPython.core.completerlib",
    "IPython.core.debugger", "IPython.core.oinspect", "IPython.extensions.storemagic",
    "IPython.utils.wildcard", "tornado.gen", "tornado.locks", "tornado.queues",
    "tornado.platform.asyncio", "sqlite3", "pdb", "pydoc", "IPython.core.logger", "faulthandler",
    "psutil", "pwd", "resource", "runpy",
)
# How long a spawned server waits, at most, for the kernel start that spawned it to settle:
# its preload would compete with that start for the CPU (CoCalc #7139 doubled first starts so).
SETTLE_MAX = 10.0

BOOT = ("import sys; m = type(sys)('bootstrap'); m.__path__ = [sys.argv[2]]; "
        "sys.modules['bootstrap'] = m; from bootstrap.kernels.template import main; "
        "job = main(sys.argv[3:]); job is None or job()")


def main(argv: list[str]):  # type: ignore[no-untyped-def]  # -> Callable | None, see BOOT
    """The server's main: None when it is done (idle, stale, SIGTERM), or, in a forked kernel,
    what the kernel runs at the top level of ``BOOT`` (so that nothing of the server's stack
    unwinds through the kernel's exit)."""
    settings = json.loads(argv[2])
    directory = settings["dir"]
    try:
        dirfd = places.open_dir(directory, create=True)
        if settings.get("detached"):
            _to_log(dirfd)
        lockfd = _lock(dirfd)
    except OSError as e:
        say(f"cannot use {directory}: {e}")
        sys.exit(1)
    if lockfd is None:
        say("another kernel server serves this venv")
        return None
    _settle(settings.get("after"))
    started = dict(os.environ)
    if not _preload(settings.get("preload", [])):
        sys.exit(1)
    from bootstrap.kernels.key import Key
    from bootstrap.kernels.loop import Server

    # What the imports set in os.environ (ipykernel's debugger: PYDEVD_USE_FRAME_EVAL): a bare
    # start's imports set it too, so each kernel gets it on top of its request's environment.
    imported = {k: v for k, v in os.environ.items() if started.get(k) != v}
    key = Key.now(settings["venv"], argv[1])
    gc.freeze()
    server = Server(dirfd, lockfd, key, float(settings.get("idle", 900.0)), started, imported)
    return server.run()


def _to_log(dirfd: int) -> None:
    """A detached server's stdin and stdout are /dev/null, its stderr the directory's log
    (restarted when it passed 1 MiB)."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    try:
        fd = os.open(places.LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600,
                     dir_fd=dirfd)
        if os.fstat(fd).st_size > 1024 * 1024:
            os.ftruncate(fd, 0)
        os.dup2(fd, 2)
        os.close(fd)
    except OSError:
        pass


def _lock(dirfd: int) -> int | None:
    """The server lock's descriptor, held (with our pid written in it, for ``status`` and
    ``gc``); None when another server holds it."""
    import fcntl

    fd = os.open(places.LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=dirfd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _settle(pid: object) -> None:
    """Wait until process ``pid`` (the first kernel, which spawned us) used no CPU for 0.2 s,
    or has ended, at most :data:`SETTLE_MAX` s."""
    if not isinstance(pid, int) or pid <= 0:
        return
    deadline, last, quiet = time.monotonic() + SETTLE_MAX, -1, 0
    while time.monotonic() < deadline and quiet < 2:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            return
        used = int(fields[11]) + int(fields[12])  # utime, stime
        quiet = quiet + 1 if used == last else 0
        last = used
        time.sleep(0.1)


def _preload(extra: list[str]) -> bool:
    """Import a kernel's modules, then ``kernel-preload``'s; False when ipykernel is missing."""
    import importlib
    import threading

    for name in KERNEL_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            if name == "ipykernel.kernelapp":
                say("ipykernel is not installed in this venv: no kernel server")
                return False
        except Exception as e:  # a broken module must not stop serving
            say(f"importing {name} failed ({type(e).__name__}: {e})")
    for name in extra:
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit of a module too: serve without it
            say(f"warning: kernel-preload: {name} failed to import ({type(e).__name__}: {e}); "
                "kernels are served without it")
    if threading.active_count() > 1:
        say("warning: a preloaded module started a thread; forked kernels do not have it")
    sys.stdout.flush()
    sys.stderr.flush()
    return True
