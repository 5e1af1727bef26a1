"""The snapshot archive reader under fuzzing: whatever the archive holds, a restore either
refuses it with BadArchive or extracts a tree from which nothing reaches outside the venv."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bootstrap.primitives.tar import BadArchive
from bootstrap.snapshots.archive import MANIFEST, extract, open_snapshot

# Small alphabets, so generated links often name each other and chain; a few names and
# targets are seeded with the shapes that matter (the interpreter links, climbing chains).
PARTS = ["venv", "lib", "bin", "d", "e", "x", "python", "..", ".", ""]
STEPS = [".", "..", "d", "e", "x", "lib", "bin", "python"]
KINDS = [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE]
OUTSIDE = "@outside@"  # replaced by the victim directory's absolute path

paths = st.lists(st.sampled_from(PARTS), min_size=1, max_size=5).map("/".join)
steps = st.lists(st.sampled_from(STEPS), min_size=1, max_size=6).map("/".join)
known = st.sampled_from(["venv/lib", "venv/lib/d", "venv/lib/e", "venv/d", "venv/x",
                         "venv/e/x", "venv/bin/python", "venv/bin/python3", "venv/lib64"])
clean = st.lists(st.sampled_from(STEPS[2:]), min_size=1, max_size=3).map("/".join)
venv_clean = clean.map(lambda p: "venv/" + p)
names = st.one_of(known, known, known, venv_clean, venv_clean, paths.map(lambda p: "venv/" + p),
                  paths)
targets = st.one_of(
    steps, paths,
    st.sampled_from(["/", OUTSIDE, OUTSIDE + "/victim.txt", "../bin/python", "d/d/d/../../../x",
                     "venv/lib/d", "venv/d/x"]))
members = st.lists(st.tuples(st.sampled_from(KINDS), names, targets), max_size=8)
# Header damage: (which member's header, byte offset in it, new byte, fix the checksum?)
damage = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 511), st.integers(0, 255),
                            st.booleans()), max_size=3)


def build(entries: list[tuple[bytes, str, str]], outside: Path) -> tuple[bytes, list[int]]:
    """A GNU-format archive like Store.write's: the manifest, then ``entries``; with the offset
    of every header."""
    buf = io.BytesIO()
    offsets = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        manifest = json.dumps({"key": "k"}).encode()
        for kind, name, link in [(tarfile.REGTYPE, MANIFEST, ""), *entries]:
            info = tarfile.TarInfo(name)
            info.type, info.mode = kind, 0o755
            info.linkname = link.replace(OUTSIDE, str(outside))
            data = manifest if name == MANIFEST else b"data"
            if kind == tarfile.REGTYPE:
                info.size = len(data)
            offsets.append(buf.tell())
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buf.getvalue(), offsets


def spoil(data: bytes, offsets: list[int], changes: list[tuple[int, int, int, bool]]) -> bytes:
    out = bytearray(data)
    for which, at, value, fix in changes:
        start = offsets[which % len(offsets)]
        out[start + at] = value
        if fix:  # a valid checksum gets the damage past the first check
            block = out[start:start + 512]
            block[148:156] = b" " * 8
            out[start + 148:start + 156] = b"%06o\0 " % sum(block)
    return bytes(out)


def interpreter_link(rel: str) -> bool:
    parts = rel.split(os.sep)
    return len(parts) == 3 and parts[1] == "bin" and parts[2].startswith("python")


def assert_nothing_reaches_outside(into: Path) -> None:
    venv = os.path.realpath(into / "venv")
    for top, dirs, files in os.walk(into):  # never follows links
        for entry in dirs + files:
            path = Path(top) / entry
            rel = os.path.relpath(path, into)
            if path.is_symlink() and not interpreter_link(rel):
                real = os.path.realpath(path)
                assert real == venv or real.startswith(venv + os.sep), (rel, os.readlink(path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=members, changes=damage)
@example(entries=[(tarfile.SYMTYPE, "venv/lib/d", "."),
                  (tarfile.SYMTYPE, "venv/lib/e", "d/d/d/../../../x")], changes=[])
@example(entries=[(tarfile.SYMTYPE, "venv/bin/python", OUTSIDE),
                  (tarfile.SYMTYPE, "venv/lib", "../bin/python")], changes=[])
def test_a_restore_refuses_or_keeps_everything_inside_the_venv(
        entries: list[tuple[bytes, str, str]], changes: list[tuple[int, int, int, bool]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        outside = work / "outside"
        outside.mkdir()
        (outside / "victim.txt").write_text("mine")
        data, offsets = build(entries, outside)
        archive = work / "snapshot.tar"
        archive.write_bytes(spoil(data, offsets, changes))
        into = work / "into"
        into.mkdir()
        try:
            with archive.open("rb") as f:
                _, reader = open_snapshot(f, archive)
                extract(reader, into)
        except BadArchive:
            pass  # refused: the only error a restore may raise
        else:
            assert_nothing_reaches_outside(into)
        assert sorted(p.name for p in work.iterdir()) == ["into", "outside", "snapshot.tar"]
        assert [p.name for p in outside.iterdir()] == ["victim.txt"]
        assert (outside / "victim.txt").read_text() == "mine"
