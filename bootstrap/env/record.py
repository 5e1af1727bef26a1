"""Whether a venv's installed distributions still hold the files their ``RECORD`` lists.

uv decides that a distribution is installed from its ``*.dist-info`` alone. A uv call that
died half-way through a package (a full disk) left numpy's dist-info without numpy's files; the
next call skipped numpy as installed, the rebuild's checks passed, and a runtime that could not
``import numpy`` was put in place while ``status`` and ``repair`` called it healthy (issue 31).
The metadata cannot tell; each distribution's ``RECORD`` (path, hash, size of every file it
installed) can. A rebuild checks sizes before the flip (``engine/rebuild.py``); ``repair``
checks hashes as well (``engine/repair.py``).

Read in this process, on the site-packages path, not by the venv's interpreter: the check must
work on a venv whose interpreter or ``importlib.metadata`` is what is broken, it costs no
process start (15-60 ms) in a rebuild, and every ``RECORD`` goes through our bounded,
non-following reader (``fs.read_state_file``) instead of an unbounded one in a child.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bootstrap.env.requirements import canonical
from bootstrap.env.venv import Venv
from bootstrap.errors import BootstrapError
from bootstrap.primitives.fs import open_regular, read_state_file

# The largest real RECORD we know of is a few MiB (tens of thousands of files); the cap only
# stops a planted file from being read whole. A larger one counts as unreadable.
RECORD_LIMIT: Final = 64 * 1024 * 1024
# Hashes are "where cheap": sources and small data (what a person edits by hand), not the
# hundreds of MiB of a large runtime's shared libraries, whose size is still compared.
HASH_LIMIT: Final = 1024 * 1024
_EXAMPLES: Final = 3


class Incomplete(BootstrapError):
    """A venv about to be put in place lacks files its distributions' RECORDs list."""


@dataclass(frozen=True)
class Damage:
    """One distribution whose files are not what its RECORD says."""

    name: str  # canonical project name
    version: str
    problems: tuple[str, ...]  # the first few, each naming a file
    count: int  # how many in all

    def describe(self) -> str:
        more = self.count - len(self.problems)
        tail = f" (and {more} more file{'s' if more > 1 else ''})" if more > 0 else ""
        return f"{self.name} {self.version}: {'; '.join(self.problems)}{tail}"


def damaged(venv: Path, *, hashes: bool = False) -> list[Damage]:
    """Every distribution in ``venv`` (``<venv>`` is its current generation) with a file
    missing or of another size than its RECORD says; ``hashes``: or, for a file of at most
    :data:`HASH_LIMIT` bytes, other content."""
    root = os.path.realpath(venv)
    found: list[Damage] = []
    for site in Venv.at(Path(root)).site_packages():
        for dist_info in _dist_infos(site):
            damage = _check(site, dist_info, root, hashes)
            if damage is not None:
                found.append(damage)
    return sorted(found, key=lambda d: d.name)


def checking(venv: Path) -> Callable[[], list[Damage]]:
    """:func:`damaged` (sizes) started in a thread now; the function returned waits for it
    and returns its result (or raises what it raised).

    A rebuild starts it as soon as uv has installed the runtime, and installs the pin while it
    runs: the check is ~7,000 ``lstat`` calls for an ipykernel runtime (~55 ms), the pin's
    writes mostly wait on fsync, and both release the GIL. The rebuild waits for it before
    the base marker (``engine/rebuild.py``): a runtime is still never marked complete, nor put
    in place, unchecked.
    """
    import threading

    found: list[list[Damage]] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            found.append(damaged(venv))
        except BaseException as e:  # handed to the waiting thread, raised there
            failed.append(e)

    # A daemon: a rebuild that fails meanwhile must not wait for a check nobody reads.
    thread = threading.Thread(target=run, name="kernel-bootstrap-record-check", daemon=True)
    thread.start()

    def result() -> list[Damage]:
        thread.join()
        if failed:
            raise failed[0]
        return found[0]

    return result


def summary(found: list[Damage]) -> str:
    """One line for a message: the first few distributions, then how many more."""
    text = ", ".join(d.describe() for d in found[:_EXAMPLES])
    more = len(found) - _EXAMPLES
    return text + (f", and {more} more distribution{'s' if more > 1 else ''}" if more > 0 else "")


def _dist_infos(site: Path) -> list[Path]:
    try:
        entries = list(os.scandir(site))
    except OSError:
        return []
    # A dot name is an installer's own half-written leftover, never an installed distribution.
    return sorted(Path(e.path) for e in entries
                  if e.name.endswith(".dist-info") and not e.name.startswith(".")
                  and e.is_dir(follow_symlinks=False))


