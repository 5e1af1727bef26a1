"""The kernel server's one way to say something: a line on its stderr, which is the server
directory's ``log`` when it runs detached (``status`` and a test read it there)."""

from __future__ import annotations

import contextlib
import os


def say(text: str) -> None:
    """One line on the server's stderr, naming the server."""
    with contextlib.suppress(OSError):
        os.write(2, f"kernel-bootstrap serve[{os.getpid()}]: {text}\n".encode(errors="replace"))
