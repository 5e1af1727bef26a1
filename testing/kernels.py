"""Kernels as a test or a benchmark sees them: started by jupyter_client from a kernelspec, timed
to their first ``kernel_info`` reply, many at once, and the processes they leave behind.

The readiness probe is our own. jupyter_client's ``wait_for_ready``, after the reply, waits up to
0.2 s for IOPub to speak and then drains it until 0.2 s of silence: a fixed ~0.2 s on every start,
twice what a served kernel should take. :func:`answer` asks ``kernel_info`` on the shell channel
alone and stops at the reply to that request. Its socket retries a refused connect every
``reconnect_ms``: the client connects before the kernel has bound its ports, and with zmq's
default (100 ms) the reply could come up to 100 ms after the kernel was ready.

A burst (:func:`start_many`) starts each kernel and waits for its reply in a thread of its own:
every kernel is requested at once, as a harness that starts 100 kernels does, and each is timed
from its own ``start_kernel``.

Orphans (:func:`assert_no_orphans`): a process is the test's when its environment carries the
test's :data:`testing.reaper.TAG` (every child inherits it: stand-ins, the kernel server they
spawn, the kernels it forks, whose /proc environ is the server's) or its command line names one
of the test's directories (a server started with a scrubbed environment still names its venv,
``kernel-bootstrap kernel server VENV``; a served kernel its ``VENV/bin/python``). Of those, the
kernel-like ones (an ipykernel argv, a server's, or a fork of one not yet retitled: same command
line) must be gone when the test ends. The live server of a venv outlives a test by design (its
idle timeout), so the check ends servers as a supervisor would (SIGTERM), telling a server from a
kernel it forked by the ``kernels/*/lock`` the server holds open (a kernel holds no descriptor of
the server; a server spawned just before the end takes it a moment later, and is ended then).
A server so stopped retires (it lets go of the lock, and ends with its last kernel): it is waited
for as a kernel is. A kernel is never signalled before the verdict: a leaked one is seen, then
killed. Linux only (it reads /proc).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from bootstrap.env.kernelspec import NATIVE_STANDIN
from testing import reaper

if TYPE_CHECKING:
    from jupyter_client.blocking.client import BlockingKernelClient
    from jupyter_client.manager import KernelManager

T = TypeVar("T")
SERVER_TITLE: Final = ("kernel-bootstrap", "kernel", "server")  # then the venv: `ps` shows it
RECONNECT_MS: Final = 10  # see the module docstring: zmq's own 100 ms would quantise the probe


# --- the readiness probe ---------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """A kernel jupyter_client started: its manager, what it launched (the stand-in for a
    served kernel, the kernel itself for a bare one), and start_kernel -> kernel_info reply."""

    manager: KernelManager
    pid: int
    seconds: float
    info: dict[str, Any]


def probe_client(manager_or_file: KernelManager | str | os.PathLike[str],
                 reconnect_ms: int = RECONNECT_MS) -> BlockingKernelClient:
    """A BlockingKernelClient on ``manager_or_file`` (a KernelManager or a connection file) with
    only its shell channel started, on a zmq context of its own that retries a refused connect
    every ``reconnect_ms``. Stop it with :func:`close_client`."""
    import zmq
    from jupyter_client.blocking.client import BlockingKernelClient

    context = zmq.Context()
    context.setsockopt(zmq.RECONNECT_IVL, reconnect_ms)
    client = BlockingKernelClient(context=context)
    if isinstance(manager_or_file, str | os.PathLike):
        client.load_connection_file(os.fspath(manager_or_file))
    else:
        client.load_connection_info(manager_or_file.get_connection_info())
    client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
    return client


def close_client(client: BlockingKernelClient) -> None:
    client.stop_channels()
    client.context.destroy(linger=0)


def answer(client: BlockingKernelClient, timeout: float = 120.0,
           alive: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Send one ``kernel_info`` request and return the content of its reply; ``alive`` (a
    callable) is asked each second, so a kernel that died fails at once rather than at the
    timeout."""
    msg_id = client.kernel_info()
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = client.get_shell_msg(timeout=min(left, 1.0))
        except queue.Empty:
            if alive is not None and not alive():
                raise RuntimeError("the kernel died before its kernel_info reply") from None
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            content: dict[str, Any] = msg["content"]
            return content
    raise TimeoutError(f"no kernel_info reply in {timeout} s")


