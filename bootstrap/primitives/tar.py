"""The tar format, both ways: streams and archives we write, and the reader that vets archives.

Writing uses :mod:`tarfile`'s header encoder: ``push`` streams POSIX (pax) headers, read by GNU
tar, busybox and bsdtar alike, with file contents read from disk a chunk at a time while the
stream is consumed, so memory stays bounded whatever the file sizes; a snapshot is a GNU-format
archive of a directory written by ``tarfile`` itself into any file-like destination (a file, or a
compressor on its way to a bucket: :func:`write_archive`).

Reading is hand-written, on purpose: a snapshot restore reads a 9k-file venv (12k headers) and
``tarfile`` spent ~20 us a header, longer than ``tar -x`` took to write the whole tree; this
:class:`Reader` spends ~7 us (``scripts/bench_snapshot.py --reader``). It accepts only what
:func:`write_archive` writes and hands each member to a caller's ``admit`` before any byte of
it is released, so what the caller extracts is exactly what was judged.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Final, Literal, NamedTuple, Protocol

from bootstrap.errors import BootstrapError

Kind = Literal["file", "dir", "symlink"]
BLOCK: Final = tarfile.BLOCKSIZE
RECORD: Final = tarfile.RECORDSIZE
END: Final = bytes(2 * BLOCK)
CHUNK: Final = 256 * 1024  # read from disk, handed on and vetted this much at a time
_ZERO_BLOCK: Final = bytes(BLOCK)
_TYPES: Final = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}
_GNU_MAGIC: Final = b"ustar  \0"  # magic and version as one field: GNU, not POSIX "ustar\x0000"
_LONG: Final = (b"L", b"K")  # GNU long name and long link name: the name is the data
_MAX_LONG: Final = 4096  # PATH_MAX; a longer name is not one write_archive wrote


class Readable(Protocol):
    """What :class:`Reader` reads from: a file, or a stream such as a download being decoded."""

    def read(self, size: int = -1, /) -> bytes: ...


class BadArchive(Exception):
    """An archive we will not use: not in our format, damaged, or holding a refused member."""


# --- writing ------------------------------------------------------------------------------------


def header(name: str, kind: Kind, mode: int, mtime_ns: int, size: int = 0,
           target: str | None = None) -> bytes:
    """One member's header, pax records only where a name needs them."""
    info = tarfile.TarInfo(name)
    info.type = _TYPES[kind]
    info.mode = mode
    # Whole seconds: a float would add a pax record to every member for no reader's benefit.
    info.mtime = mtime_ns // 1_000_000_000
    info.size = size if kind == "file" else 0
    info.linkname = target or ""
    # Owners are not restored (tar -o); zeros keep our uid/user name out of the target.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def file_data(path: Path, size: int, chunk: int = CHUNK) -> Iterator[bytes]:
    """Exactly ``size`` bytes of ``path`` and the block padding, a chunk at a time.

    BootstrapError names the file if it cannot be read or has shrunk: a stream that carried
    fewer bytes than its header promised would shift every later member.
    """
    remaining = size
    try:
        # O_NOFOLLOW: the caller saw a regular file; a symlink swapped in since is not followed.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with open(fd, "rb", buffering=0) as f:
            while remaining:
                data = f.read(min(chunk, remaining))
                if not data:
                    raise BootstrapError(f"{path}: the file shrank while it was being sent; "
                                         "try again")
                remaining -= len(data)
                yield data
    except OSError as err:
        raise BootstrapError(f"{path}: cannot read while sending it: {err.strerror}") from None
    if pad := -size % BLOCK:
        yield bytes(pad)


def coalesce(pieces: Iterable[bytes], size: int = CHUNK) -> Iterator[bytes]:
    """Join small pieces (headers, small files) into writes of about ``size`` bytes; pad the
    stream to whole tar records, as tar itself writes them."""
    buf = bytearray()
    total = 0
    for piece in pieces:
        total += len(piece)
        if not buf and len(piece) >= size:
            yield piece
            continue
        buf += piece
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    buf += bytes(-total % RECORD)
    if buf:
        yield bytes(buf)


def write_archive(out: IO[bytes], first: tuple[str, bytes], tree: Path, arcname: str,
                  skip: Callable[[str], bool]) -> None:
    """Write ``first`` (a name and its bytes), then ``tree`` as ``arcname``, GNU format, into
    ``out``, front to back (tarfile asks it for ``tell()`` once, then only writes).

    GNU, the only format :class:`Reader` accepts: pax, tarfile's default, adds an extended
    header per member for sub-second mtimes, doubling the headers to read. ``skip`` gets each
    member's archive name.
    """
    import io
    import time

    info = tarfile.TarInfo(first[0])
    info.size = len(first[1])
    info.mtime = int(time.time())
    info.mode = 0o644
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(first[1]))
        tar.add(tree, arcname=arcname, filter=lambda m: None if skip(m.name) else m)


