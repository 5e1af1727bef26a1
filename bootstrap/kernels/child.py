"""What a forked kernel does before ipykernel runs: become a fresh start of the request.

After the fork (in :mod:`loop`) the process is the server's copy; :class:`Job` turns it into the
kernel ``python -m ipykernel_launcher -f FILE`` would have been, as far as user code can tell:
its own session and process group (``setsid``), the stand-in's stdin/stdout/stderr on 0-2 (and
the listening sockets it bound to the kernel's ports, adopted by the kernel's binds) and no
other descriptor of the server's or of another kernel's (the generation pin's ``.in-use`` lock
stays: it keeps the generation from removal, as in any process of the venv), the request's cwd,
``os.environ`` and what is read from it at start (``TZ``, ``tempfile``'s directory, the
``sys.path[0]`` that ``-m`` puts first), ``sys.argv`` as asked, ``random`` (and a preloaded
``numpy.random``) reseeded from ``os.urandom``, default signal handlers, fresh standard streams,
and its launcher's rlimits, umask, nice, ... (:func:`bootstrap.kernels.context.apply`: the
server forks only for a launcher whose context it can reproduce so). Descriptors a preloaded
module left open stay valid, on /dev/null.
What cannot match: the hash seed (``PYTHONHASHSEED`` is drawn once per interpreter; a forked
kernel shares its server's), environment variables that act only at interpreter start (such a
request gets the ordinary start, :func:`bootstrap.kernels.protocol.ordinary_reason`), and what a
``kernel-preload`` module read from the environment when it was imported.

A watchdog thread started here (never in the server: threads do not survive a fork) kills the
kernel's process group when the request connection reaches EOF: the stand-in died, even by
SIGKILL. ipykernel's parent poller is switched off instead: the kernel's parent is the server,
and it would shut the kernel down when the server exits (the stand-in watches the launcher).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bootstrap.kernels import context as contexts
from bootstrap.kernels import module_list, protocol, title


@dataclass
class Job:
    conn: socket.socket
    fds: list[int]
    ready: int
    argv: list[str]
    cwd: str
    env: dict[str, str]
    closing: Callable[[], None]
    context: contexts.Context
    preload_fds: frozenset[int] = frozenset()
    code: list[int] = field(default_factory=lambda: [0])
    ports: bool = False  # the request asked for the kernel's ports (protocol.py)
    bound: list[int] = field(default_factory=list)  # the ports of fds[3:] (protocol.py)

    def __call__(self) -> None:
        """Become the kernel and run it at the top level of the interpreter (``BOOT``)."""
        os.setsid()
        # Seen in `ps` as its kernelspec's argv, as exec made the bare kernel's (issue 35).
        title.set_title([sys.orig_argv[0], *self.argv])
        self.closing()
        default_signals()
        self._descriptors()
        self._confine()
        self._environment()
        fresh_state()
        self._hooks()
        self._run()

    def _descriptors(self) -> None:
        for target, fd in enumerate(self.fds[:3]):
            os.dup2(fd, target)
        held = self.fds[3:]
        close_descriptors({0, 1, 2, self.conn.fileno(), self.ready, *held}, self.preload_fds)
        hold_bound(dict(zip(self.bound, held)))  # noqa: B905  # 3.9 too
        fresh_streams()

    def _confine(self) -> None:
        confine(self.context)

    def _environment(self) -> None:
        environment(self.argv, self.cwd, self.env)

    def _hooks(self) -> None:
        """The last word (``{"last": code}``) at exit, the watchdog, and ipykernel's hooks."""
        last_word(self.conn, self.code)
        _ipykernel_hooks(self.ready, self.conn if self.ports else None)

    def _run(self) -> None:
        run_module(self.argv[1], self.code)


def confine(context: contexts.Context) -> None:
    """The launcher's rlimits, umask, nice, ... (the server checked it may set them); a kernel
    that cannot carry them must not run at all."""
    try:
        contexts.apply(context)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.write(2, f"kernel-bootstrap: cannot confine the kernel as its launcher: {e}\n"
                     .encode(errors="replace"))
        os._exit(1)


