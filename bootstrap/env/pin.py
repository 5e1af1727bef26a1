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

# The .pth runs the module beside it from its bytecode, loaded by path: site compiles a .pth
# line at every start (~0.5 ms for all of the code), and an import would search sys.path,
# listing the standard library's directories that `python -c pass` never lists. os and sys are
# loaded already; fcntl is the one extra import (a small extension module).
_SOURCE: Final = """\
\"\"\"kernel-bootstrap's generation pin (see 000-kernel-bootstrap-pin.pth); never import it.\"\"\"
import os, sys


def _fcntl():
    # By its path where the interpreter keeps it: an import would search sys.path, listing
    # the standard library's directory, which a bare start never does (~0.2 ms).
    if "fcntl" not in sys.builtin_module_names:
        try:
            ext = sys.modules["_frozen_importlib_external"]
            path = "%%s/%%s/python%%d.%%d/lib-dynload/fcntl%%s" %% (
                sys.base_exec_prefix, sys.platlibdir, *sys.version_info[:2],
                ext.EXTENSION_SUFFIXES[0])
            spec = ext.spec_from_file_location("fcntl", path)
            module = sys.modules["_frozen_importlib"].module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules["fcntl"] = module
            return module
        except Exception:
            pass
    import fcntl
    return fcntl


def _pin():
    fcntl = _fcntl()
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


# The one line of the .pth (site executes a line only if it starts with "import", and whole).
# Paths are relative to sys.prefix: the generation's own, or <venv> naming it at this instant.
# Bytecode of another interpreter (its magic number differs) or none: compiled from source.
_LOADER: Final = """\
try:
    _kb = sys.prefix + "/"
    try:
        _kb_data = open(_kb + %(pyc)r, "rb").read()
        if _kb_data[:4] != sys.modules["_frozen_importlib_external"].MAGIC_NUMBER:
            raise ValueError
        _kb_code = __import__("marshal").loads(memoryview(_kb_data)[16:])
    except Exception:
        _kb_code = compile(open(_kb + %(source)r, "rb").read(), %(source)r, "exec")
    exec(_kb_code, {"__name__": %(module)r})
except Exception:
    pass
"""


def pth_line(source: str, pyc: str) -> bytes:
    """The ``.pth`` line running the module at ``source`` (its bytecode at ``pyc``), both
    relative to the generation."""
    loader = _LOADER % {"pyc": pyc, "source": source, "module": MODULE}
    return f"import sys; exec({loader!r})\n".encode()


# Prints where the bytecode went; py_compile writes even under PYTHONDONTWRITEBYTECODE, which
# kernels may run with.
_COMPILE: Final = "import py_compile, sys; print(py_compile.compile(sys.argv[1], doraise=True))"


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
            source = module.relative_to(generation).as_posix()
            # Without bytecode the pin still works, compiled at every start (~0.5 ms).
            done = process.run(python, "-c", _COMPILE, module, check=False, timeout=60)
            pyc = Path(done.stdout.strip())
            relative = pyc.relative_to(generation).as_posix() \
                if done.returncode == 0 and pyc.is_relative_to(generation) else source
            write_atomic(directory / PIN_NAME, pth_line(source, relative))
