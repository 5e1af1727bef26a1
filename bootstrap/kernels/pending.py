"""A connection to the kernel server whose request is being read, or waits for its kernel:
what it sent so far, the descriptors that came with it (bounded), its peer and deadline."""

from __future__ import annotations

import os
import socket
import time

from bootstrap.kernels import protocol
from bootstrap.kernels.context import Context

# For a request to arrive whole (the stand-in sends it at once); a dribbler holds up to 4 fds.
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

    def take(self, fds: list[int], flags: int) -> bool:
        """Hold the descriptors that came with a chunk; False once the connection has sent
        more than a request's :data:`protocol.N_FDS` in all (in one chunk or many, newline or
        not) or more than one message could carry (``MSG_CTRUNC``): then it is to be closed
        with all of them at once (one connection once made the server hold 12,011)."""
        self.fds += fds
        return len(self.fds) <= protocol.N_FDS and not flags & socket.MSG_CTRUNC

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.conn.close()
