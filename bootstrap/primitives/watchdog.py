"""Reading a child's output with a stall limit: :func:`bootstrap.primitives.process.run`'s
``idle``, for children whose silence means a stall (git talking to a server that accepted the
connection and never answers: ``git://`` has no limit of its own, and https has none while the
TLS handshake waits). Kept apart from process.py, which only imports it when asked, as the
selector loop is not needed by any other child.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable
from typing import Any


def read_watched(proc: subprocess.Popen[Any], timeout: float | None, idle: float,
                 stop: Callable[[], None]) -> tuple[str, str, str]:
    """``proc.communicate()``, except that ``stop()`` is called once the child has written
    nothing to stdout or stderr for ``idle`` seconds (or has run ``timeout`` seconds); the
    third value then says which (empty: the child ended by itself). Text as text-mode pipes
    give it (undecodable bytes replaced, universal newlines)."""
    assert proc.stdout is not None and proc.stderr is not None, "BUG: pipes were requested"
    pipes = [proc.stdout, proc.stderr]
    data = {f.fileno(): bytearray() for f in pipes}
    end = time.monotonic() + timeout if timeout is not None else float("inf")
    why = ""
    with selectors.DefaultSelector() as selector:
        for fd in data:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = end - time.monotonic()
            ready = selector.select(min(idle, left)) if left > 0 else []
            if not ready:
                why = (f"timed out after {timeout:g} s" if time.monotonic() >= end
                       else f"no output for {idle:g} s: stopped as stalled")
                stop()  # the whole tree: git-remote-https or ssh goes with git
                for key in list(selector.get_map().values()):
                    _drain(key.fd, data[key.fd])
                break
            for key, _ in ready:
                chunk = os.read(key.fd, 65536)
                if chunk:
                    data[key.fd] += chunk
                else:
                    selector.unregister(key.fd)
    out, err = (_text(data[f.fileno()]) for f in pipes)
    for f in pipes:
        f.close()
    proc.wait()
    return out, err, why


def _drain(fd: int, into: bytearray) -> None:
    """What a stopped tree left in a pipe, without waiting for a writer that may live on."""
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 65536):
            into += chunk
    except BlockingIOError:
        pass


def _text(raw: bytearray) -> str:
    return raw.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
