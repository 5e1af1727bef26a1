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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from bootstrap.kernels.serverlog import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bootstrap.kernels.progress import Progress

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
# The first kernel start, which spawned the server, must not get slower (CoCalc #7139: a preload
# competing with it doubled first starts on small machines): while it is busy, a kernel's
# imports run this much nicer (19: the most; a thread of ours cannot be made less nice again),
# and at most this long (s) before they go on at the server's own priority.
NICE = 19
SETTLE_MAX = 10.0
IDLE_CORES = 1.5  # cores minus the 1-minute load average that let the imports overlap at all
_AUTOGROUP = "/proc/self/autogroup"


@dataclass(frozen=True)
class Preloaded:
    kernel_env: dict[str, str]  # set by a kernel's own imports: over the request's
    preload_env: dict[str, str]  # set by kernel-preload: under the request's
    fds: frozenset[int]  # left open by the imports: kept valid (on /dev/null) in each kernel
    not_serving: str | None  # why no kernel may be forked at all


def run(extra: list[str], timeout: float, after: int | None = None,
        progress: Progress | None = None) -> Preloaded | None:
    """Import a kernel's modules (overlapping the start ``after``, see :func:`_import_kernel`),
    then ``extra``, within ``timeout`` seconds (or exit 1); None when ipykernel is missing.
    ``progress`` is told as each part is done."""
    before_env, before_fds = dict(os.environ), _open_fds()
    signal.signal(signal.SIGALRM, _too_slow)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with _quiet_debugpy():
            if not _import_kernel(after):
                return None
        kernel_env = _changed(before_env)
        if progress is not None:
            progress.kernel_done()
        _import_extra(extra)  # on the main thread: a user's module may care which thread it is
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    if progress is not None:
        progress.done()
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


def _import_kernel(after: int | None) -> bool:
    """Import :data:`KERNEL_MODULES`; False when ipykernel is missing. While the kernel start
    ``after`` (the first, which spawned us) is busy, in a thread of lower priority
    (:class:`_Overlap`), then the rest on this thread at ours; or, with no core idle
    (:func:`_idle_core`), all of them on this thread once it settled."""
    names = list(KERNEL_MODULES)
    if isinstance(after, int) and after > 0 and not _idle_core():
        _settle(after, None)
    elif isinstance(after, int) and after > 0:
        group = _group_nice()
        niced = group is not None and group < NICE and _set_group_nice(NICE)
        overlap = _Overlap(names)
        overlap.start()
        _settle(after, overlap)
        overlap.stop = True
        if niced and not _set_group_nice(group or 0):  # kernels would inherit it: never serve
            say("cannot restore the server's CPU priority (/proc/self/autogroup): no server")
            os._exit(1)
        overlap.join()  # before anything else: no thread may exist at a fork
        if overlap.missing:
            return False
        names = names[overlap.done:]
    return all(_import_one(name) for name in names)


def _import_one(name: str) -> bool:
    import importlib

    try:
        importlib.import_module(name)
    except ImportError:
        if name == "ipykernel.kernelapp":
            say("ipykernel is not installed in this venv: no kernel server")
            return False
    except Exception as e:  # a broken module must not stop serving
        say(f"importing {name} failed ({type(e).__name__}: {e})")
    return True


class _Overlap(threading.Thread):
    """Imports ``names`` one by one at :data:`NICE` more than the server (Linux: a thread's nice
    is its own, so the main thread, and every kernel it forks, keeps the server's), until told to
    ``stop`` after the module it is importing. It takes only the CPU the first start leaves idle
    (a second core; almost none on one); a nice for the whole server process could never be
    undone (only a privileged process lowers its nice), and kernels would inherit it; its
    autogroup's can (:func:`_group_nice`), and is raised as well meanwhile. Not
    SCHED_IDLE: that starves under load, and the main thread waits for the module in progress.
    The same modules, environment, descriptors and signal handlers as imported on the main
    thread (checked for ipykernel 7.4: the imports only define a few empty ``threading.local``s)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(name="kernel-bootstrap-preload", daemon=True)
        self.names, self.stop, self.done, self.missing = names, False, 0, False

    def run(self) -> None:
        with contextlib.suppress(OSError):
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + NICE)
        for name in self.names:
            if self.stop:
                return
            if not _import_one(name):
                self.missing = True
                return
            self.done += 1


def _group_nice() -> int | None:
    """Our autogroup's nice; None without autogroups. With them (Linux's default on desktops
    and most servers), the scheduler weighs each session as one: a thread's nice counts only
    against its own session's threads, and the server (a session of its own, see
    :mod:`spawn`) would compete with the first kernel (another one) as an equal. Unlike a
    thread's, an autogroup's nice may be put back down to 0 by its owner."""
    try:
        with open(_AUTOGROUP, "rb") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_group_nice(value: int) -> bool:
    import errno

    for _ in range(40):  # the kernel takes one change per 0.1 s, machine-wide
        try:
            fd = os.open(_AUTOGROUP, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, str(value).encode())
            finally:
                os.close(fd)
            return True
        except OSError as e:
            if e.errno != errno.EAGAIN:
                return False
            time.sleep(0.05)
    return False


def _idle_core() -> bool:
    """Whether, over the last minute, a core was left idle beside the first start: else
    even the most yielding imports slowed it (measured on 2 loaded cores: +15% with the
    overlap; VM vCPUs and caches are shared whatever the nice), so they wait for it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except OSError:
        return False
    return cores - os.getloadavg()[0] >= IDLE_CORES


def _settle(pid: int, overlap: _Overlap | None) -> None:
    """Until process ``pid`` (the first kernel) used no CPU for 0.2 s or ended, at most
    :data:`SETTLE_MAX` s, or ``overlap`` is done."""
    from bootstrap.kernels.progress import cpu_seconds

    deadline, last, quiet = time.monotonic() + SETTLE_MAX, -1.0, 0
    while time.monotonic() < deadline and quiet < 2 and (overlap is None or overlap.is_alive()):
        used = cpu_seconds(pid)
        if used is None:
            return
        quiet = quiet + 1 if used == last else 0
        last = used
        if overlap is None:
            time.sleep(0.1)
        else:
            overlap.join(0.1)


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
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if not others:
        return None
    reason = (f"kernel-preload left {len(others)} thread(s) running ({', '.join(others)}); "
              "a forked kernel would inherit their locks without them, so kernels start the "
              "ordinary way")
    say(f"not serving: {reason}")
    return reason