def _check(site: Path, dist_info: Path, root: str, hashes: bool) -> Damage | None:
    name, _, version = dist_info.name.removesuffix(".dist-info").rpartition("-")
    name = canonical(name or dist_info.name)
    try:
        text = read_state_file(dist_info / "RECORD", RECORD_LIMIT).decode("utf-8", "replace")
    except FileNotFoundError:
        return Damage(name, version, ("its RECORD is missing",), 1)
    except (OSError, ValueError) as e:
        return Damage(name, version, (f"its RECORD is unreadable: {e}",), 1)
    # Strings, not Paths: a large runtime lists thousands of files (numpy ~1,000).
    where = (str(site) + os.sep, f"{dist_info.name}/RECORD", root + os.sep)
    try:
        problems = _problems(where, csv.reader(io.StringIO(text)), hashes)
    except csv.Error as e:  # a NUL byte, a field over csv's limit: not a RECORD uv wrote
        return Damage(name, version, (f"its RECORD is unreadable: {e}",), 1)
    if not problems:
        return None
    return Damage(name, version, tuple(problems[:_EXAMPLES]), len(problems))


def _problems(where: tuple[str, str, str], rows: Iterable[list[str]],
              hashes: bool) -> list[str]:
    """What is wrong with the files of ``rows``, in order.

    Nearly every line names a plain path below site-packages of a regular file at its size:
    those take one ``lstat`` and two comparisons here (a large runtime has ~7,000 lines, and
    the full :func:`_row_problem` cost ~9 us a line). Anything else, and every line when
    ``hashes`` are asked for, goes through :func:`_row_problem`, which judges it as before: a
    line passed here would pass there too (or be skipped there, which also means no problem).
    """
    site, lstat, problems = where[0], os.lstat, []
    for row in rows:
        if not hashes and len(row) == 3:
            path, _, size = row
            # Never a path that could leave the venv: only those are normalised and vetted.
            if size and path and path[0] not in "/\\" and ".." not in path and ":" not in path:
                try:
                    st = lstat(site + path)
                except (OSError, ValueError):
                    pass
                else:
                    if stat.S_ISREG(st.st_mode) and str(st.st_size) == size:
                        continue
        problem = _row_problem(where, row, hashes)
        if problem:
            problems.append(problem)
    return problems


def _row_problem(where: tuple[str, str, str], row: list[str], hashes: bool) -> str | None:
    """What is wrong with the file of one RECORD line; ``where``: site-packages, the RECORD's
    own line, the venv (each a string ending in a separator but the second)."""
    site, own, root = where
    path = row[0] if row else ""
    # Not the RECORD itself (nor its signatures, which no line can hash), not bytecode, which
    # the interpreter writes and rewrites.
    if not path or path.startswith(own) or path.endswith((".pyc", ".pyo")) \
            or "__pycache__" in path:
        return None
    # Only what lies in the venv: a RECORD may name a data file installed elsewhere (an
    # absolute path) or, planted, anything at all; those are not ours to look at. Nearly every
    # line names a plain path below site-packages, which needs no normalising (~20% of the
    # check's time when every line had it).
    target = site + path
    if ".." in path or ":" in path or path.startswith(("/", "\\")):
        target = os.path.normpath(target)
        if os.path.isabs(path) or not target.startswith(root):
            return None
    try:
        st = os.lstat(target)
        if stat.S_ISLNK(st.st_mode):  # uv's --link-mode symlink: the cache's file
            st = os.stat(target)
    except FileNotFoundError:
        return f"{path} is missing"
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    except ValueError:  # a NUL byte: no file has that name
        return f"{path!r} cannot be a file name"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a file"
    size = row[2].strip() if len(row) > 2 else ""
    if size.isdigit() and int(size) != st.st_size:
        return f"{path} has {st.st_size} bytes, its RECORD says {size}"
    digest = row[1].strip() if len(row) > 1 else ""
    if hashes and digest and st.st_size <= HASH_LIMIT and not _same_hash(target, digest):
        return f"{path} differs from what was installed"
    return None


def _same_hash(target: str, digest: str) -> bool:
    """Whether the file's content has RECORD's hash (an algorithm we lack counts as same)."""
    algorithm, _, expected = digest.partition("=")
    if algorithm not in hashlib.algorithms_guaranteed or not expected:
        return True
    try:
        # Never through a link, never blocking on a FIFO: a planted name costs one refusal.
        fd = open_regular(Path(target))
    except OSError:
        return os.path.islink(target)  # a symlinked install: its size was checked
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            actual = hashlib.new(algorithm, f.read(HASH_LIMIT + 1)).digest()
    finally:
        os.close(fd)
    return base64.urlsafe_b64encode(actual).rstrip(b"=").decode() == expected.rstrip("=")