# --- reading ------------------------------------------------------------------------------------


class Member(NamedTuple):
    kind: bytes  # b"0" file ("\0" is read as "0"), b"1" hard link, b"2" symlink, b"5" dir...
    name: str  # as stored, a directory's trailing "/" removed
    link: str  # a link's target as stored
    size: int
    mode: int


class Reader:
    """Reads an archive in the format :func:`write_archive` writes, chunk by chunk.

    GNU tar: ustar-style headers with the GNU magic, plus GNU 'L' (long name) and 'K' (long
    link) headers. Anything else (pax headers, GNU extension fields, a bad checksum, an archive
    that ends early) is BadArchive; every member is passed to ``admit``, which raises
    BadArchive to refuse it.
    """

    def __init__(self, file: Readable, archive: str | Path,
                 admit: Callable[[Member], None]) -> None:
        self.file = file
        self.archive = archive
        self.admit = admit
        self.buf = b""
        self.pos = 0  # where vetting continues in buf
        self.skip = 0  # data bytes (with padding) of the current file not yet in buf
        self.done = False  # the end-of-archive block has been vetted

    def bad(self, why: str) -> BadArchive:
        return BadArchive(f"{self.archive}: {why}")

    def first(self) -> tuple[Member, bytes]:
        """The first member and its data (only a small file fits); read before anything else.
        Not passed to ``admit``: the caller judges it."""
        self.buf = self.file.read(CHUNK)
        if len(self.buf) < BLOCK or self.buf[:BLOCK] == _ZERO_BLOCK:
            raise self.bad("empty; not a kernel-bootstrap archive")
        kind, size, mode = self._fields(self.buf[:BLOCK])
        member = Member(kind, _text(_cstr(self.buf, 0, 100)), "", size, mode)
        if kind != b"0" or BLOCK + size > len(self.buf):
            raise self.bad("its first member is not the small file a kernel-bootstrap "
                           "archive starts with")
        # Its padding may lie beyond this chunk.
        self.pos, self.skip = BLOCK, _padded(size)
        return member, self.buf[BLOCK:BLOCK + size]

    def vetted(self) -> Iterator[memoryview]:
        """The archive's bytes, each run only once every header in it is admitted, then the
        end-of-archive blocks. Call after :meth:`first`."""
        while True:
            end = self._scan()
            if end:
                yield memoryview(self.buf)[:end]
            if self.done:
                yield memoryview(END)  # tar stops here: trailing bytes are never sent
                return
            more = self.file.read(CHUNK)
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
        while len(buf) - pos >= BLOCK:
            block = buf[pos:pos + BLOCK]
            if block == _ZERO_BLOCK:
                if longs:
                    raise self.bad("a GNU long name header with no member after it")
                self.done = True
                return pos + BLOCK
            kind, size, mode = self._fields(block)
            pos += BLOCK
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
            name = _text(longs.get(b"L") or _cstr(block, 0, 100))
            link = _text(longs.get(b"K") or _cstr(block, 157, 257))
            if kind == b"5":
                name = name.removesuffix("/")  # tarfile writes directory names with a slash
            if size and kind != b"0":
                raise self.bad(f"unsafe member {name!r}: a link or directory carrying data")
            self.admit(Member(kind, name, link, size, mode))
            self.skip = _padded(size)
            return pos
        return None

    def _fields(self, block: bytes) -> tuple[bytes, int, int]:
        """Type (``\\0`` read as ``0``), size and mode of one header, after its checksum."""
        try:
            stored = _octal(block[148:156])
            size = _number(block[124:136])
            mode = _octal(block[100:108])
        except ValueError:
            raise self.bad("corrupt header (not a number where one belongs)") from None
        # The checksum field itself counts as eight spaces (8 * 0x20).
        if stored != sum(block) - sum(block[148:156]) + 256:
            raise self.bad("corrupt header (checksum mismatch)")
        if block[257:265] != _GNU_MAGIC:
            raise self.bad("not the GNU tar format kernel-bootstrap writes (a pax or v7 header)")
        # GNU keeps atime, ctime and sparse maps there; write_archive leaves them empty, and tar
        # implementations differ on what they mean: nothing we do not read may reach tar.
        if block.count(0, 345) != BLOCK - 345:
            raise self.bad("unexpected GNU extension fields in a header")
        kind = block[156:157]
        return (b"0" if kind == b"\0" else kind), size, mode


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
    return -(-size // BLOCK) * BLOCK