def start(kernel_name: str, *, timeout: float = 120.0, reconnect_ms: int = RECONNECT_MS,
          **popen: Any) -> Started:
    """Start ``kernel_name`` as Jupyter does (``popen``: start_kernel's keywords, e.g. cwd, env,
    stdout) and wait for its kernel_info reply; on failure the kernel is shut down."""
    return _start(kernel_name, timeout, reconnect_ms, contextlib.nullcontext(), popen)


# jupyter_client's port cache (LocalPortCache: a check-then-add on a set, a singleton created on
# first use) is not thread-safe: a burst's launches go one at a time, as on jupyter_server's
# event loop; the waits for the replies overlap.
_LAUNCH = threading.Lock()


# Ports for kernels a test suite starts (reserve_ports): jupyter_client picks ports by
# bind-and-close in the ephemeral range, where other processes' outgoing connections take them
# before a kernel binds them; a loaded machine widened that window until kernels died of
# EADDRINUSE (issue 38). Below the ephemeral range nobody takes a port by chance.
_PORTS: list[int] = []
_NEXT_PORT = itertools.count()
_PORTS_LOCK = threading.Lock()
_PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def native_argv(argv: Sequence[str]) -> bool:
    """Whether a kernelspec's ``argv`` starts the native stand-in (``kb-standin VENV CONFIG``
    before the lean argv: bootstrap.env.kernelspec.kernel_argv)."""
    return bool(argv) and os.path.basename(argv[0]) == NATIVE_STANDIN


def lean_argv(argv: list[str]) -> list[str]:
    """A kernelspec's ``argv`` without the native stand-in's three words: the lean argv it
    execs for what it does not serve (the whole argv where it has none)."""
    return argv[3:] if native_argv(argv) else argv


def runs_native(pid: int) -> bool:
    """Whether process ``pid`` is the native stand-in (it did not exec the lean argv)."""
    return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == NATIVE_STANDIN


def reserve_ports(first: int, count: int) -> None:
    """Start every later kernel on ports from ``first`` to ``first + count``, which no other
    process of the machine may use (below its ephemeral range, one range per test worker)."""
    global _NEXT_PORT
    _PORTS[:] = range(first, first + count)
    # Another suite (or a developer's test) on the machine uses the same ranges: each process
    # starts at a place of its own in them, and the bind probe skips what is taken.
    _NEXT_PORT = itertools.count(os.getpid() * 5 % count)


@contextlib.contextmanager
def default_ports() -> Iterator[None]:
    """Within the block, kernels start on the ports jupyter_client picks itself (the ephemeral
    range, as for any user), not on the reserved ones."""
    saved = list(_PORTS)
    _PORTS.clear()
    try:
        yield
    finally:
        _PORTS[:] = saved


def _free_port() -> int:
    import socket

    with _PORTS_LOCK:
        for _ in _PORTS:
            port = _PORTS[next(_NEXT_PORT) % len(_PORTS)]
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue  # a kernel of an earlier test still has it
            return port
    raise RuntimeError("every reserved port is in use")


def _start(kernel_name: str, timeout: float, reconnect_ms: int,
           launching: contextlib.AbstractContextManager[object], popen: dict[str, Any],
           ) -> Started:
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name=kernel_name)
    if _PORTS:
        reserved(manager)
    began = time.perf_counter()
    with launching:
        manager.start_kernel(**popen)
    try:
        info = first_reply(manager, timeout, reconnect_ms)
        seconds = time.perf_counter() - began
    except BaseException as e:
        process = getattr(manager.provisioner, "process", None)
        if process is not None:
            e.add_note(f"{kernel_name}: the launched process {process.pid} "
                       f"exit status: {process.poll()}")
        manager.shutdown_kernel(now=True)
        raise
    return Started(manager, _launched(manager), seconds, info)


def reserved(manager: KernelManager, **given: int) -> KernelManager:
    """``manager`` on ports of the suite's reserved range (:func:`reserve_ports`), but those
    ``given`` by name (e.g. ``iopub_port=``)."""
    manager.cache_ports = False
    for name in _PORT_NAMES:
        setattr(manager, name, given.get(name) or _free_port())
    return manager


def first_reply(manager: KernelManager, timeout: float = 120.0,
                reconnect_ms: int = RECONNECT_MS) -> dict[str, Any]:
    """The content of the kernel_info reply of ``manager``'s kernel (see :func:`answer`)."""
    client = probe_client(manager, reconnect_ms)
    try:
        return answer(client, timeout, manager.is_alive)
    finally:
        close_client(client)


