"""The pin: a ``.pth`` in each generation that keeps a process on the generation it started in.

An interpreter started as ``<venv>/bin/python`` computes ``sys.prefix`` from that path, not
from what the ``<venv>`` symlink points at; every later import would then go through the link
and, after a rebuild, read the next generation's files. ``site`` runs ``.pth`` lines starting
with ``import`` at start, in name order, and this one's name sorts before every other in
site-packages (digits before ``_`` and letters), so it runs before any other ``.pth`` adds
paths. It:

- re-points ``sys.prefix``, ``sys.exec_prefix``, ``sys.executable`` and the ``sys.path``
  entries under the symlinked prefix to the generation's real path (what ``os.path.realpath``
  would give for the part that matters, in one ``readlink``: ``<venv>`` is our link).
  ``sys.executable`` too, so that a child started as ``sys.executable`` (multiprocessing's
  spawn and forkserver, ``-m pip``) runs in its parent's generation; a child started
  through ``<venv>/bin/python`` itself gets the current generation, as any new start does;
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

import os
from pathlib import Path
from typing import Final

from bootstrap.primitives import process
from bootstrap.primitives.atomic import write_atomic

PIN_NAME: Final = "000-kernel-bootstrap-pin.pth"
MODULE: Final = "_kernel_bootstrap_pin"
IN_USE: Final = ".in-use"

# The .pth imports a module beside it rather than carrying the code itself: site compiles a
# .pth line at every start (~0.5 ms for this much code), while the module's bytecode is cached
# in __pycache__ after its first import, as for any module in site-packages. os and sys are
# loaded already; fcntl is the one extra import (a small extension module).
_SOURCE: Final = """\
\"\"\"kernel-bootstrap's generation pin (see 000-kernel-bootstrap-pin.pth); never import it.\"\"\"
import os, sys


def _pin():
    import fcntl
    link = sys.prefix
    for _ in range(3):
        try:  # one readlink, not realpath's lstat per component: only <venv> is our link
            real = os.path.join(os.path.dirname(link), os.readlink(link))
        except OSError:
            real = link  # started through a generation's own path (or a plain venv)
        try:
            fd = os.open(real + %(in_use)r, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink:
            break
        os.close(fd)
    else:
        return
    if real != link:
        n, under = len(link), link + os.sep

        def moved(path):
            return real + path[n:] if path == link or path.startswith(under) else path

        sys.prefix, sys.exec_prefix = moved(sys.prefix), moved(sys.exec_prefix)
        sys.executable = moved(sys.executable)
        sys.path[:] = [moved(p) for p in sys.path]


try:
    _pin()
except Exception:
    pass
"""


def module_source() -> bytes:
    return (_SOURCE % {"in_use": os.sep + IN_USE}).encode()


def install(generation: Path, site_packages: list[Path], python: Path) -> None:
    """Make ``generation`` pin the processes that start in it: its ``.in-use`` file, then the
    module and the ``.pth`` in each of its site-packages directories (durable: the base marker
    written after them says the generation is complete), the module's bytecode compiled by the
    generation's own interpreter (the cache tag is its version's, not ours)."""
    in_use = generation / IN_USE
    if not in_use.exists():
        write_atomic(in_use, b"")
    for directory in site_packages:
        if directory.is_dir():
            module = directory / f"{MODULE}.py"
            write_atomic(module, module_source())
            write_atomic(directory / PIN_NAME, f"import {MODULE}\n".encode())
            # py_compile writes even under PYTHONDONTWRITEBYTECODE, as kernels may run with it.
            # Without the bytecode the pin still works, compiled at every start (~0.5 ms).
            process.run(python, "-m", "py_compile", module, check=False, timeout=60)