def environment(argv: list[str], cwd: str, env: dict[str, str]) -> None:
    """The request's cwd, environment, ``sys.argv`` and the ``sys.path[0]`` of ``-m``."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file first
    sys.orig_argv = [sys.executable, *argv]
    # `-c` (the server) put "" first; `-m` puts the cwd of the start, absolute.
    sys.path[:1] = [cwd] if sys.path[:1] == [""] else [cwd, *sys.path[:1]]


def last_word(conn: socket.socket, code: list[int]) -> None:
    """Send ``{"last": code}`` on ``conn`` at exit; start the watchdog on it."""
    def send() -> None:
        with contextlib.suppress(OSError):  # nobody listens any more
            conn.send(protocol.encode({"last": code[0]}), socket.MSG_DONTWAIT)

    atexit.register(send)  # registered first: runs after every other exit hook
    _watchdog(conn.fileno())


def run_module(module: str, code: list[int]) -> None:
    """Run the kernel's module as ``-m`` does, its exit code kept in ``code`` for the last
    word."""
    import runpy

    for name in [n for n in sys.modules if n == "bootstrap" or n.startswith("bootstrap.")]:
        del sys.modules[name]  # the server's own modules: not the user's `bootstrap`
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code[0] = _exit_code(e.code)
        raise
    except BaseException:
        code[0] = 1
        raise


def close_descriptors(keep: set[int], preload_fds: frozenset[int]) -> None:
    """Close every descriptor but ``keep``, the generation pin's lock (see the module
    docstring) and ``preload_fds``, which are put on /dev/null."""
    pin = os.path.join(os.path.realpath(sys.prefix), ".in-use")
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep:
            continue
        with contextlib.suppress(OSError):  # the descriptor listdir itself used: gone
            if os.readlink(f"/proc/self/fd/{fd}") == pin:
                continue
            if fd in preload_fds:
                _to_null(fd)  # a preloaded module's file: its close() must close this
            else:
                os.close(fd)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _to_null(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd, inheritable=False)  # as Python opened the file it replaces
        os.close(null)


def default_signals() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT,
                   signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own at start


def fresh_streams() -> None:
    """New ``sys.std*`` on descriptors 0-2, buffered as the interpreter would have at start for
    these descriptors (the server's were made for /dev/null and its log)."""
    import io

    def stream(fd: int, mode: str, old: io.TextIOWrapper, line: bool) -> io.TextIOWrapper:
        raw = open(fd, mode + "b", closefd=False)  # noqa: SIM115  # lives as sys.std*
        return io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors,
                                line_buffering=line)

    # As the interpreter sets them at start: sys.__std*__ too (ipykernel echoes to those).
    streams = (stream(0, "r", sys.__stdin__, False),  # type: ignore[arg-type]
               stream(1, "w", sys.__stdout__, os.isatty(1)),  # type: ignore[arg-type]
               stream(2, "w", sys.__stderr__, True))  # type: ignore[arg-type]
    for name, value in zip(("stdin", "stdout", "stderr"), streams):  # noqa: B905  # 3.9 too
        setattr(sys, name, value)
        setattr(sys, f"__{name}__", value)


def fresh_state() -> None:
    """What modules imported in the server computed from its environment or pid."""
    import random
    import time

    time.tzset()
    tempfile: Any = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # recomputed from $TMPDIR at first use
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):  # a numpy without the legacy global state
            numpy.random.seed()


def _watchdog(fd: int) -> None:
    """A thread that kills the kernel's process group when the stand-in's end closes."""
    import select
    import threading

    def watch() -> None:
        poll = select.poll()
        poll.register(fd, select.POLLIN | select.POLLRDHUP)
        while True:
            poll.poll()
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="kernel-bootstrap-watchdog", daemon=True).start()


def _ipykernel_hooks(ready: int, ports: socket.socket | None = None) -> None:
    """Tell the server when ``IPKernelApp.initialize()`` is done (it bounds how many kernels
    start at once), and the client the ports it bound then (``ports``: the request connection,
    when the request asked), create no parent poller (see the module docstring), and make the
    kernel with the server's list of modules (:mod:`module_list`)."""
    import importlib

    try:
        app = importlib.import_module("ipykernel.kernelapp").IPKernelApp
    except (ImportError, AttributeError):
        os.close(ready)
        return
    initialize = app.initialize
    open_ = [ready]  # closed once: the number may be another file's afterwards

    def initialized(self: object, argv: list[str] | None = None) -> None:
        try:
            failing(initialize, self, argv)
            unbound(self)
            if ports is not None:
                send_ports(ports, app_ports(self))
        finally:
            while open_:
                os.close(open_.pop())

    def no_poller(self: object) -> None:
        self.poller = None  # type: ignore[attr-defined]

    init_kernel = app.init_kernel

    def listed_init_kernel(self: object) -> None:
        with module_list.listed():
            init_kernel(self)

    app.initialize = initialized
    app.init_poller = no_poller
    app.init_kernel = listed_init_kernel
    patient_binds()


