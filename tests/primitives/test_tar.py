"""The tar reader (primitives/tar.py): what it admits from the format write_archive writes, and
what it refuses, judged on bytes another process would hand it."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bootstrap.primitives.tar import BLOCK, BadArchive, Member, Reader, write_archive

LONG = "d/" + "n" * 150  # over ustar's 100-byte name field: a GNU 'L' header carries it


def _tree(root: Path) -> Path:
    (root / "d").mkdir(parents=True)
    (root / LONG).write_text("long\n")
    (root / "d" / "f").write_bytes(b"x" * 3000)
    os.symlink("f", root / "d" / "link")
    os.symlink("../" + "t" * 120, root / "d" / "longlink")  # a GNU 'K' header
    return root


def _archive(tree: Path) -> bytes:
    out = io.BytesIO()
    write_archive(out, ("manifest.json", b"{}"), tree, "top", skip=lambda name: False)
    return out.getvalue()


def _read(data: bytes) -> tuple[list[Member], bytes]:
    seen: list[Member] = []
    reader = Reader(io.BytesIO(data), "a.tar", seen.append)
    reader.first()
    passed = b"".join(bytes(v) for v in reader.vetted())
    return seen, passed


def _gnu(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    return member.tobuf(tarfile.GNU_FORMAT) + data + bytes(-len(data) % BLOCK)


def _first() -> bytes:
    info = tarfile.TarInfo("manifest.json")
    info.size = 2
    return _gnu(info, b"{}")


def test_every_member_is_admitted_with_its_long_name_and_link(tmp_path: Path) -> None:
    seen, _ = _read(_archive(_tree(tmp_path / "t")))
    got = {m.name: (m.kind, m.link, m.size) for m in seen}
    assert got["top/" + LONG] == (b"0", "", 5)
    assert got["top/d/f"] == (b"0", "", 3000)
    assert got["top/d/link"] == (b"2", "f", 0)
    assert got["top/d/longlink"] == (b"2", "../" + "t" * 120, 0)
    assert got["top/d"][0] == b"5"  # a directory's trailing slash is dropped


def test_the_vetted_bytes_extract_to_the_same_tree_and_stop_at_the_end(tmp_path: Path) -> None:
    data = _archive(_tree(tmp_path / "t")) + b"trailing garbage after the end"
    _, passed = _read(data)
    assert b"trailing garbage" not in passed
    with tarfile.open(fileobj=io.BytesIO(passed)) as tar:
        tar.extractall(tmp_path / "out", filter="tar")
    assert (tmp_path / "out" / "top" / LONG).read_text() == "long\n"
    assert os.readlink(tmp_path / "out" / "top" / "d" / "link") == "f"


def test_an_admit_that_refuses_stops_before_the_member_is_released(tmp_path: Path) -> None:
    data = _archive(_tree(tmp_path / "t"))

    def admit(m: Member) -> None:
        if m.kind == b"2":
            raise BadArchive(f"refused {m.name}")

    reader = Reader(io.BytesIO(data), "a.tar", admit)
    reader.first()
    with pytest.raises(BadArchive, match="refused top/d/"):
        list(reader.vetted())


@pytest.mark.parametrize(("damage", "message"), [
    (lambda h: h[:148] + b"0000000\0" + h[156:], "checksum mismatch"),
    (lambda h: h[:124] + b"zzzzzzzzzzz\0" + h[136:], "not a number"),
])
def test_a_damaged_header_is_refused(damage: Callable[[bytes], bytes], message: str) -> None:
    info = tarfile.TarInfo("top/f")
    info.size = 1
    member = bytearray(_gnu(info, b"x"))
    member[:BLOCK] = damage(bytes(member[:BLOCK]))
    with pytest.raises(BadArchive, match=message):
        _read(_first() + bytes(member) + bytes(2 * BLOCK))


def test_a_pax_header_is_refused() -> None:
    info = tarfile.TarInfo("top/f")
    pax = info.tobuf(tarfile.PAX_FORMAT)
    with pytest.raises(BadArchive, match="not the GNU tar format"):
        _read(_first() + pax + bytes(2 * BLOCK))


def test_a_long_name_with_no_member_after_it_is_refused() -> None:
    info = tarfile.TarInfo("top/" + "x" * 200)
    header = _gnu(info)
    long_part = header[:-BLOCK]  # the 'L' header and its data, without the member's header
    with pytest.raises(BadArchive, match="no member after it"):
        _read(_first() + long_part + bytes(2 * BLOCK))


def test_a_long_name_over_path_max_is_refused() -> None:
    info = tarfile.TarInfo("top/" + "x" * 5000)
    with pytest.raises(BadArchive, match="malformed GNU long name"):
        _read(_first() + _gnu(info) + bytes(2 * BLOCK))


def test_a_link_carrying_data_is_refused() -> None:
    info = tarfile.TarInfo("top/l")
    info.type = tarfile.SYMTYPE
    info.linkname = "f"
    raw = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    raw[124:136] = b"%011o\0" % 10
    raw[148:156] = b"        "
    raw[148:156] = b"%06o\0 " % sum(raw)
    with pytest.raises(BadArchive, match="carrying data"):
        _read(_first() + bytes(raw) + bytes(BLOCK) + bytes(2 * BLOCK))


def test_an_archive_that_ends_inside_a_member_is_truncated(tmp_path: Path) -> None:
    data = _archive(_tree(tmp_path / "t"))
    inside = data.index(b"x" * 3000) + 1500
    with pytest.raises(BadArchive, match="truncated"):
        _read(data[:inside])


@pytest.mark.parametrize("data", [b"", bytes(BLOCK * 4)])
def test_an_empty_archive_is_not_ours(data: bytes) -> None:
    with pytest.raises(BadArchive, match="empty"):
        _read(data)
