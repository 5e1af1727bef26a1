"""The pin: a ``.pth`` in each generation that keeps a process on the generation it started in.

An interpreter started as ``<venv>/bin/python`` computes ``sys.prefix`` from that path, not
from what the ``<venv>`` symlink points at; every later import would then go through the link
and, after a rebuild, read the next generation's files. ``site`` runs ``.pth`` lines starting
with ``import`` at start, in name order, and this one's name sorts before every other in
site-packages (digits before ``_`` and letters), so it runs before any other ``.pth`` adds
paths. It:

- re-points ``sys.prefix``, ``sys.exec_prefix``, ``sys.executable`` and the ``sys.path``
  entries under the symlinked prefix to the generation's real path: one ``readlink`` where the
  process started through ``<venv>``, our link to a generation beside it; ``os.path.realpath``
  (~0.1 ms, an ``lstat`` per component) only where it started through an alias of ``<venv>``
  (``/opt/kernel -> <venv>``), whose first link names ``<venv>``, not the generation.
  ``sys.executable`` too, so that a child started as ``sys.executable`` (multiprocessing's
  spawn and forkserver, ``-m pip``) runs in its parent's generation; a child started
  through ``<venv>/bin/python`` itself gets the current generation, as any new start does;
- locks ``<generation>/.in-use`` and keeps the descriptor open (non-inheritable) until the
  process exits. The lock is a POSIX record lock on one byte, the one at the process's pid:
  locks of different processes on different bytes never conflict, ``os.lockf`` needs no
  import (``fcntl`` is an extension module to load, ~0.3 ms, a quarter of the pin's cost), and
  removal's non-blocking read lock over the whole file conflicts with every one of them. A
  fork does not inherit a record lock, so the pin has each forked child take its own byte,
  through its descriptor only while that is still the pin's file (the device and inode it
  locked): code that closed it (``os.closerange``, daemonising) may have opened a file of its
  own at that number, whose offset and locks are not ours to touch.
  Where the file is not ours to write (a generation another user built, a read-only disk) it
  takes a shared ``flock`` instead, which removal tests too. The kernel drops either lock when
  the process ends, also after a SIGKILL, so nothing depends on a process cleaning up after
  itself.

CPython's ``site`` processes a venv's site-packages twice, once for the venv and once more for
``sys.prefix`` among the site prefixes: every ``.pth`` import line runs again, and once the
prefix is re-pointed the real site-packages directory would be added to ``sys.path`` a second
time. The pin has that second pass leave the venv's own directory out, as a start outside a
venv does, after re-pointing the entries the generation's other ``.pth`` files added (each
Python skill has one). Every ``.pth`` then runs once, which in a venv with a few of them more
than pays for the pin. Run again after all (a caller's ``site.addsitedir``), it only drops
duplicates.

If removal won the race (it holds its lock, or has already unlinked the file), the pin starts
over from the symlink, which names the current generation by then. Anything unexpected leaves
the interpreter as it was: a pin must never stop a kernel from starting.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Final

from bootstrap.primitives import process
from bootstrap.primitives.atomic import write_atomic
from bootstrap.primitives.fs import fsync_dir, write_file

PIN_NAME: Final = "000-kernel-bootstrap-pin.pth"
MODULE: Final = "_kernel_bootstrap_pin"
IN_USE: Final = ".in-use"

# The .pth runs the module beside it from its bytecode, loaded by path: an import would search
# sys.path and go through importlib's checks (~0.1 ms more), and site compiles the .pth line at
# every start, so the line stays short and holds no try statement. os and sys are loaded
# already.
_SOURCE: Final = """\
\"\"\"kernel-bootstrap's generation pin (see 000-kernel-bootstrap-pin.pth); never import it.\"\"\"
import os, sys


def _hold(fd):
    os.lseek(fd, os.getpid(), 0)
    os.lockf(fd, os.F_LOCK, 1)


def _rehold(fd, ours):
    try:  # only while fd is still our file: code that closed it may have put its own there
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == ours:
            _hold(fd)
    except OSError:
        pass


def _fcntl():
    if "fcntl" not in sys.builtin_module_names:
        try:  # by its path: an import would list the standard library's directories (~0.2 ms)
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
            pass  # kept elsewhere by this build: the import finds it
    import fcntl
    return fcntl


def _flock(fd):
    fcntl = _fcntl()
    fcntl.flock(fd, fcntl.LOCK_SH)


def _lock(path):
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        _flock(fd)
        return fd, False
    _hold(fd)
    return fd, True


def _real(link):
    try:
        target = os.readlink(link)
    except OSError:
        return link  # started through a generation's own path (or a plain venv)
    if "/" not in target and target.startswith("." + os.path.basename(link) + %(gen)r):
        # <venv>, our link to a generation beside it: one readlink, not realpath's lstat
        # per component
        return os.path.join(os.path.dirname(link), target)
    # An alias (/opt/kernel -> <venv>): one readlink gave <venv>, whose next target a rebuild
    # changes under the running process. The whole chain, however it is spelled.
    return os.path.realpath(link)


