"""Spares: kernels prepared before anyone asks, each claimed by one request in a few ms.

A spare is a fork of the server (``kernel-spares`` of them, default 1) that runs the parts of
``IPKernelApp.initialize()`` no request can change: the app and its config, the profile, the
zmq context and sockets (created, not bound: ``_bind_socket`` is deferred), the kernel object,
the InteractiveShell and its history, extensions. Then it waits on its control socket, using no
CPU. A claim (:func:`claim`) hands it the request; it becomes the kernel as a forked one does
(:mod:`child`: descriptors, confinement, cwd, environment, fresh state, the watchdog) and runs
``-m ipykernel_launcher`` itself, whose ``initialize()`` is then only what depends on the
request: the connection file (ports, key, transport, CurveZMQ keys), binding, the heartbeat,
the connection file written back, standard streams, the threads, the shell's environment
(``TERM``, ``MPLBACKEND``, ``__session__``), a new history session (its start is the claim's
time: the spare's own was never written), ``_dh`` (the claim's cwd), and the startup files and
``exec_lines`` (run in the request's cwd and environment, as a bare start runs them).

What a spare read before its claim that a request can change, it tells the server when it is
ready (:mod:`spare_reads`): every environment variable the preparation looked up, and the
stamps of the files and directories its config came from. A request whose environment differs
in one of those, or that finds a stamp changed, is forked the ordinary served way instead
(:func:`spare_reads.refusal`), and a changed stamp retires the spare. A request whose argv is
more than ``-m ipykernel_launcher -f FILE`` is forked too: the spare parsed no command line.

Runs in the spare, in the venv's interpreter: standard library and the kernel's own modules.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bootstrap.kernels import child, context, module_list, protocol, spare_reads, title

_SOCKETS = ("shell_port", "stdin_port", "control_port", "iopub_port")  # init_sockets' order
_MAX_CLAIM = 8 * 1024 * 1024


def claim_message(argv: list[str], cwd: str, env: dict[str, str], ctx: context.Context,
                  ports: bool, bound: list[int]) -> bytes:
    """The claim, length-prefixed: a pickle, since only the server holds the other end of the
    spare's socket (its own fork). Its descriptors: the kernel's 0-2, the request connection,
    and the sockets of the ports ``bound`` (protocol.py)."""
    data = pickle.dumps((argv, cwd, env, ctx, ports, bound))
    return struct.pack("!I", len(data)) + data


# -- in the spare --------------------------------------------------------------------------------

@dataclass
class SpareJob:
    """What a forked spare runs at the top level of ``BOOT`` (as :class:`child.Job`)."""

    ctrl: socket.socket
    venv: str
    closing: Callable[[], None]
    preload_fds: frozenset[int]

    def __call__(self) -> None:
        os.setsid()
        title.set_title(["kernel-bootstrap", "kernel", "spare", self.venv])
        self.closing()
        child.default_signals()
        child.close_descriptors({0, 1, 2, self.ctrl.fileno()}, self.preload_fds)
        held = _hold_output()
        try:
            prepared = _prepare()
        except BaseException as e:  # any failure: no spare, the server is told
            _send(self.ctrl, {"failed": f"{type(e).__name__}: {e}"})
            os._exit(1)
        _send(self.ctrl, {"ready": True, "env": None if prepared.env is None
                          else sorted(prepared.env), "stamps": prepared.stamps})
        request, fds = _receive(self.ctrl)  # exits when the server is gone
        self.ctrl.close()
        _claimed(prepared, request, fds, held)


@dataclass
class Prepared:
    app: Any
    binds: list[Any]  # the zmq sockets whose bind was deferred, in init_sockets' order
    starts: list[Callable[[], None]]  # the threads whose start was deferred
    env: frozenset[str] | None
    stamps: dict[str, str]
    sys_path: list[str]  # before the preparation: init_path's insertion is redone at the claim
    ports: dict[str, int]  # ports of its own, held listening for a provisioner's claim


# Where a spare holds ports of its own: jupyter_client's default address for tcp kernels.
OWN_IP = "127.0.0.1"


def _prepare() -> Prepared:
    app = _module("ipykernel.kernelapp").IPKernelApp.instance()
    binds: list[Any] = []
    starts: list[Callable[[], None]] = []
    sys_path = list(sys.path)

    def bind_later(sock: Any, port: int) -> int:
        binds.append(sock)
        return 0

    app._bind_socket = bind_later
    with spare_reads.recording_env() as looked_up, _deferred(app, starts):
        _initialize(app)
    del app._bind_socket  # the class's, at the claim
    return Prepared(app, binds, starts, looked_up.names, spare_reads.stamps(app), sys_path,
                    _own_ports())


def _own_ports() -> dict[str, int]:
    """Five ports bound and listening on :data:`OWN_IP` (as libzmq binds: SO_REUSEADDR, its
    backlog), held (:func:`child.hold_bound`) for the claim: a provisioner's kernel, whose
    connection file leaves the ports to the kernel, gets these, and its provisioner has them
    the moment the spare is claimed instead of once the kernel has bound (issue 36 item 3)."""
    held = {}
    for name in protocol.PORTS:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((OWN_IP, 0))
        sock.listen(100)
        held[name] = sock.getsockname()[1]
        child.hold_bound({held[name]: sock.detach()})
    return held


def _ports_of_own(prepared: Prepared, connection_file: str) -> dict[str, int] | None:
    """The spare's own ports when the connection file leaves every port to the kernel (0) on
    :data:`OWN_IP` over tcp, as a provisioner's does, written into it (one rename: whoever
    reads it, jupyter_client or the kernel, reads it whole); None to bind what it names."""
    import json
    from pathlib import Path

    from bootstrap.primitives.atomic import write_atomic

    try:
        with open(connection_file, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None  # ipykernel's own reading says what is wrong
    if not isinstance(info, dict) or info.get("transport", "tcp") != "tcp" \
            or info.get("ip") != OWN_IP or any(info.get(name, 0) != 0 for name in protocol.PORTS):
        return None
    try:  # as jupyter_client writes it: indented, the key's file private
        write_atomic(Path(connection_file), json.dumps({**info, **prepared.ports},
                                                       indent=2).encode(),
                     attempts=1, durable=False, mode=0o600)
    except OSError:
        return None
    return prepared.ports


def _initialize(app: Any) -> None:
    """``IPKernelApp.initialize()`` without what depends on the request (see the module
    docstring): the same steps, in the same order."""
    import types

    _module("IPython.core.application").BaseIPythonApplication.initialize(app, [])
    app.init_pdb()
    app.init_blackhole()
    app.poller = None  # the stand-in watches the launcher (bootstrap.kernels.child)
    app.init_sockets()
    app.init_signal()
    app.displayhook = types.SimpleNamespace()  # init_io makes the real one at the claim
    app.init_kernel()
    app.init_path()
    app.init_shell()
    if app.shell:
        app.init_gui_pylab()
        app.init_extensions()


@contextlib.contextmanager
def _deferred(app: Any, starts: list[Callable[[], None]]) -> Iterator[None]:
    """Threads are started at the claim, once their sockets are bound (zmq sockets are not
    thread-safe: a thread polling a socket while another binds it is a race), and the history
    session is started at the claim (its start time is the kernel's)."""
    IOPubThread = _module("ipykernel.iostream").IOPubThread
    HistoryManager = _module("IPython.core.history").HistoryManager

    iopub_start, new_session = IOPubThread.start, HistoryManager.new_session
    IOPubThread.start = lambda thread: starts.append(lambda: iopub_start(thread))
    HistoryManager.new_session = lambda self, conn=None: None
    init_kernel = type(app).init_kernel

    def threads_later(self: Any) -> None:
        for thread in (self.control_thread, self.shell_channel_thread):
            if thread is not None:
                thread.start = (lambda t=thread: starts.append(lambda: type(t).start(t)))
        with module_list.listed():
            init_kernel(self)
        for thread in (self.control_thread, self.shell_channel_thread):
            if thread is not None:
                del thread.start

    app.init_kernel = threads_later.__get__(app)
    try:
        yield
    finally:
        IOPubThread.start, HistoryManager.new_session = iopub_start, new_session
        del app.init_kernel


def _send(ctrl: socket.socket, message: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        ctrl.sendall(protocol.encode(message))


def _receive(ctrl: socket.socket) -> tuple[tuple[Any, ...], list[int]]:
    """The claim and its descriptors (see :func:`claim_message`); exits when the server closed
    its end (it stopped, or was killed)."""
    data, fds, _, _ = socket.recv_fds(ctrl, 65536, protocol.MAX_FDS + 1)
    while data and (len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]):
        if len(data) > _MAX_CLAIM:
            break
        more = ctrl.recv(65536)
        if not more:
            break
        data += more
    if len(data) < 4 or len(data) != 4 + struct.unpack("!I", data[:4])[0]:
        os._exit(0)
    request = pickle.loads(data[4:])
    if len(fds) != protocol.N_FDS + 1 + len(request[-1]):
        os._exit(0)
    return request, fds


def _hold_output() -> list[int]:
    """What the preparation prints (ipykernel's warning about TCP, a config's output) is the
    kernel's, as a bare start prints it: kept in memory files on 1 and 2 until the claim gives
    the kernel its own."""
    held = []
    for target in (1, 2):
        fd = os.memfd_create(f"kernel-bootstrap-spare-{target}", os.MFD_CLOEXEC)
        os.dup2(fd, target)
        held.append(fd)
    return held


def _replay(held: list[int]) -> None:
    for target, fd in zip((1, 2), held):  # noqa: B905  # 3.9 too
        with contextlib.suppress(OSError):  # the launcher's end is closed: nobody reads it
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            while data:
                data = data[os.write(target, data):]
        os.close(fd)


def _claimed(prepared: Prepared, request: tuple[Any, ...], fds: list[int],
             held: list[int]) -> None:
    argv, cwd, env, ctx, ports, bound = request
    conn = socket.socket(fileno=fds[3])
    child.hold_bound(dict(zip(bound, fds[4:])))  # noqa: B905  # 3.9 too
    title.set_title([sys.orig_argv[0], *argv])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    _replay(held)
    child.fresh_streams()
    child.confine(ctx)
    sys.path[:] = prepared.sys_path
    child.environment(argv, cwd, env)
    child.fresh_state()
    code = [0]
    child.last_word(conn, code)
    own = _ports_of_own(prepared, argv[3]) if ports else None
    if own is not None:  # the provisioner's wait ends here; the kernel binds them next
        child.send_ports(conn, own)
    _finish_at_launch(prepared, argv[3], conn if ports and own is None else None, own)
    child.run_module(argv[1], code)


def _finish_at_launch(prepared: Prepared, connection_file: str,
                      ports: socket.socket | None, own: dict[str, int] | None) -> None:
    """Make the launcher's ``IPKernelApp.initialize()`` (``launch_instance`` finds the prepared
    app: it is the singleton) do the rest of the start."""
    app = prepared.app

    def initialize(self: Any, argv: list[str] | None = None) -> None:
        child.failing(_finish, prepared, connection_file, ports, own)

    type(app).initialize = initialize


def _finish(prepared: Prepared, connection_file: str, ports: socket.socket | None,
            own: dict[str, int] | None) -> None:
    """What ``initialize()`` does after the preparation, for this request: on the spare's own
    ports (``own``, sent already) or the connection file's. A provisioner's ports that the
    kernel chooses are sent as soon as they are bound and written: jupyter_client's own work
    after the launch then overlaps the rest of the start."""
    app = prepared.app
    app.connection_file = connection_file
    # Defaults ipykernel computed from the environment when it was imported (the server's).
    app.parent_handle = int(os.environ.get("JPY_PARENT_PID") or 0)
    app.interrupt = int(os.environ.get("JPY_INTERRUPT_EVENT") or 0)
    app.init_connection_file()
    for name, port in (own or {}).items():
        setattr(app, name, port)
    child.patient_binds()
    kind = type(app)
    for sock, name in zip(prepared.binds, _SOCKETS):  # noqa: B905  # 3.9 too
        app._apply_curve_server_options(sock)
        setattr(app, name, kind._bind_socket(app, sock, getattr(app, name)))
    shell_endpoint = app.shell_socket.getsockopt(_zmq().LAST_ENDPOINT)
    if shell_endpoint:
        app._apply_curve_client_options(app.debug_shell_socket)
        app.debug_shell_socket.connect(shell_endpoint)
    for start in prepared.starts[:1]:  # the IOPub thread: init_io's streams need it
        start()
    app.init_heartbeat()
    child.unbound(app)
    if own is None:  # else written already, before anyone was told the ports
        app.write_connection_file()
    if ports is not None:
        child.send_ports(ports, child.app_ports(app))
    app.log_connection_info()
    app.init_io()
    kernel = app.kernel
    app.displayhook.get_execution_count = lambda: kernel.execution_count
    for start in prepared.starts[1:]:
        start()
    kernel.record_ports({name + "_port": port for name, port in app._ports.items()})
    _fresh_shell(app)
    app.init_code()
    sys.stdout.flush()
    sys.stderr.flush()


def _fresh_shell(app: Any) -> None:
    """What the shell and the kernel read from the environment and the cwd as they were made."""
    shell = app.shell
    if shell is None:
        return
    shell.init_environment()
    if not os.environ.get("MPLBACKEND"):
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    session = os.environ.get("JPY_SESSION_NAME")
    if session:
        shell.user_ns["__session__"] = session
    history = getattr(shell, "history_manager", None)
    if history is not None:
        history.dir_hist[:] = [os.getcwd()]
        with contextlib.suppress(Exception):  # as HistoryManager.__init__: history unsaved
            history.new_session()
    app.init_path()


def _zmq() -> Any:
    return _module("zmq")


def _module(name: str) -> Any:
    """A module of the kernel's (the venv's, not the tool's: no stubs for the type checker)."""
    import importlib

    return importlib.import_module(name)
