"""The sha256 a skills lock pins: over a skill tree's sorted relative paths, modes and bytes.

One function for every use (materialise, ``verify``, ``lock``): publish's record stream
(:func:`bootstrap.trees.skilltree.hash_fields`) with modes as git keeps them (executable or
not: a materialised tree is read-only, its source was not, and both must hash alike). The tree
is read by :func:`read` (``verify`` reads with it too, hashing each file once for both the
tree's hash and its per-file listing): a plain tree (directories and regular files
with ASCII names) without pathlib, anything else by publish's own walk, so a tree ``publish``
would refuse (a symlink pointing outside the skill, a device, a name that is not UTF-8) is
refused here with the same words.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bootstrap.trees.skillmd import check_layout
from bootstrap.trees.skilltree import file_digest, hash_fields, load_skill_tree


def tree_sha256(root: Path) -> str:
    """64 hex digits; SkillError (naming the path) for a tree publish would refuse.

    Read by :func:`read`, the one tree reader (a plain tree without pathlib, anything else by
    publish's walk), into the records of publish's hash with :func:`git_mode`'s modes."""
    return git_hash(read(root))


def git_mode(kind: str, mode: int) -> int:
    """The mode the hash counts: what git keeps (a file executable or not; 0 for a link)."""
    if kind == "file":
        return 0o755 if mode & 0o100 else 0o644
    return 0o755 if kind == "dir" else 0


Record = tuple[str, str, int, int, bytes]  # rel, kind, mode, size, content (see hash_fields)
_READ: Final = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_CHUNK: Final = 1 << 20


@dataclass(frozen=True)
class Listing:
    """A tree as read: its records in entry order (a file's content: the sha256 of its bytes;
    a link's: its target), the form both tree hashes are computed from."""

    root: str
    records: list[Record]

    @property
    def files(self) -> dict[str, tuple[str, int, bytes]]:
        """rel -> (kind, mode, content) of each file and link: what a diff compares."""
        return {r[0]: (r[1], r[2], r[4]) for r in self.records if r[1] != "dir"}


def read(root: Path) -> Listing:
    """Walk and hash ``root``: a plain tree (directories and regular files with ASCII names)
    by :func:`_plain`, anything else by publish's walk, which refuses what publish refuses
    (SkillError naming the path)."""
    text = os.path.abspath(root)
    try:
        check_layout(Path(text))
        plain = _plain(text)
    except OSError:
        plain = None
    if plain is not None:
        return Listing(text, plain)
    tree = load_skill_tree(root, spec=False)
    records: list[Record] = [(e.rel, e.kind, e.mode, e.size,
                               file_digest(e.path) if e.kind == "file"
                               else (e.target or "").encode("utf-8"))
                              for e in tree.entries]
    return Listing(str(tree.root), records)


def _plain(root: str) -> list[Record] | None:
    """The records of a tree of directories and regular files with ASCII names (no case
    collision): what load_skill_tree would list, at a fraction of its cost (no Path objects,
    no stat of a file: its mode and size come from the open descriptor); None for anything
    else, which publish's walk then reads and judges."""
    found: list[tuple[str, int]] = []  # rel, the mode of a directory (-1: a file)
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(f"{root}/{rel_dir}" if rel_dir else root) as it:
            here = [(d.name, _dir_mode(d)) for d in it]
        if any(m is None or not n.isascii() for n, m in here) or \
                len({n.lower() for n, _ in here}) != len(here):
            return None
        for name, mode in here:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            found.append((rel, -1 if mode is None else mode))
            if mode is not None and mode >= 0:
                pending.append(rel)
    found.sort()  # ASCII: str order is UTF-8 byte order, as the walk sorts
    return [(rel, "dir", mode, 0, b"") if mode >= 0 else _file(root, rel)
            for rel, mode in found]


def _dir_mode(entry: os.DirEntry[str]) -> int | None:
    """A directory's permission bits, -1 for a regular file (from the listing's type: no
    stat), None for anything else."""
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
    return -1 if entry.is_file(follow_symlinks=False) else None


def _file(root: str, rel: str) -> Record:
    """A file's record: mode and size from its descriptor, the sha256 of its bytes. Never
    through a link (one swapped in since the walk: OSError, and publish's walk reads it)."""
    fd = os.open(f"{root}/{rel}", _READ)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{root}/{rel}: not a regular file any more")
        want = min(st.st_size + 1, _CHUNK)
        data = os.read(fd, want)
        if len(data) < want:  # a short read is the end of a regular file: the usual case
            digest = hashlib.sha256(data).digest()
        else:
            h = hashlib.sha256(data)
            while chunk := os.read(fd, _CHUNK):
                h.update(chunk)
            digest = h.digest()
        return rel, "file", stat.S_IMODE(st.st_mode), st.st_size, digest
    finally:
        os.close(fd)


def publish_hash(listing: Listing) -> str:
    """The tree hash ``publish`` records (``sha256:...``)."""
    return hash_fields(listing.records)


def git_hash(listing: Listing) -> str:
    """The skills lock's sha256 (64 hex): :func:`tree_sha256`."""
    return hash_fields((rel, kind, git_mode(kind, mode), size, content)
                       for rel, kind, mode, size, content in listing.records
                       ).removeprefix("sha256:")
