"""The stand-in: what ``run`` becomes once the server forked its kernel (see
:mod:`bootstrap.kernels.client`). It never returns: it exits as the kernel did.

How it learns the end: the server reaps the kernel and sends its wait status (``exit``); a server
that stops (idle, stale, SIGTERM) stays, retiring, until it has reaped its last kernel, so this
holds unless the server was killed outright. Then the connection reaches EOF once the kernel has
closed its end too, and the kernel's own last word (``last``, its exit code, written at exit)
says how it ended; with neither (the kernel was killed by a signal after its server was killed)
SIGKILL is the best guess.

How it exits: as a bare kernel's launcher would have seen the kernel exit, its code or its
death by the same signal, re-raised here (SIGKILL too), never with a traceback.
"""

from __future__ import annotations

import os

from bootstrap.kernels import protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
else:  # the C module signal.py wraps: that module's enum import costs the stand-in ~5 ms
    import _signal as signal

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
POLL = 1.0  # how often the launcher's presence is checked, as ipykernel's poller does
# Signals whose default action stops a process or does nothing: re-raised, they would leave the
# stand-in stopped or running, and its launcher waiting. A kernel does not die of them; a status
# naming one gets the shell's 128+N.
_NOT_FATAL = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU,
                        signal.SIGCONT, signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH})


class StandIn:
    def __init__(self, sock, pid: int,  # type: ignore[no-untyped-def]  # a _socket
                 queued: list[bytes] | None = None, lines: protocol.Lines | None = None) -> None:
        # What the request's reader had read past ``pid`` (a kernel that ends at once: its
        # ``exit`` can come in the same read) and its partial line.
        self.sock, self.pid = sock, pid
        self.queued, self.lines = queued or [], lines or protocol.Lines()
        self.pidfd: int | None = None
        self.parent = _launcher()

    def run(self) -> None:
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except OSError:
            self.pidfd = None  # it ended already: the server's answer says how
        for signum in FORWARDED:
            signal.signal(signum, self._forward)
        self.sock.settimeout(POLL if self.parent is not None else None)
        _exit_as(self._wait())

    def _forward(self, signum: int, frame: object) -> None:
        """To the kernel's process group, as jupyter_client's ``killpg`` of the group it
        started reaches a bare kernel and the commands it runs (``!sleep 60`` stops at an
        interrupt). Only while the pidfd says the kernel lives: its pid, the group's id, cannot
        have been reused then."""
        import select

        if self.pidfd is None or select.select([self.pidfd], [], [], 0)[0]:
            return  # it has ended: the answer is on its way
        try:  # noqa: SIM105  # contextlib: an import the stand-in does not pay
            os.killpg(self.pid, signum)
        except OSError:
            pass

    def _wait(self) -> int:
        """The kernel's wait status."""
        last, queued = None, self.queued
        while True:
            for line in queued:
                message = protocol.decode(line) or {}
                if isinstance(message.get("exit"), int):
                    return message["exit"]  # type: ignore[return-value]
                if isinstance(message.get("last"), int):
                    last = message["last"]
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                self._check_launcher()
                queued = []
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return _status(last, signal.SIGKILL)
            queued = self.lines.feed(chunk)

    def _check_launcher(self) -> None:
        """ipykernel's ParentPollerUnix, for the kernel that cannot run it."""
        assert self.parent is not None
        ppid = os.getppid()
        if (not self.parent and ppid == 1) or (self.parent and ppid != self.parent):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os._exit(1)


def _launcher() -> int | None:
    """The pid ipykernel's parent poller would watch: None when it would not run (no
    ``JPY_PARENT_PID``, or 1), 0 to watch for reparenting to init."""
    try:
        handle = int(os.environ.get("JPY_PARENT_PID", "0"))
    except ValueError:
        return None
    if handle in (0, 1):
        return None
    return handle if os.getppid() == handle else 0


def _status(last: object, signum: int) -> int:
    """A wait status from the kernel's last word, or death by ``signum`` without one."""
    if isinstance(last, int):
        return (last & 0xFF) << 8
    return signum


def _exit_as(status: int) -> None:
    """Exit as the kernel did, as its launcher would have seen it exit: its code, or death by
    the same signal (re-raised on ourselves), or 128+N where that signal would not end us."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  # contextlib: an import the stand-in does not pay
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if not 0 <= status <= 0xFFFF:  # not a wait status: no word of the kernel's end
        status = signal.SIGKILL
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL
    if signum not in _NOT_FATAL:
        _die_of(signum)
    os._exit(128 + signum)  # what a shell reports for a death by signal N


def _die_of(signum: int) -> None:
    """Re-raise ``signum`` on ourselves at its default action (returns only if it did not end
    us). SIGKILL's action cannot be set (EINVAL; it is always the default). No core file: the
    kernel wrote its own, and ours, in the same directory, would replace it."""
    try:  # noqa: SIM105  # contextlib: an import the stand-in does not pay
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL; a number the C library keeps for itself
        pass
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, OSError, ValueError):
        pass
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    except (OSError, ValueError):
        pass
