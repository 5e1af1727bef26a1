"""The served side of the jupyter_client provisioner (:mod:`provisioner`): the request for a
kernel with ``"ports": true``, and the kernel the server forked for it, known by its request
connection (which carries its ports, then its wait status) and a pidfd. No jupyter_client here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from bootstrap.kernels import client, places
from bootstrap.kernels.protocol import PORTS

EXIT_WAIT = 5.0  # the server sends the status as it reaps; a killed server's end closes at once


@dataclass
class Plan:
    """A served start as ``pre_launch`` prepared it."""

    venv: str
    config: str
    python_args: list[str]
    cwd: str
    env: dict[str, str]
    stdout: object
    stderr: object


class Served:
    """A kernel the server forked for us: its request connection, pid and pidfd."""

    def __init__(self, sock: socket.socket, replies: client.Replies, pid: int) -> None:
        self.sock, self.replies, self.pid = sock, replies, pid
        self.code: int | None = None
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except OSError:
            self.pidfd = None  # ended already: the connection says how

    def ended(self) -> bool:
        return self.pidfd is None or bool(select.select([self.pidfd], [], [], 0)[0])

    def returncode(self) -> int | None:
        """None while the kernel runs, then its code as Popen's (a signal: minus its number)."""
        if self.code is None and self.ended():
            self.code = self._collect()
        return self.code

    def _collect(self) -> int:
        last: object = None
        self.sock.settimeout(EXIT_WAIT)
        with contextlib.suppress(OSError, ValueError):
            while (message := self.replies.next()) is not None:
                if isinstance(message.get("exit"), int):
                    return _returncode(message["exit"])  # type: ignore[arg-type]
                last = message.get("last", last)
        return last & 0xFF if isinstance(last, int) else -signal.SIGKILL

    def signal(self, signum: int) -> None:
        """To the kernel's process group (its pid: the kernel called setsid), only while the
        pidfd says it lives: its pid cannot have been reused then."""
        if self.ended():
            return
        try:
            os.killpg(self.pid, signum)
        except OSError:
            if self.pidfd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signum)

    def close(self) -> None:
        """Close the connection: the kernel's watchdog kills a kernel still running."""
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        self.sock.close()


def _returncode(status: int) -> int:
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else -signal.SIGKILL


def ask(plan: Plan, log: logging.Logger) -> tuple[Served, dict[str, int]] | None:
    """The kernel the venv's server forked for ``plan``, and the ports it bound; None (said why
    on ``log``) for the ordinary start."""
    sock = _connect(plan.venv)
    if sock is None:
        log.debug("kernel-bootstrap: the ordinary start: no kernel server answers")
        return None
    request = client._kernel_request(plan.venv, plan.python_args, plan.config, plan.cwd,
                                     plan.env)
    replies = client.Replies(sock)
    try:
        with _descriptors(plan) as fds:
            pid = client._request(sock, {**request, "ports": True}, fds, replies)
    except (client._Refused, OSError, ValueError) as e:
        sock.close()
        log.debug("kernel-bootstrap: the ordinary start: %s", e or type(e).__name__)
        return None
    served = Served(sock, replies, pid)
    ports = _ports(served)
    if ports is None:
        served.signal(signal.SIGKILL)
        log.warning("kernel-bootstrap: the served kernel %d ended before it bound its "
                         "ports (%s); starting it the ordinary way", pid, served.returncode())
        served.close()
        return None
    return served, ports



def stream(value: object, default: int) -> int | None:
    """The descriptor a Popen ``stdout``/``stderr`` argument names; None for a pipe."""
    if value is None:
        return default
    if isinstance(value, int):
        return value if value >= 0 or value == subprocess.DEVNULL else None
    fileno = getattr(value, "fileno", None)
    try:
        return int(fileno()) if callable(fileno) else None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _descriptors(plan: Plan) -> Any:
    """The kernel's descriptors 0-2, as ``launch_kernel`` gives a bare kernel: a pipe whose
    other end is closed, and ``stdout``/``stderr`` (ours unless given)."""
    opened: list[int] = []
    try:
        stdin, writer = os.pipe()
        opened += [stdin]
        os.close(writer)
        fds = [stdin]
        for value, default in ((plan.stdout, 1), (plan.stderr, 2)):
            fd = stream(value, default)
            if fd == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                opened.append(fd)
            assert fd is not None  # _servable checked
            fds.append(fd)
        yield tuple(fds)
    finally:
        for fd in opened:
            os.close(fd)


def _connect(venv: str) -> socket.socket | None:
    """A connection to the venv's server; None when none listens (the gate spawns one)."""
    directory = places.server_dir(venv)
    if directory is None:
        return None
    try:
        dirfd = places.open_dir(directory, create=False)
    except OSError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(client.CONNECT_TIMEOUT)
    try:
        sock.connect(places.connect_path(dirfd))
    except OSError:
        sock.close()
        return None
    finally:
        os.close(dirfd)
    return sock


def _ports(served: Served) -> dict[str, int] | None:
    """The kernel's ``ports``; None when it ended (or the connection did) first."""
    try:
        while (message := served.replies.next()) is not None:
            ports = message.get("ports")
            if isinstance(ports, dict) and all(isinstance(ports.get(n), int) for n in PORTS):
                return {name: ports[name] for name in PORTS}
            if isinstance(message.get("exit"), int):
                served.code = _returncode(message["exit"])  # type: ignore[arg-type]
                return None
    except (OSError, ValueError):
        pass
    return None