def failing(initialize: Callable[..., None], *args: Any) -> None:
    """``IPKernelApp.initialize`` that ends the kernel at once when it raises: ipykernel's exit
    hook then waits for its zmq context, which a socket the failed start left open (an IOPub
    port another process holds) keeps forever, and the launcher waited on a silent kernel.
    The traceback is printed as the interpreter would; ``exit()`` (a usage error) is left to
    end the kernel as it does."""
    try:
        initialize(*args)
    except Exception:
        import traceback

        traceback.print_exc()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(1)


# How long a kernel keeps asking for a port of its connection file that another process holds.
# jupyter_client picks ports by binding and closing them: in a burst, another manager's probe
# holds a port for a moment, and a kernel that gave up at once was lost (issue 36).
BIND_PATIENCE = 10.0

# The listening sockets the native stand-in bound to the connection file's ports as it started
# (protocol.py's "bound"), by port: each kernel socket bound to one of those ports adopts it.
_held: dict[int, int] = {}


def hold_bound(bound: dict[int, int]) -> None:
    """Keep ``bound`` (port: descriptor) for the kernel's binds, closed on exec as a socket of
    libzmq's is."""
    for fd in bound.values():
        os.set_inheritable(fd, False)
    _held.update(bound)


def unbound(app: Any) -> None:
    """Close the held sockets of ports the kernel does not use (a connection file that changed
    after the stand-in read it): a port nobody serves must not accept connections."""
    used = set(app_ports(app).values())
    for port in [p for p in _held if p not in used]:
        os.close(_held.pop(port))


def _adopt(owner: Any, sock: Any, port: object) -> None:
    """Make zmq's bind of ``sock`` to ``port`` use the held socket of that port, if any and if
    it is what the kernel would bind (ipykernel's ``transport`` and ``ip``)."""
    if getattr(owner, "transport", None) != "tcp" or not isinstance(port, int) \
            or port not in _held:
        return
    fd = _held.pop(port)
    ip = getattr(owner, "ip", None)
    if _listening(fd, ("0.0.0.0" if ip == "*" else ip, port)):
        import importlib

        sock.setsockopt(importlib.import_module("zmq").USE_FD, fd)  # zmq closes it at the end
    else:
        os.close(fd)


def _listening(fd: int, address: tuple[object, object]) -> bool:
    try:
        probe = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        return probe.family == socket.AF_INET and probe.type == socket.SOCK_STREAM \
            and probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1 \
            and probe.getsockname() == address
    except OSError:
        return False
    finally:
        probe.detach()


def patient_binds() -> None:
    """ipykernel binds a port its connection file names once (a port 0 it picks anew, up to 100
    times): retry EADDRINUSE for :data:`BIND_PATIENCE` seconds instead, for the kernel's
    sockets and its heartbeat's; and bind a port the stand-in holds by adopting its socket
    (:func:`hold_bound`)."""
    import errno
    import importlib
    import time

    def patient(bind: Callable[..., Any]) -> Callable[..., Any]:
        def retrying(*args: Any) -> Any:
            # IPKernelApp._try_bind_socket(self, s, port); Heartbeat._try_bind_socket(self)
            owner = args[0]
            sock, port = args[1:3] if len(args) >= 3 else (owner.socket, owner.port)
            _adopt(owner, sock, port)
            deadline = time.monotonic() + BIND_PATIENCE
            while True:
                try:
                    return bind(*args)
                except Exception as e:  # zmq.ZMQError: not an OSError, but with its errno
                    if getattr(e, "errno", None) != errno.EADDRINUSE \
                            or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.02)

        return retrying

    try:
        app = importlib.import_module("ipykernel.kernelapp").IPKernelApp
        heartbeat = importlib.import_module("ipykernel.heartbeat").Heartbeat
    except (ImportError, AttributeError):
        return
    for kind in (app, heartbeat):
        if not getattr(kind._try_bind_socket, "patient", False):
            kind._try_bind_socket = patient(kind._try_bind_socket)
            kind._try_bind_socket.patient = True


def app_ports(app: object) -> dict[str, object]:
    """The ports an ``IPKernelApp`` bound, by the connection file's names."""
    return {name: getattr(app, name, None) for name in protocol.PORTS}


def send_ports(conn: socket.socket, found: Mapping[str, object]) -> None:
    """``{"ports": {...}}``: what the kernel binds for a connection file whose ports were 0."""
    if all(isinstance(port, int) and port > 0 for port in found.values()):
        with contextlib.suppress(OSError):  # the client is gone: the watchdog ends us
            conn.send(protocol.encode({"ports": found}), socket.MSG_DONTWAIT)
