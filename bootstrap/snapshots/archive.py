"""The snapshot archive: written in one format whatever the store, and on the way in every
member judged, then extracted by ``tar``.

:func:`write_snapshot` writes the manifest, then the venv as ``venv/``, into any file-like
destination: a file in a directory store, or a compressor on its way to a bucket.

A snapshot store may be shared by many machines, so an archive is untrusted input. It must be
in the one format :func:`tar.write_archive` produces; :class:`tar.Reader`
hands every member to :class:`Vetting` before ``tar -x`` sees its bytes, and ``tar`` is given
exactly the bytes that were judged (read once into our own buffer), so an archive changed while
it is being read cannot slip anything past the checks.

Links are judged by where they resolve inside the extracted tree, following the links extracted
before them (``lib/d -> .`` makes ``d/d/d/../../../X`` leave the venv although it normalises to
a path inside it). A link may not appear where an earlier link's target goes through a
directory: that would change, after the fact, where the earlier one points. One may appear
where an earlier link ends (uv writes ``bin/python -> python3.11`` before ``python3.11``), and
is then judged for both.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from bootstrap.errors import ProcessError
from bootstrap.primitives import process
from bootstrap.primitives.tar import BadArchive, Member, Readable, Reader, write_archive

# The one error a snapshot restore raises for an archive it cannot use.

MANIFEST: Final = "kernel-bootstrap-snapshot.json"
TOP: Final = "venv"
_PIPE: Final = 1 << 20  # tar's stdin holds this much (Linux): room for a few chunks
_KINDS: Final = (b"0", b"1", b"2", b"5")  # file, hard link, symlink, directory
_MAX_HOPS: Final = 40  # Linux's own limit on links followed in one path (ELOOP)
_INTERPRETER: Final = "\0interpreter"  # a resolution ending on an absolute bin/python* link


@dataclass(frozen=True)
class Snapshot:
    """One snapshot in a store, as ``snapshot list`` shows it: ``path`` is a file in a
    directory store, a URL in a bucket."""

    key: str
    path: Path | str
    size: int
    created: float
    platform: dict[str, str]


def write_snapshot(out: IO[bytes], venv: Path, key: str, platform: dict[str, str]) -> None:
    """The snapshot of ``venv`` for ``key`` built on ``platform``, written into ``out``.

    The tree archived is the one ``venv`` resolves to: a venv whose path is a link to its
    current generation would otherwise be archived as that link alone."""
    manifest = {"key": key, "platform": platform, "created": time.time(), "source": str(venv),
                "format": 1}
    tree = Path(os.path.realpath(venv))
    write_archive(out, (MANIFEST, json.dumps(manifest).encode()), tree, TOP, skip=_is_lock)


def _is_lock(name: str) -> bool:
    # uv's own venv lock and a generation's in-use lock file are per machine state, not part
    # of the environment.
    return name in (f"{TOP}/.lock", f"{TOP}/.in-use")


def open_snapshot(file: Readable, archive: str | Path) -> tuple[dict[str, Any], Reader]:
    """The manifest (the first member) and a reader positioned after it. ``archive`` names the
    snapshot (a path or a URL) in every error."""
    vetting = Vetting(archive)
    reader = Reader(file, archive, vetting.admit)
    first, data = reader.first()
    if first.name != MANIFEST or first.mode & 0o6000:
        raise BadArchive(f"{archive}: no manifest; not a kernel-bootstrap snapshot")
    try:
        manifest = json.loads(data)
    except ValueError:
        raise BadArchive(f"{archive}: corrupt manifest") from None
    if not isinstance(manifest, dict):
        raise BadArchive(f"{archive}: corrupt manifest")
    return manifest, reader


def open_for(file: Readable, archive: str | Path, key: str, platform: dict[str, str]) -> Reader:
    """:func:`open_snapshot`, refusing a snapshot built for another key or platform."""
    manifest, reader = open_snapshot(file, archive)
    if manifest.get("key") != key or manifest.get("platform") != platform:
        raise BadArchive(f"{archive}: built for another key or platform")
    return reader


class Vetting:
    """The member rules: everything lands under ``venv/``, nothing reaches outside it.

    Names stay under ``venv/`` with no ``..``, ``.`` or empty parts; only files, directories and
    links; no setuid bits; no member reached through (or replacing) a link. A symlink must
    resolve inside the venv, following earlier links; the only ones that may leave are the
    venv's own ``bin/python*`` (absolute, to its base interpreter, and aliases of those: a venv
    cannot work without them). A hard link names a clean path inside the venv that is neither a
    link nor reached through one (tar's ``link()`` follows links on the way to its target).
    """

    def __init__(self, archive: str | Path) -> None:
        self.archive = archive
        self.links: dict[str, str] = {}  # every link so far -> its target (hard: "")
        self.passed: set[str] = set()  # paths an earlier symlink's target goes through
        self.ends: dict[str, bool] = {}  # where earlier symlinks end -> one must stay inside

    def admit(self, m: Member) -> None:
        problem = self._problem(m)
        if problem:
            raise BadArchive(f"{self.archive}: unsafe member {m.name!r}: {problem}")
        if m.kind in (b"1", b"2"):
            self.links[m.name] = m.link if m.kind == b"2" else ""

    def _problem(self, m: Member) -> str | None:
        if m.kind not in _KINDS:
            return f"not a file, directory or link (type {m.kind!r})"
        parts = m.name.split("/")
        if parts[0] != TOP or not _clean(parts):
            return "outside the venv"
        if m.mode & 0o6000:
            return "setuid or setgid"
        if m.name in self.links or _through_link(m.name, self.links):
            return "reached through a link"
        if m.kind == b"2":
            return self._symlink_problem(m.name, parts, m.link)
        if m.kind == b"1":
            target = m.link.split("/")
            if target[0] != TOP or not _clean(target):
                return f"link leaving the venv to {m.link!r}"
            if m.link in self.links or _through_link(m.link, self.links):
                return f"hard link through a link to {m.link!r}"
        return None

    def _symlink_problem(self, name: str, parts: list[str], link: str) -> str | None:
        if name in self.passed:
            return "a link where an earlier link's target goes through a directory"
        interpreter = len(parts) == 3 and parts[1] in ("bin", "Scripts") and \
            parts[2].startswith("python")
        # Must stay inside: any link but the interpreter's, and the interpreter's too once an
        # earlier link ends on it (that link would leave the venv through it).
        strict = not interpreter or self.ends.get(name, False)
        if os.path.isabs(link) or link.startswith("/"):
            return f"absolute link to {link!r}" if strict else None
        end = self._resolve(parts[:-1], link) if link else None
        if end == name or name in self.passed:  # it would resolve through itself
            return f"link through itself to {link!r}"
        if end == _INTERPRETER and not strict:
            return None
        if end is None or end == _INTERPRETER or (end != TOP and not end.startswith(TOP + "/")):
            return f"link leaving the venv to {link!r}"
        # A link later extracted at ``end`` is judged knowing this one ends there.
        self.ends[end] = self.ends.get(end, False) or strict
        return None

    def _resolve(self, where: list[str], link: str) -> str | None:
        """Where ``link``, read in directory ``where``, leads over the links seen so far: a
        path in the tree, None (above it, through an absolute link, or too many hops), or
        ``_INTERPRETER`` (it ends on an absolute ``bin/python*`` link). Every path it goes
        through as a directory is remembered in ``passed``."""
        path = list(where)
        pending = [p for p in reversed(link.split("/")) if p not in ("", ".")]
        hops = 0
        while pending:
            part = pending.pop()
            if part == "..":
                if not path:
                    return None
                path.pop()
                continue
            path.append(part)
            here = "/".join(path)
            target = self.links.get(here)
            if not target:  # not a link, or a hard link (a file: nothing to follow)
                if pending:
                    self.passed.add(here)
                continue
            hops += 1
            if hops > _MAX_HOPS:
                return None
            if target.startswith("/"):
                return None if pending else _INTERPRETER
            path.pop()
            pending.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
        return "/".join(path)


def _clean(parts: list[str]) -> bool:
    return not ("" in parts or "." in parts or ".." in parts)


def _through_link(name: str, links: dict[str, str]) -> bool:
    """Whether a proper prefix of ``name`` is a link (one dict lookup per level)."""
    cut = name.find("/")
    while cut != -1 and links:
        if name[:cut] in links:
            return True
        cut = name.find("/", cut + 1)
    return False


def extract(reader: Reader, into: Path) -> None:
    """Hand ``tar -x`` the vetted bytes, one chunk per write, while vetting the next chunk."""
    import shutil

    tar_exe = shutil.which("tar")
    if tar_exe is None:
        _extract_with_tarfile(reader, into)
        return
    # -p keeps exec bits under any umask; -o does not chown to the archive's owners.
    try:
        with process.streaming(tar_exe, "-x", "-p", "-o", "-f", "-", "-C", into,
                               what="tar could not extract the snapshot") as stdin:
            _grow_pipe(stdin)
            for run in reader.vetted():
                stdin.write(run)
    except ProcessError as e:
        # Every member was vetted: what tar still refuses (a directory where the archive puts
        # a file...) makes the archive unusable, not the machine.
        raise BadArchive(f"{reader.archive}: {e}") from None


def _grow_pipe(pipe: IO[bytes]) -> None:
    # In a 64 KiB pipe each chunk waits for tar to drain it (a restore took 1.4x longer); with
    # room for several we vet the next one while tar writes files. Linux, up to pipe-max-size.
    if sys.platform != "linux":
        return
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _PIPE)


def _extract_with_tarfile(reader: Reader, into: Path) -> None:
    """No system tar: extract with tarfile from a private copy of exactly the vetted bytes."""
    import tarfile

    with tempfile.TemporaryFile() as copy:
        for run in reader.vetted():
            copy.write(run)
        copy.seek(0)
        try:
            with tarfile.open(fileobj=copy, mode="r:") as tar:
                tar.extractall(into, filter="fully_trusted")  # vetted above
        except (tarfile.TarError, OSError) as e:
            raise BadArchive(f"{reader.archive}: unreadable archive: {e}") from None
