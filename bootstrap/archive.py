"""The snapshot archive on the way in: vetted header by header, then extracted by ``tar``.

A snapshot store may be shared by many machines, so an archive is untrusted input. It must be
in the one format :meth:`bootstrap.snapshot.Store.write` produces (GNU tar); every member is
judged lexically before ``tar -x`` sees its bytes, and ``tar`` is given exactly the bytes that
were judged (read once into our own buffer), so an archive changed while it is being read
cannot slip anything past the checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final

from bootstrap import process
from bootstrap.errors import ProcessError

MANIFEST: Final = "kernel-bootstrap-snapshot.json"
TOP: Final = "venv"
_BLOCK: Final = 512
_CHUNK: Final = 1 << 18  # read, vetted and handed to tar this much at a time
_PIPE: Final = 1 << 20  # tar's stdin holds this much (Linux): room for a few chunks
_ZERO_BLOCK: Final = bytes(_BLOCK)
_END: Final = bytes(2 * _BLOCK)
_GNU_MAGIC: Final = b"ustar  \0"  # magic and version as one field: GNU, not POSIX "ustar\x0000"
_LONG: Final = (b"L", b"K")  # GNU long name and long link name: the name is the data
_MAX_LONG: Final = 4096  # PATH_MAX; a longer name is not one Store.write wrote
_KINDS: Final = (b"0", b"1", b"2", b"5")  # file ("\0" is read as "0"), hard link, symlink, dir


class BadSnapshot(Exception):
    """Why an archive cannot be used; always turned into a warning plus a normal build."""


class Reader:
    """Vets an archive in the one format :meth:`Store.write` produces, chunk by chunk.

    GNU tar: ustar-style headers with the GNU magic, plus GNU 'L' (long name) and 'K' (long
    link) headers; members are files, hard links, symlinks and directories. Anything else (pax
    headers, devices, fifos, sparse files, GNU extension fields, a bad checksum, an archive that
    ends early) is a BadSnapshot. tarfile spent ~20 us a header (a 9k-file venv has 12k
    headers), longer than ``tar -x`` took for the whole tree; this reader spends ~8 us. The
    member rules are lexical (no realpath) and listed in :func:`_member_problem`.
    """

    def __init__(self, file: IO[bytes], archive: Path) -> None:
        self.file = file
        self.archive = archive
        self.buf = b""
        self.pos = 0  # where vetting continues in buf
        self.skip = 0  # data bytes (with padding) of the current file not yet in buf
        self.done = False  # the end-of-archive block has been vetted
        self.links: set[str] = set()

    def bad(self, why: str) -> BadSnapshot:
        return BadSnapshot(f"{self.archive}: {why}")

    def manifest(self) -> dict[str, Any]:
        """The first member, which must be the manifest; read before anything is extracted."""
        self.buf = self.file.read(_CHUNK)
        if len(self.buf) < _BLOCK or self.buf[:_BLOCK] == _ZERO_BLOCK:
            raise self.bad("no manifest; not a kernel-bootstrap snapshot")
        kind, size, mode = self._fields(self.buf[:_BLOCK])
        if kind != b"0" or _cstr(self.buf, 0, 100) != MANIFEST.encode() or mode & 0o6000:
            raise self.bad("no manifest; not a kernel-bootstrap snapshot")
        if _BLOCK + size > len(self.buf):
            raise self.bad("corrupt manifest")
        try:
            data = json.loads(self.buf[_BLOCK:_BLOCK + size])
        except ValueError:
            raise self.bad("corrupt manifest") from None
        if not isinstance(data, dict):
            raise self.bad("corrupt manifest")
        # Extracted beside the venv tree, harmless. Its padding may lie beyond this chunk.
        self.pos, self.skip = _BLOCK, _padded(size)
        return data

    def vetted(self) -> Iterator[memoryview]:
        """The archive's bytes, each run only once every header in it is vetted, then the
        end-of-archive blocks. Call after :meth:`manifest`."""
        while True:
            end = self._scan()
            if end:
                yield memoryview(self.buf)[:end]
            if self.done:
                yield memoryview(_END)  # tar stops here: trailing bytes are never sent
                return
            more = self.file.read(_CHUNK)
            if not more:
                raise self.bad("truncated: the archive ends inside a member")
            # Only an incomplete header group is carried over (a few KiB at most).
            self.buf = self.buf[end:] + more
            self.pos -= end

    def _scan(self) -> int:
        """Vet from ``pos`` as far as ``buf`` holds whole headers; return that offset."""
        buf, pos = self.buf, self.pos
        while not self.done:
            if self.skip:
                step = min(self.skip, len(buf) - pos)
                pos += step
                self.skip -= step
                if self.skip:
                    break
            after = self._member(buf, pos)
            if after is None:
                break
            pos = after
        self.pos = pos
        return pos

    def _member(self, buf: bytes, pos: int) -> int | None:
        """Vet the header group at ``pos`` (long-name headers, then the member's); return the
        offset of its data, or None if ``buf`` ends inside the group."""
        longs: dict[bytes, bytes] = {}
        while len(buf) - pos >= _BLOCK:
            header = buf[pos:pos + _BLOCK]
            if header == _ZERO_BLOCK:
                if longs:
                    raise self.bad("a GNU long name header with no member after it")
                self.done = True
                return pos + _BLOCK
            kind, size, mode = self._fields(header)
            pos += _BLOCK
            if kind in _LONG:
                if kind in longs or not 1 < size <= _MAX_LONG:
                    raise self.bad("malformed GNU long name header")
                if pos + size > len(buf):
                    return None
                value = buf[pos:pos + size]
                if value.find(0) != size - 1:
                    raise self.bad("malformed GNU long name header")
                longs[kind] = value[:-1]
                pos += _padded(size)
                continue
            name = longs.get(b"L") or _cstr(header, 0, 100)
            link = longs.get(b"K") or _cstr(header, 157, 257)
            self._admit(kind, _text(name), _text(link), size, mode)
            self.skip = _padded(size) if kind == b"0" else 0
            return pos
        return None

    def _fields(self, header: bytes) -> tuple[bytes, int, int]:
        """Type (``\\0`` read as ``0``), size and mode of one header, after its checksum."""
        try:
            stored = _octal(header[148:156])
            size = _number(header[124:136])
            mode = _octal(header[100:108])
        except ValueError:
            raise self.bad("corrupt header (not a number where one belongs)") from None
        # The checksum field itself counts as eight spaces (8 * 0x20).
        if stored != sum(header) - sum(header[148:156]) + 256:
            raise self.bad("corrupt header (checksum mismatch)")
        if header[257:265] != _GNU_MAGIC:
            raise self.bad("not the GNU tar format kernel-bootstrap writes (a pax or v7 header)")
        # GNU keeps atime, ctime and sparse maps there; Store.write leaves them empty, and tar
        # implementations differ on what they mean: nothing we do not read may reach tar.
        if header.count(0, 345) != _BLOCK - 345:
            raise self.bad("unexpected GNU extension fields in a header")
        kind = header[156:157]
        return (b"0" if kind == b"\0" else kind), size, mode

    def _admit(self, kind: bytes, name: str, link: str, size: int, mode: int) -> None:
        if kind == b"5":
            name = name.removesuffix("/")  # tarfile writes directory names with a slash
        problem = _member_problem(name, kind, link, mode, self.links)
        if problem is None and size and kind != b"0":
            problem = "a link or directory carrying data"
        if problem:
            raise self.bad(f"unsafe member {name!r}: {problem}")
        if kind in (b"1", b"2"):
            self.links.add(name)


def _member_problem(name: str, kind: bytes, link: str, mode: int, links: set[str]) -> str | None:
    """Why a member could write outside the venv tree, or None.

    Names stay under ``venv/`` with no ``..``, ``.`` or empty parts; only files, directories
    and links; no setuid bits; no member reached through (or replacing) a link; relative links
    stay inside, and the only absolute links are the venv's own ``bin/python*`` pointing at its
    base interpreter (a venv cannot work without those).
    """
    if kind not in _KINDS:
        return f"not a file, directory or link (type {kind!r})"
    parts = name.split("/")
    if parts[0] != TOP or "" in parts or "." in parts or ".." in parts:
        return "outside the venv"
    if mode & 0o6000:
        return "setuid or setgid"
    if _through_link(name, links) or name in links:
        return "reached through a link"
    if kind == b"2" and (os.path.isabs(link) or link.startswith("/")):
        if len(parts) == 3 and parts[1] in ("bin", "Scripts") and parts[2].startswith("python"):
            return None
        return f"absolute link to {link!r}"
    if kind in (b"1", b"2"):
        target = os.path.normpath(os.path.join(os.path.dirname(name) if kind == b"2" else "",
                                               link))
        if not link or (target != TOP and not target.startswith(TOP + "/")):
            return f"link leaving the venv to {link!r}"
        # tar's link() follows links on the way to its target, and a hard link to a symlink
        # moves the symlink's relative target to another directory.
        if kind == b"1" and (target in links or _through_link(target, links)):
            return f"hard link through a link to {link!r}"
    return None


def _through_link(name: str, links: set[str]) -> bool:
    """Whether a proper prefix of ``name`` is a link (one set lookup per level)."""
    cut = name.find("/")
    while cut != -1 and links:
        if name[:cut] in links:
            return True
        cut = name.find("/", cut + 1)
    return False


def _octal(field: bytes) -> int:
    # Strict: octal digits then NULs or spaces, as tarfile writes them. int() alone would also
    # take "+", "_" and whitespace, which tar reads differently (or not at all).
    digits = field.rstrip(b" \0")
    if not digits or digits.translate(None, b"01234567"):
        raise ValueError(field)
    return int(digits, 8)


def _number(field: bytes) -> int:
    # GNU base-256 (first byte 0x80): tarfile writes sizes of 8 GiB and more that way.
    return int.from_bytes(field[1:], "big") if field[:1] == b"\x80" else _octal(field)


def _cstr(buf: bytes, start: int, end: int) -> bytes:
    nul = buf.find(0, start, end)
    return buf[start:nul if nul != -1 else end]


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")  # as tarfile and tar name files


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


def extract(reader: Reader, into: Path) -> None:
    """Hand ``tar -x`` the vetted bytes, one chunk per write, while vetting the next chunk."""
    import shutil
    import subprocess

    tar_exe = shutil.which("tar")
    if tar_exe is None:
        _extract_with_tarfile(reader, into)
        return
    # -p keeps exec bits under any umask; -o does not chown to the archive's owners. Not
    # process.run: we write its stdin while we parse, which run() cannot do.
    argv = (tar_exe, "-x", "-p", "-o", "-f", "-", "-C", str(into))
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=err,
                                env=process.child_env())
        assert proc.stdin is not None
        _grow_pipe(proc.stdin)
        try:
            for run in reader.vetted():
                proc.stdin.write(run)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # tar stopped reading; its exit code and stderr say why
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if proc.wait() != 0:
            err.seek(0)
            raise ProcessError(argv, proc.returncode, err.read().decode(errors="replace"),
                               "tar could not extract the snapshot")


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
        except tarfile.TarError as e:
            raise BadSnapshot(f"{reader.archive}: unreadable archive: {e}") from None
