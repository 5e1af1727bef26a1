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
        problems = [p for row in csv.reader(io.StringIO(text))
                    if (p := _row_problem(where, row, hashes))]
    except csv.Error as e:  # a NUL byte, a field over csv's limit: not a RECORD uv wrote
        return Damage(name, version, (f"its RECORD is unreadable: {e}",), 1)
    if not problems:
        return None
    return Damage(name, version, tuple(problems[:_EXAMPLES]), len(problems))


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
