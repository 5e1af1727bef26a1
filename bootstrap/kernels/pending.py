"""A connection to the kernel server whose request is being read, or waits for its kernel:
what it sent so far, the descriptors that came with it (bounded), its peer and deadline; and
whether the server accepts connections at all (:class:`Accepting`)."""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time
from collections.abc import Callable

from bootstrap.kernels import protocol
from bootstrap.kernels.context import Context
from bootstrap.kernels.serverlog import say

# For a request to arrive whole (the stand-in sends it at once); a dribbler holds up to 9 fds.
READ_TIMEOUT = 1.0


class Pending:
    """A connection whose request is being read, or waits for its kernel."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.lines = protocol.Lines()
        self.fds: list[int] = []
        self.deadline = time.monotonic() + READ_TIMEOUT
        self.request: tuple[list[str], str, dict[str, str]] | None = None
        self.peer = 0  # the client's pid (SO_PEERCRED), whose context the kernel must carry
        self.context: Context | None = None
        self.ports = False  # the request asked for the kernel's ports (protocol.py)
        self.bound: list[int] = []  # the ports of fds[N_FDS:], bound by the stand-in

    def take(self, fds: list[int], flags: int) -> bool:
        """Hold the descriptors that came with a chunk; False once the connection has sent
        more than a request's most (:data:`protocol.MAX_FDS`) in all
        (in one chunk or many, newline or not) or more than one message could carry
        (``MSG_CTRUNC``): then it is to be closed with all of them at once (one connection
        once made the server hold 12,011)."""
        self.fds += fds
        return len(self.fds) <= protocol.MAX_FDS and not flags & socket.MSG_CTRUNC

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.conn.close()


# How long the loop stops accepting when it runs out of descriptors: the listening socket stays
# readable meanwhile, and selecting it made the loop spin (1.16 CPU-s in 3 s at `ulimit -n 64`).
ACCEPT_BACKOFF = 0.2
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Accepting:
    """Whether the server's loop selects its listening socket: not for :data:`ACCEPT_BACKOFF`
    after an accept failed for want of descriptors (what frees one, a request read or timed
    out, a kernel forked, runs meanwhile); said once per episode in the log."""

    def __init__(self, selector: selectors.BaseSelector, sock: socket.socket,
                 accept: Callable[[socket.socket], None]) -> None:
        self.selector, self.sock, self.accept = selector, sock, accept
        self.until: float | None = None  # when accepting resumes (None: accepting)
        self.short = False  # out of descriptors since the last accept

    def pause(self, error: OSError) -> None:
        if error.errno not in _EXHAUSTED:
            return
        if not self.short:
            say(f"cannot accept ({error.strerror}): retrying every {ACCEPT_BACKOFF:g} s")
            self.short = True
        self.selector.unregister(self.sock)
        self.until = time.monotonic() + ACCEPT_BACKOFF

    def resume(self, stopping: bool) -> None:
        if self.until is not None and (time.monotonic() >= self.until or stopping):
            self.until = None
            self.selector.register(self.sock, selectors.EVENT_READ, self.accept)

    def resume_at(self) -> list[float]:
        return [] if self.until is None else [self.until]