def _launched(manager: KernelManager) -> int:
    """The pid jupyter_client's provisioner started: the Popen's of the local provisioner (what a
    kernelspec without one gets; kernel-bootstrap's when it starts the ordinary way), else the
    served kernel's of kernel-bootstrap's."""
    provisioner = manager.provisioner
    process = getattr(provisioner, "process", None)
    pid = process.pid if process is not None else getattr(provisioner, "pid", None)
    assert isinstance(pid, int), provisioner
    return pid


def stop(kernel: Started) -> None:
    """``shutdown_kernel(now=True)``: SIGKILL to what jupyter_client launched."""
    kernel.manager.shutdown_kernel(now=True)


@contextlib.contextmanager
def running(kernel_name: str, **kwargs: Any) -> Iterator[Started]:
    """:func:`start`, then :func:`stop` however the block ends."""
    kernel = start(kernel_name, **kwargs)
    try:
        yield kernel
    finally:
        stop(kernel)


def execute(kernel: Started, code: str, timeout: float = 60.0) -> tuple[dict[str, Any], str]:
    """Run ``code`` in the kernel: the execute reply's content and what it printed."""
    client = kernel.manager.client()
    client.start_channels()
    printed: list[str] = []

    def output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
    try:
        _subscribed(client, timeout)
        reply = client.execute_interactive(code, timeout=timeout, output_hook=output)
    finally:
        client.stop_channels()
    return reply["content"], "".join(printed)


def _subscribed(client: BlockingKernelClient, timeout: float) -> None:
    """Until the client's IOPub subscription is live: a zmq SUB socket joins late, and what the
    kernel publishes before (a cell's output) is lost, while the cell's later "idle" arrives; a
    loaded machine widened that window until a test read no output (an empty report). Proof:
    the kernel's status message for a request of ours arrives on IOPub."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg_id = client.kernel_info()
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            try:
                msg = client.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return
    raise TimeoutError(f"no IOPub message from the kernel in {timeout} s")


# --- many at once ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Burst:
    kernels: list[Started]
    wall: float  # the first start_kernel -> the last kernel_info reply, or the last failure
    answered: float  # the first start_kernel -> the last kernel_info reply of those answering


def start_many(kernel_name: str, n: int, *, timeout: float = 600.0, reconnect_ms: int = 50,
               **popen: Any) -> Burst:
    """Start ``n`` kernels at once, one thread each, and wait until all have answered; if any
    fails, the others are shut down and the first failure raised. ``reconnect_ms`` is coarser
    than a single start's: n sockets retrying every 10 ms would take CPU from the kernels."""
    burst, errors = start_each(kernel_name, n, timeout=timeout, reconnect_ms=reconnect_ms,
                               **popen)
    if errors:
        stop_all(burst.kernels)
        raise errors[0]
    return burst


def start_each(kernel_name: str, n: int, *, timeout: float = 600.0, reconnect_ms: int = 50,
               **popen: Any) -> tuple[Burst, list[BaseException]]:
    """:func:`start_many`, keeping the kernels that answered and the errors of those that did
    not (a benchmark counts them)."""
    def timed() -> tuple[Started, float]:
        kernel = _in_thread(_start, kernel_name, timeout, reconnect_ms, _LAUNCH, popen)
        return kernel, time.perf_counter()

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(timed) for _ in range(n)]
    wall = time.perf_counter() - began
    done = [f.result() for f in futures if f.exception() is None]
    errors = [e for f in futures if (e := f.exception()) is not None]
    answered = max((at for _, at in done), default=began) - began
    return Burst([kernel for kernel, _ in done], wall, answered), errors


def stop_all(kernels: Iterable[Started]) -> None:
    """:func:`stop` every kernel, in threads (each shutdown waits for its process)."""
    kernels = list(kernels)
    if kernels:
        with ThreadPoolExecutor(max_workers=min(len(kernels), 32)) as pool:
            list(pool.map(functools.partial(_in_thread, stop), kernels))


