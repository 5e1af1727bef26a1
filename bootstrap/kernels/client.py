"""The client: ``run`` hands an ipykernel launch to the venv's kernel server, and stays as the
kernel's stand-in, indistinguishable from the kernel to whoever launched it.

:func:`launch` runs on the warm path right before the exec: on the way to the ordinary start
(no server yet, the first start) it imports nothing beyond ``os`` and this package's
``places``/``protocol``/``spawn``, and spawns the server without waiting for it. With a server,
``_socket`` (not ``socket``: its enum and selectors imports cost more than the rest) and
``json``.

The stand-in forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the kernel through
a pidfd (jupyter_client interrupts with ``killpg`` of the process group it started: ours), exits
as the kernel did (a signal death is re-raised on itself with the default action), and, when it
dies itself, the kernel's watchdog sees its end of the connection close and kills the kernel.
It also plays ipykernel's parent poller, which the served kernel cannot run (its parent is the
server): when the launcher that set ``JPY_PARENT_PID`` goes away, the kernel is killed and the
stand-in exits 1, as a bare kernel does.
"""

from __future__ import annotations

import os

from bootstrap.kernels import places, protocol

CONNECT_TIMEOUT = 2.0  # connect, send, and the server's first answer ("queued")
FORK_TIMEOUT = 120.0  # queued -> forked: a burst of 100 on two cores takes tens of seconds


class _Refused(Exception):
    """The server answered, but not with a kernel (``stale``, ``ordinary``, ``error``)."""


def launch(venv: str, python: str, python_args: list[str], config_file: str) -> None:
    """Become the stand-in of a kernel the venv's server forked for ``python_args`` (never
    returns), or return so that the caller starts the kernel the ordinary way: not a kernel
    launch, no server (one is spawned), a stale one, any failure (one warning when a server
    was there and did not answer)."""
    if protocol.served_module(python_args) is None:
        return
    directory = places.server_dir(venv)
    if directory is None:
        return
    try:
        dirfd = places.open_dir(directory, create=False)
    except places.Untrusted as e:  # a server there could be another user's doing: none
        _warn(f"no kernel server: {e.filename} {e.strerror}; make it a directory of this "
              "user that only this user can write (chmod go-w)")
        return
    except OSError:
        _spawn(config_file)
        return
    try:
        _ask(dirfd, venv, python_args, config_file)
    finally:
        os.close(dirfd)


def _ask(dirfd: int, venv: str, python_args: list[str], config_file: str) -> None:
    sock = _connect(dirfd)
    if sock is None:  # no socket (of ours), or nobody listening: no server, or one starting up
        if _spawned_unless_running(dirfd, config_file):
            return
        sock = _wait_for_server(dirfd)
        if sock is None:
            return
    replies = Replies(sock)
    try:
        pid = _request(sock, _kernel_request(venv, python_args, config_file), replies=replies)
    except _Refused as e:
        sock.close()
        if str(e) == "stale":
            _spawn(config_file)
        return
    except (OSError, ValueError) as e:
        sock.close()
        _warn(f"the kernel server did not answer ({e or type(e).__name__})")
        # One that stopped as we asked (it lets go of its lock first) has no successor yet.
        _spawned_unless_running(dirfd, config_file)
        return
    _stand_in(sock, pid, replies)


def _connect(dirfd: int):  # type: ignore[no-untyped-def]  # -> a _socket or None
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(places.connect_path(dirfd))
    except OSError:
        sock.close()
        return None
    return sock


def _wait_for_server(dirfd: int):  # type: ignore[no-untyped-def]  # -> a _socket or None
    """A connection to the server still starting up in ``dirfd``, once it listens, if waiting
    for it is faster than the ordinary start (:mod:`bootstrap.kernels.progress`); else None."""
    from bootstrap.kernels import progress

    return progress.wait(dirfd, lambda: _connect(dirfd))


def _kernel_request(venv: str, python_args: list[str], config_file: str, cwd: str | None = None,
                    env: dict[str, str] | None = None) -> dict[str, object]:
    """What the server compares with itself before it forks (bootstrap.kernels.admission): the
    launch (in our cwd and environment unless given), and the venv, generation and config this
    start would use. The rest of our context the server reads from /proc itself; securebits are
    not there, so we say them."""
    from bootstrap.kernels import libc

    return {"kind": "kernel", "argv": python_args, "cwd": cwd or os.getcwd(),
            "env": dict(os.environ) if env is None else env,
            "venv": venv, "generation": os.path.realpath(venv), "config": config_file,
            "securebits": libc.prctl(libc.PR_GET_SECUREBITS)}


def _request(sock, request: dict[str, object], fds: tuple[int, ...] = (0, 1, 2),  # type: ignore[no-untyped-def]  # _socket
             replies: Replies | None = None) -> int:
    """Send the request with the descriptors ``fds`` (the kernel's 0-2: the stand-in's own) and
    wait until the kernel is forked; what the server and the kernel say next is read from
    ``replies`` (the provisioner's: the kernel's ports)."""
    import _socket
    import struct

    data = protocol.encode(request)
    packed = struct.pack(f"{len(fds)}i", *fds)
    sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, packed)])
    if sent < len(data):
        sock.sendall(data[sent:])
    replies = Replies(sock) if replies is None else replies
    overtaking: list[bytes] = []  # a claimed spare's ports may come before the server's pid
    while True:
        message = replies.next()
        if message is None:
            raise ValueError("the server closed the connection")
        if "pid" in message and isinstance(message["pid"], int):
            replies.queue[:0] = overtaking  # read next, in their order
            return message["pid"]
        if "ports" in message:
            overtaking.append(protocol.encode(message).rstrip(b"\n"))
            continue
        if message.get("queued"):
            sock.settimeout(FORK_TIMEOUT)
            continue
        if message.get("stale"):
            raise _Refused("stale")
        if "ordinary" in message:
            raise _Refused("ordinary")
        raise ValueError(str(message.get("error", "unexpected answer")))


class Replies:
    """The messages on a request connection, one at a time."""

    def __init__(self, sock) -> None:  # type: ignore[no-untyped-def]  # a _socket
        self.sock, self.lines = sock, protocol.Lines()
        self.queue: list[bytes] = []

    def next(self) -> dict[str, object] | None:
        """The next message; None at EOF; ValueError for one that is not a JSON object."""
        while not self.queue:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.queue += self.lines.feed(chunk)
        message = protocol.decode(self.queue.pop(0))
        if message is None:
            raise ValueError("a malformed answer")
        return message


def _spawned_unless_running(dirfd: int, config_file: str) -> bool:
    """Spawn the next server unless one holds the lock in ``dirfd`` (a live one, or one
    starting up); whether we did."""
    if places.server_running(places.LOCK, dir_fd=dirfd):
        return False
    _spawn(config_file)
    return True


def _spawn(config_file: str) -> None:
    from bootstrap.kernels import spawn

    spawn.start(config_file, after=os.getpid())


def _warn(text: str) -> None:
    try:  # noqa: SIM105  # contextlib: an import the warm path does not pay
        os.write(2, f"kernel-bootstrap: warning: {text}; starting the kernel the ordinary way\n"
                 .encode(errors="replace"))
    except OSError:
        pass


def _stand_in(sock, pid: int, replies: Replies) -> None:  # type: ignore[no-untyped-def]
    """Be the kernel ``pid`` to our launcher until it ends, then exit as it did."""
    from bootstrap.kernels import standin

    standin.StandIn(sock, pid, replies.queue, replies.lines).run()
