"""Snapshot compression: zstd on the way out, recognised by its magic bytes on the way in.

A snapshot archive is self-describing: a zstd frame starts with ``28 B5 2F FD`` and a plain
GNU tar never does (its first bytes are the manifest's name), so a reader never trusts a file
name or a metadata field to know which it holds, and every plain archive written before
compression existed still restores. ``zstandard`` comes with the ``cloud`` extra and is
imported only when an archive is compressed or a compressed one is read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import IO, Final, cast

from bootstrap.primitives.tar import Readable

ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
# Level 3 (zstd's default): 0.18 of the plain size for the example runtime, in a quarter of
# the time level 6 takes for 0.16; decompression costs about the same at every level.
LEVEL: Final = 3
# A frame asking for a larger window than zstd's own default limit (128 MiB) is refused
# rather than allocated: a store shared by a fleet is untrusted input.
_MAX_WINDOW: Final = 1 << 27


class CorruptStream(OSError):
    """The compressed stream cannot be decoded (corrupt, truncated, or zstd unavailable)."""


def available() -> bool:
    try:
        import zstandard  # noqa: F401  (only asking whether it imports)
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def compressed(out: IO[bytes]) -> Iterator[IO[bytes]]:
    """A file whose bytes reach ``out`` as one zstd frame, ended when the block ends; ``out``
    itself where zstandard is not installed (a plain archive restores just as well)."""
    if not available():
        yield out
        return
    import zstandard

    with zstandard.ZstdCompressor(level=LEVEL).stream_writer(out, closefd=False) as z:
        yield z


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