def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a pool's thread, then the event loop jupyter_client's blocking calls
    made for that thread closed: left open, each loop's ``__del__`` complains on stderr when
    the interpreter exits."""
    try:
        return fn(*args)
    finally:
        from jupyter_core.utils import ensure_event_loop

        ensure_event_loop().close()


# --- the process table -----------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: tuple[str, ...]

    @property
    def line(self) -> str:
        return f"{self.pid} {' '.join(self.argv)}"


def processes() -> dict[int, Proc]:
    """Every live process we can read (zombies have no command line), by pid."""
    table: dict[int, Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:  # a retitled one: NUL-padded
                argv = tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # ended while we looked
        if argv:
            table[int(entry)] = Proc(int(entry), ppid, argv)
    return table


def descendants(roots: Iterable[int], table: dict[int, Proc] | None = None) -> set[int]:
    """``roots`` (those alive) and every live process below them by parent pid."""
    table = processes() if table is None else table
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    todo = [pid for pid in roots if pid in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds descriptors of."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[len("socket:["):-1]))
    return inodes


def listening_ports(pid: int) -> set[int]:
    """The TCP ports (IPv4) that process ``pid`` holds listening sockets on: its socket
    descriptors' inodes, looked up in its network namespace's table (state 0A: LISTEN)."""
    inodes = socket_inodes(pid)
    ports = set()
    with open(f"/proc/{pid}/net/tcp", encoding="ascii") as table:
        next(table)  # the header
        for line in table:
            fields = line.split()
            if fields[3] == "0A" and int(fields[9]) in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (/proc/PID/stat, clock ticks); 0 if it has ended."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- orphans ---------------------------------------------------------------------------------


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def of_test(tag: str | None, roots: Sequence[Path] = (),
            table: dict[int, Proc] | None = None) -> list[Proc]:
    """The processes (not this one) carrying ``TAG=tag`` in their environment, or whose command
    line names a path under one of ``roots``."""
    table = processes() if table is None else table
    wanted = f"{reaper.TAG}={tag}".encode() if tag else None
    # With the separator: pytest's test_x1 must not match test_x10's paths.
    names = [os.path.join(r, "") for r in roots]
    return [p for p in table.values() if p.pid != os.getpid() and (
        (wanted is not None and wanted in _environ(p.pid))
        or any(n in a or a == n[:-1] for a in p.argv for n in names))]


def kernel_like(proc: Proc, table: dict[int, Proc]) -> bool:
    """An ipykernel launch (the kernel, served or not, or the stand-in whose argv asks for one),
    a kernel server (``serve``, or retitled ``kernel-bootstrap kernel server VENV``), or a
    process forked from one (it keeps its parent's command line until it retitles itself)."""
    argv = proc.argv
    launch = any(a == "-m" and b.split(".")[0] in ("ipykernel_launcher", "ipykernel")
                 for a, b in itertools.pairwise(argv))
    serve = argv[:3] == SERVER_TITLE or any(a.startswith("bootstrap.kernels") for a in argv) or (
        "serve" in argv and any(a.endswith(("kernel-bootstrap", "bootstrap")) for a in argv))
    parent = table.get(proc.ppid)
    return launch or serve or (parent is not None and parent.argv == argv
                               and kernel_like(parent, table))


def holds_server_lock(pid: int) -> bool:
    """Whether ``pid`` holds a kernel server's lock open: the live server does, a kernel it
    forked must not."""
    return server_lock_dir(pid) is not None


def server_lock_dir(pid: int) -> str | None:
    """The server directory (``.../kernels/<venv>``) whose ``lock`` ``pid`` holds open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        parts = target.split("/")
        if len(parts) >= 3 and parts[-1] == "lock" and parts[-3] == "kernels":
            return os.path.dirname(target)
    return None


def wait_gone(procs: list[Proc], grace: float) -> list[Proc]:
    """Those of ``procs`` still running after up to ``grace`` seconds (a reused pid is not)."""
    deadline = time.monotonic() + grace
    while True:
        table = processes()
        left = [p for p in procs if p.pid in table and table[p.pid].argv == p.argv]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def kernel_processes(tag: str | None, roots: Sequence[Path] = ()) -> list[Proc]:
    """The test's kernel-like processes now (see :func:`of_test`, :func:`kernel_like`)."""
    table = processes()
    return [p for p in of_test(tag, roots, table) if kernel_like(p, table)]


def assert_no_orphans(tag: str | None, roots: Sequence[Path] = (), grace: float = 5.0) -> None:
    """Give the test's kernel-like processes ``grace`` seconds to end (a kernel ends within a
    second of its stand-in), sending SIGTERM to each that holds a server lock, or comes to hold
    one (a server just spawned takes it at start-up), as a supervisor ends a server that
    outlives a test by design; a kernel gets no signal. Then SIGKILL whatever is left and fail,
    naming each."""
    termed: set[int] = set()
    deadline = time.monotonic() + grace
    while left := kernel_processes(tag, roots):
        for proc in left:
            if proc.pid not in termed and holds_server_lock(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                termed.add(proc.pid)
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not left:
        return
    for proc in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    lines = [f"{'server ignored SIGTERM' if p.pid in termed else 'left running'}: {p.line}"
             for p in left]
    raise AssertionError("kernel or server processes of the test outlived it (now killed):\n  "
                         + "\n  ".join(lines))
