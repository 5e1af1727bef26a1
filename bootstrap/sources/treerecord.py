"""Each materialised tree's record: what was checked, and the stat of every entry just after.

``trees/<sha256>/.<name>.json`` beside the tree ``trees/<sha256>/<name>`` (outside it: the
tree is read-only and hashed). Written when a tree is materialised and whenever a check of it
hashes it again; it holds

- ``sha256``: the tree hash it was found to have (only ever the one in its name);
- ``origins``: each (cache repository, commit, path) whose checkout was hashed to it: the
  lock's ``commit`` is taken from the cache only when its triple is here, so a forged commit
  is fetched and checked like any other, never believed;
- each entry (the root ``""`` first) with its kind, git mode and content (in hex: a file's
  sha256, a link's target), to name the changed files when the tree no longer matches; never
  what lies in a ``__pycache__`` the commit lacks (bytecode: treehash.without_bytecode);
- each entry's stamp as the warm path takes it (:func:`bootstrap.warm.stamp`: inode, size,
  mtime, ctime; ctime moves with any write, chmod, chown or rename and no user can set it);
- ``racy``: whether a stamp was within a clock tick of the time it was taken (git's "racily
  clean"): a same-size edit in that tick would have left it as it was.

A tree whose every entry still has its recorded stamp is the tree that was hashed: a stat of
each entry replaces reading and hashing each file. A racy record (every new tree's: its modes
were set just before) is not enough for ``ensure``, which hashes the tree once more and
records settled stamps; it is for the read-only commands (bootstrap.sources.cached).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bootstrap.warm import stamp

FORMAT: Final = 1
_LIMIT: Final = 64 * 1024 * 1024  # ~150 bytes an entry: far more entries than any skill has

# The records read or written by this process, by tree, with the stamp of their file then.
_KNOWN: dict[str, tuple[str, TreeRecord]] = {}
_HELD: dict[str, tuple[TreeRecord, float]] = {}  # vouched by the config's load (holds)
_VOUCHED = 5.0  # seconds a vouch stands: a config's load and its prepare, not a later call
Origin = tuple[str, str, str]  # the cache repository's key, the commit, the path inside it
Entry = tuple[str, str, int, str]  # rel ("" the root), kind, git mode, content (hex or target)


@dataclass(frozen=True)
class TreeRecord:
    sha256: str
    origins: frozenset[Origin]
    entries: tuple[Entry, ...]
    stamps: tuple[str, ...]  # one per entry, in the same order
    racy: bool = False

    @property
    def files(self) -> dict[str, tuple[str, int, str]]:
        """rel -> (kind, git mode, content) of each file and link: what a diff compares."""
        return {rel: (kind, mode, content) for rel, kind, mode, content in self.entries
                if kind != "dir"}


def record_path(tree: Path) -> Path:
    return tree.parent / f".{tree.name}.json"


def entry_paths(tree: Path | str, entries: Iterable[Entry]) -> list[str]:
    """The absolute path of each entry (strings: a stat of each costs less than pathlib)."""
    root = str(tree)
    return [f"{root}/{rel}" if rel else root for rel, *_ in entries]


def read(tree: Path) -> TreeRecord | None:
    """The record of ``tree``; None when there is none or it is not one we wrote. Parsed once
    per process while its file is unchanged (the config's load and ``prepare`` both ask)."""
    from bootstrap.primitives.fs import read_state_file

    path = record_path(tree)
    seen = _KNOWN.get(str(tree))
    now = stamp(str(path))
    if seen is not None and seen[0] == now != "-":
        return seen[1]
    try:
        data = json.loads(read_state_file(path, _LIMIT))
        if data["format"] != FORMAT or not isinstance(data["sha256"], str):
            return None
        origins = frozenset((str(k), str(c), str(p)) for k, c, p in data["origins"])
        entries = tuple((str(r), str(k), int(m), str(c)) for r, k, m, c, _ in data["entries"])
        stamps = tuple(str(e[4]) for e in data["entries"])
        racy = data["racy"] is not False
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None
    record = TreeRecord(data["sha256"], origins, entries, stamps, racy)
    _KNOWN[str(tree)] = (now, record)
    return record


def holds(record: TreeRecord, tree: Path, *, vouch: bool = False) -> bool:
    """Whether every entry of ``tree`` still has its recorded stamp. ``vouch``: the caller is
    the config's load, and the ``prepare`` that follows it in the same operation may take its
    answer once instead of a second stat of every entry of every tree, which was most of what a
    new venv with git skills paid over local ones. Only once, and within :data:`_VOUCHED`
    seconds: a long-lived process that calls ``ensure`` again looks again."""
    vouched = _HELD.pop(str(tree), None)
    if vouched is not None and vouched[0] is record and time.monotonic() - vouched[1] < _VOUCHED:
        return True
    held = bool(record.entries) and all(
        stamp(path) == recorded
        for path, recorded in zip(entry_paths(tree, record.entries), record.stamps,
                                  strict=True))
    if held and vouch:
        _HELD[str(tree)] = (record, time.monotonic())
    return held


def write(tree: Path, sha256: str, entries: list[Entry], origins: Iterable[Origin]
          ) -> TreeRecord:
    """Record ``tree`` (just checked to hash to ``sha256``, its ``entries`` as read then):
    stamps now. A failed write only costs a hash at the next check."""
    import time

    from bootstrap.fingerprint import is_racy
    from bootstrap.primitives.atomic import write_atomic

    stamps = tuple(stamp(p) for p in entry_paths(tree, entries))
    now = time.time_ns()  # after the stats
    record = TreeRecord(sha256, frozenset(origins), tuple(entries), stamps,
                        any(is_racy(s, now) for s in stamps))
    data = {"format": FORMAT, "sha256": sha256, "origins": sorted(record.origins),
            "racy": record.racy,
            "entries": [[*e, s] for e, s in zip(entries, stamps, strict=True)]}
    # Not durable: a record lost to a power cut means one more hash, nothing worse.
    with contextlib.suppress(OSError):
        write_atomic(record_path(tree), json.dumps(data, separators=(",", ":")).encode(),
                     durable=False)
    _KNOWN[str(tree)] = (stamp(str(record_path(tree))), record)
    return record


def watched(tree: Path) -> list[str]:
    """Every entry of ``tree`` as its record lists them (the warm fingerprint stamps them
    all: an edit of any file sends the next start the long way); [] without a record."""
    seen = _KNOWN.get(str(tree))
    record = seen[1] if seen is not None else read(tree)
    return [] if record is None else entry_paths(tree, record.entries)
