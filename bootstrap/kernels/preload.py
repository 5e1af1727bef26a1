"""The server's start-up that does not depend on a request: a kernel's own imports, then
``kernel-preload``'s, and what they leave behind that a forked kernel must not trip over.

Measured for a bare ipykernel 7 start: 0.9 s of imports and 0.8 s of ``IPKernelApp.initialize()``,
most of that imports too; :data:`KERNEL_MODULES` are those imports. A module that fails to
import is one warning (the server serves without it); ipykernel missing means no server.

What a preload may leave that breaks a fork (issue 35), and what the server does about it:
- a thread (one holding a lock deadlocks every forked kernel that takes the lock): the server
  does not serve (``not_serving``, in its log and in ``status``), every start is ordinary;
- an import that never returns (the server would hold the venv's lock forever, never listen
  and never idle out): after ``kernel-preload-timeout`` seconds the server exits;
- environment variables: those a kernel's own imports set (ipykernel's debugger sets
  ``PYDEVD_USE_FRAME_EVAL``) are set over the request's, as a bare start's imports would; those
  a ``kernel-preload`` module set only where the request has none (its ``setdefault`` must not
  override the launcher's value);
- descriptors (``LOG = open(...)``): kept valid in each kernel, on /dev/null, so that the
  module's later ``close()`` closes that and not a number the kernel's own files reuse.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass

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
_DEBUGPY_QUIET = "PYDEVD_DISABLE_FILE_VALIDATION"


@dataclass(frozen=True)
class Preloaded:
    kernel_env: dict[str, str]  # set by a kernel's own imports: over the request's
    preload_env: dict[str, str]  # set by kernel-preload: under the request's
    fds: frozenset[int]  # left open by the imports: kept valid (on /dev/null) in each kernel
    not_serving: str | None  # why no kernel may be forked at all


def run(extra: list[str], timeout: float) -> Preloaded | None:
    """Import a kernel's modules, then ``extra``, within ``timeout`` seconds (or exit 1);
    None when ipykernel is missing."""
    before_env, before_fds = dict(os.environ), _open_fds()
    signal.signal(signal.SIGALRM, _too_slow)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with _quiet_debugpy():
            if not _import_kernel():
                return None
        kernel_env = _changed(before_env)
        _import_extra(extra)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    after_kernel = {**before_env, **kernel_env}
    sys.stdout.flush()
    sys.stderr.flush()
    return Preloaded(kernel_env, _changed(after_kernel), frozenset(_open_fds() - before_fds),
                     _threads())


@contextlib.contextmanager
def _quiet_debugpy() -> Iterator[None]:
    """debugpy (ipykernel.debugger imports it) warns at import, in four lines on stderr, that
    frozen modules may make it miss breakpoints: in the server that is its log, at every start,
    about no kernel. ``PYDEVD_DISABLE_FILE_VALIDATION`` lowers those lines to debug; pydevd
    reads it once, into a constant that nothing but that import reads. So, when it is not set
    already, it is set for the imports alone and the constant put back to what it would be
    without it: forked kernels are what they were (a served kernel's stderr never had those
    lines: they are printed at import, in the server)."""
    if _DEBUGPY_QUIET in os.environ:
        yield
        return
    os.environ[_DEBUGPY_QUIET] = "1"
    try:
        yield
    finally:
        del os.environ[_DEBUGPY_QUIET]
        constants = sys.modules.get("_pydevd_bundle.pydevd_constants")
        if constants is not None and hasattr(constants, "DISABLE_FILE_VALIDATION"):
            vars(constants)["DISABLE_FILE_VALIDATION"] = False


def _too_slow(signum: int, frame: object) -> None:
    say("kernel-preload did not finish within kernel-preload-timeout: no kernel server")
    os._exit(1)


def _import_kernel() -> bool:
    import importlib

    for name in KERNEL_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            if name == "ipykernel.kernelapp":
                say("ipykernel is not installed in this venv: no kernel server")
                return False
        except Exception as e:  # a broken module must not stop serving
            say(f"importing {name} failed ({type(e).__name__}: {e})")
    return True


def _import_extra(extra: list[str]) -> None:
    import importlib

    for name in extra:
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit of a module too: serve without it
            say(f"warning: kernel-preload: {name} failed to import ({type(e).__name__}: {e}); "
                "kernels are served without it")


def _changed(before: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def _open_fds() -> set[int]:
    """Our open descriptors (not the one the listing itself used: closed by now)."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        fds.add(int(name))
    return fds


def _threads() -> str | None:
    """Why the server must not fork: the threads a preload left running, by name."""
    import threading

    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if not others:
        return None
    reason = (f"kernel-preload left {len(others)} thread(s) running ({', '.join(others)}); "
              "a forked kernel would inherit their locks without them, so kernels start the "
              "ordinary way")
    say(f"not serving: {reason}")
    return reason