def _pin():
    link = sys.prefix
    for _ in range(3):
        real = _real(link)
        try:
            fd, record = _lock(real + %(in_use)r)
        except OSError:
            continue
        st = os.fstat(fd)
        if st.st_nlink:
            break
        os.close(fd)
    else:
        return None
    if record:
        ours = st.st_dev, st.st_ino
        os.register_at_fork(after_in_child=lambda: _rehold(fd, ours))
    if real == link:
        return None
    n, under = len(link), link + os.sep

    def moved():
        sys.path[:] = [real + p[n:] if p == link or p.startswith(under) else p
                       for p in sys.path]

    sys.prefix = sys.exec_prefix = real
    sys.executable = real + sys.executable[n:] if sys.executable.startswith(under) \
        else sys.executable
    moved()
    return moved


def _once(moved):
    site = sys.modules["site"]
    add = site.addsitepackages

    def addsitepackages(known_paths, prefixes=None):
        site.addsitepackages = add
        if moved:
            moved()
        if prefixes is None:
            prefixes = [p for p in site.PREFIXES if p != sys.prefix]
        return add(known_paths, prefixes)

    site.addsitepackages = addsitepackages


if __name__ in sys.modules:  # run again after all: drop a duplicate the re-pointing made
    seen = set()
    sys.path[:] = [p for p in sys.path if not (p in seen or seen.add(p))]
else:
    sys.modules[__name__] = type(sys)(__name__)
    try:
        _once(_pin())
    except Exception:
        pass
"""


# The word in a generation's name (``.<venv>.gen-*``): generations.py names them with it, and
# the pin tells a generation from an alias of ``<venv>`` by it.
GEN: Final = "gen"


def module_source() -> bytes:
    return (_SOURCE % {"in_use": os.sep + IN_USE, "gen": f".{GEN}-"}).encode()


# The one line of the .pth (site executes a line only if it starts with "import", and whole;
# an exception would be printed, so only a damaged generation, its files gone, could raise).
# Paths are relative to sys.prefix: the generation's own, or <venv> naming it at this instant.
# Bytecode of another interpreter (its magic number differs) is not run: the source is.
_LINE: Final = (
    "import sys; _kb = open(sys.prefix + {pyc!r}, 'rb').read(); exec("
    "compile(open(sys.prefix + {source!r}, 'rb').read(), {source!r}, 'exec') "
    "if _kb[:4] != sys.modules['_frozen_importlib_external'].MAGIC_NUMBER "
    "else sys.modules['marshal'].loads(_kb[16:]), {{'__name__': {module!r}}})\n")


def pth_line(source: str, pyc: str) -> bytes:
    """The ``.pth`` line running the module at ``source`` (its bytecode at ``pyc``), both
    relative to the generation."""
    return _LINE.format(module=MODULE, source="/" + source, pyc="/" + pyc).encode()


# Prints where the bytecode went; py_compile writes even under PYTHONDONTWRITEBYTECODE, which
# kernels may run with.
_COMPILE: Final = "import py_compile, sys; print(py_compile.compile(sys.argv[1], doraise=True))"


def install(generation: Path, site_packages: list[Path], python: Path) -> None:
    """Make ``generation`` pin the processes that start in it: its ``.in-use`` file, then the
    module and the ``.pth`` in each of its site-packages directories (durable: the base marker
    written after them says the generation is complete), the module's bytecode compiled by the
    generation's own interpreter (the cache tag is its version's, not ours)."""
    _in_use(generation / IN_USE)
    for directory in site_packages:
        if directory.is_dir():
            module = directory / f"{MODULE}.py"
            # The .pth's write below syncs this directory, the module's rename included; the
            # .pth, which names the module, lands after it.
            write_atomic(module, module_source(), sync_dir=False)
            source = module.relative_to(generation).as_posix()
            pyc = _compiled(python, module)
            relative = pyc.relative_to(generation).as_posix() \
                if pyc is not None and pyc.is_relative_to(generation) else source
            write_atomic(directory / PIN_NAME, pth_line(source, relative))


def _in_use(path: Path) -> None:
    """The empty ``.in-use`` file, durable. Created in place: an empty file has no bytes a
    reader could see half-written, and no data a power loss could lose, so only its
    directory entry is synced (one fsync, where a temp file and a rename took two)."""
    try:
        write_file(path, b"", exclusive=True)
    except FileExistsError:
        return
    fsync_dir(path.parent)


def _compiled(python: Path, module: Path) -> Path | None:
    """The module's bytecode, as ``python`` would write and read it; None if none was written
    (the pin still works without it, compiled at every start, ~0.5 ms)."""
    tag = sys.implementation.cache_tag
    if tag and os.path.realpath(python) == os.path.realpath(sys.executable):
        # The very binary running us (the common case): same magic number and cache tag, so
        # it is compiled here, not in a child that cost a locked rebuild an interpreter start
        # (~40 ms). Named in the module's own __pycache__: a PYTHONPYCACHEPREFIX of ours
        # would put it outside the generation.
        import py_compile

        pyc = module.parent / "__pycache__" / f"{module.stem}.{tag}.pyc"
        try:
            py_compile.compile(str(module), cfile=str(pyc), doraise=True, optimize=0)
        except (OSError, py_compile.PyCompileError):
            return None
        return pyc
    done = process.run(python, "-c", _COMPILE, module, check=False, timeout=60)
    return Path(done.stdout.strip()) if done.returncode == 0 else None
