"""Snapshot compression: zstd on the way out, recognised by its magic bytes on the way in.

A snapshot archive is self-describing: a zstd frame starts with ``28 B5 2F FD`` and a plain
GNU tar never does (its first bytes are the manifest's name), so a reader never trusts a file
name or a metadata field to know which it holds, and every plain archive written before
compression existed still restores. ``zstandard`` comes with the ``cloud`` extra and is
imported only when an archive is compressed or a compressed one is read.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Protocol, cast

ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
# Level 3 (zstd's default): 0.18 of the plain size for the example runtime, in a quarter of
# the time level 6 takes for 0.16; decompression costs about the same at every level.
LEVEL: Final = 3
_CHUNK: Final = 1 << 20
# A frame asking for a larger window than zstd's own default limit (128 MiB) is refused
# rather than allocated: a store shared by a fleet is untrusted input.
_MAX_WINDOW: Final = 1 << 27


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class CorruptStream(OSError):
    """The compressed stream cannot be decoded (corrupt, truncated, or zstd unavailable)."""


@dataclass(frozen=True)
class Written:
    size: int
    sha256: str


def available() -> bool:
    try:
        import zstandard  # noqa: F401  (only asking whether it imports)
    except ImportError:
        return False
    return True


def compress_file(src: Path, dst: Path) -> Written:
    """Write ``src`` zstd-compressed to ``dst``; the size and digest are of ``dst``'s bytes."""
    import zstandard

    with src.open("rb") as fin, dst.open("wb") as fout:
        out = _Hashing(fout)
        # _Hashing has the write() and flush() the writer calls.
        writer = zstandard.ZstdCompressor(level=LEVEL).stream_writer(
            cast("IO[bytes]", out), closefd=False)
        with writer as z:
            shutil.copyfileobj(fin, z, _CHUNK)
    return Written(out.size, out.digest.hexdigest())


def digest_file(path: Path) -> Written:
    """Size and digest of a file stored as it is (no compression)."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return Written(size, digest.hexdigest())


def decoded(raw: Readable) -> Readable:
    """A reader of the plain archive in ``raw``, decompressing if it starts with zstd's magic.

    The returned reader's ``read(n)`` returns ``n`` bytes unless the archive ends first, as a
    file does: the archive reader expects whole chunks.
    """
    head = _read_full(raw, len(ZSTD_MAGIC))
    if head != ZSTD_MAGIC:
        return _Prefixed(head, raw)
    try:
        import zstandard
    except ImportError:
        raise CorruptStream("a zstd-compressed snapshot needs the zstandard package: "
                            "pip install 'kernel-bootstrap[cloud]'") from None
    # stream_reader calls only read(size) on its source.
    reader = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW).stream_reader(
        cast("IO[bytes]", _Prefixed(head, raw)), read_across_frames=True, closefd=False)
    return _Decoding(reader)


def _read_full(raw: Readable, size: int) -> bytes:
    parts: list[bytes] = []
    while size > 0:
        part = raw.read(size)
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


class _Prefixed:
    """``raw`` with the sniffed bytes put back in front."""

    def __init__(self, head: bytes, raw: Readable) -> None:
        self.head = head
        self.raw = raw

    def read(self, size: int = -1, /) -> bytes:
        if self.head and size > 0:
            out, self.head = self.head[:size], self.head[size:]
            return out + _read_full(self.raw, size - len(out))
        if self.head:
            out, self.head = self.head, b""
            return out + self.raw.read()
        return _read_full(self.raw, size) if size > 0 else self.raw.read()


class _Decoding:
    """Whole reads from a zstd stream reader, its errors as :class:`CorruptStream`."""

    def __init__(self, reader: IO[bytes]) -> None:
        self.reader = reader

    def read(self, size: int = -1, /) -> bytes:
        import zstandard

        try:
            return _read_full(self.reader, size) if size > 0 else self.reader.read()
        except zstandard.ZstdError as e:
            raise CorruptStream(f"corrupt zstd stream: {e}") from None


class _Hashing:
    """A write-only file that digests and counts what passes through it to ``out``."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()
