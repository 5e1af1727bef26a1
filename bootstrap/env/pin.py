"""The pin: a ``.pth`` in each generation that keeps a process on the generation it started in.

An interpreter started as ``<venv>/bin/python`` computes ``sys.prefix`` from that path, not
from what the ``<venv>`` symlink points at; every later import would then go through the link
and, after a rebuild, read the next generation's files. ``site`` runs ``.pth`` lines starting
with ``import`` at start, in name order, and this one's name sorts before every other in
site-packages (digits before ``_`` and letters), so it runs before any other ``.pth`` adds
paths. It:

- re-points ``sys.prefix``, ``sys.exec_prefix``, ``sys.executable`` and the ``sys.path``
  entries under the symlinked prefix to the generation's real path. ``sys.executable`` too, so
  that a child started as ``sys.executable`` (multiprocessing's spawn and forkserver, ``-m
  pip``) runs in its parent's generation; a child started through ``<venv>/bin/python``
  itself gets the current generation, as any new start does;
- takes a shared ``flock`` on ``<generation>/.in-use`` and keeps the descriptor open
  (non-inheritable) until the process exits. The kernel drops the lock when the last
  descriptor closes, also after a SIGKILL; removal takes the lock exclusively without
  blocking, so a generation with a living process is never removed, and nothing depends on a
  process cleaning up after itself. A fork shares the descriptor, so a forked child holds the
  lock with its parent.

If removal won the race (it holds the exclusive lock, or has already unlinked the file), the
pin starts over from the symlink, which names the current generation by then. Anything
unexpected leaves the interpreter as it was: a pin must never stop a kernel from starting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from bootstrap.primitives.atomic import write_atomic

PIN_NAME: Final = "000-kernel-bootstrap-pin.pth"
IN_USE: Final = ".in-use"

# Runs inside every interpreter start of the venv: os and sys are loaded already; fcntl is the
# one extra import (a small extension module). Kept as plain statements, no helper module, so
# the pin costs no search of sys.path.
_SOURCE: Final = """\
def _kb_pin(sys):
    import os, fcntl
    link = sys.prefix
    for _ in range(3):
        real = os.path.realpath(link)
        try:
            fd = os.open(os.path.join(real, %(in_use)r), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink:
            break
        os.close(fd)
    else:
        return
    if real != link:
        def moved(path, n=len(link)):
            same = path == link or path.startswith(link + os.sep)
            return real + path[n:] if same else path
        sys.prefix, sys.exec_prefix = moved(sys.prefix), moved(sys.exec_prefix)
        sys.executable = moved(sys.executable)
        sys.path[:] = [moved(p) for p in sys.path]
try:
    _kb_pin(sys)
except Exception:
    pass
del _kb_pin
"""


def pth_line() -> bytes:
    """The one line of the ``.pth``: ``site`` executes a line only if it starts with
    ``import``, and executes it whole, so the body goes in as an escaped string."""
    source = _SOURCE % {"in_use": IN_USE}
    return f"import sys; exec({source!r})\n".encode()


def install(generation: Path, site_packages: list[Path]) -> None:
    """Make ``generation`` pin the processes that start in it: its ``.in-use`` file, then the
    ``.pth`` in each of its site-packages directories (durable: the base marker written after
    it says the generation is complete)."""
    in_use = generation / IN_USE
    if not in_use.exists():
        write_atomic(in_use, b"")
    for directory in site_packages:
        if directory.is_dir():
            write_atomic(directory / PIN_NAME, pth_line())
