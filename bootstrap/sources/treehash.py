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

# bootstrap.trees.skilltree (publish's walk and the record stream, with ctypes and unicodedata
# behind them) is imported by the functions that hash or walk: a start whose trees are vouched
# for by their records (materialise.vouched) hashes nothing and needs none of it.


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
_DIR: Final = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
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
    from bootstrap.trees.skilltree import file_digest, load_skill_tree

    tree = load_skill_tree(root, spec=False)
    records: list[Record] = [(e.rel, e.kind, e.mode, e.size,
                               file_digest(e.path) if e.kind == "file"
                               else (e.target or "").encode("utf-8"))
                              for e in tree.entries]
    return Listing(str(tree.root), records)


def _plain(root: str) -> list[Record] | None:
    """The records of a tree of directories and regular files with ASCII names (no case
    collision): what load_skill_tree would list, at a fraction of its cost; None for anything
    else, which publish's walk then reads and judges. One ``scandir`` of each directory, which
    gives each entry's type without a stat; files and directories are opened relative to
    their directory's descriptor (the kernel walks one name, not the whole path: ``verify``
    of 100 trees opens 2,500 files), and a file's mode and size come from its descriptor."""
    out: list[Record] = []
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pending = [""]
        while pending:
            rel_dir = pending.pop()
            fd = os.open(rel_dir, _DIR, dir_fd=top) if rel_dir else top
            try:
                if rel_dir:
                    out.append((rel_dir, "dir", stat.S_IMODE(os.fstat(fd).st_mode), 0, b""))
                if not _scan(fd, f"{rel_dir}/" if rel_dir else "", out, pending):
                    return None
            finally:
                if fd != top:
                    os.close(fd)
    finally:
        os.close(top)
    out.sort(key=_rel)  # ASCII: str order is UTF-8 byte order, as the walk sorts
    return out


def _scan(fd: int, prefix: str, out: list[Record], pending: list[str]) -> bool:
    """The directory open at ``fd`` (its entries named ``prefix`` + name): each file's record
    added to ``out``, each directory to ``pending``; False at anything not plain."""
    with os.scandir(fd) as it:
        here = [(e.name, e.is_file(follow_symlinks=False) or
                 (False if e.is_dir(follow_symlinks=False) else None)) for e in it]
    if any(kind is None or not name.isascii() for name, kind in here) or \
            len({name.lower() for name, _ in here}) != len(here):
        return False
    for name, is_file in here:
        if is_file:
            out.append(_file(fd, name, prefix + name))
        else:
            pending.append(prefix + name)
    return True


def _rel(record: Record) -> str:
    return record[0]


def _file(dir_fd: int, name: str, rel: str) -> Record:
    """A file's record: mode and size from its descriptor, the sha256 of its bytes. Never
    through a link (one swapped in since the walk: OSError, and publish's walk reads it)."""
    fd = os.open(name, _READ, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{rel}: not a regular file any more")
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
    from bootstrap.trees.skilltree import hash_fields

    return hash_fields(listing.records)


def git_hash(listing: Listing) -> str:
    """The skills lock's sha256 (64 hex): :func:`tree_sha256`."""
    from bootstrap.trees.skilltree import hash_fields

    return hash_fields((rel, kind, git_mode(kind, mode), size, content)
                       for rel, kind, mode, size, content in listing.records
                       ).removeprefix("sha256:")


BYTECODE: Final = "__pycache__"


def without_bytecode(listing: Listing) -> Listing:
    """``listing`` without what lies in a ``__pycache__`` directory (and those directories):
    the bytecode Python writes beside the sources it imports whenever it can, which as root is
    always, read-only tree or not. Derived, and no part of a skill's tree."""
    return Listing(listing.root, [r for r in listing.records if BYTECODE not in r[0].split("/")])


def matching(listing: Listing, sha256: str) -> Listing | None:
    """``listing`` if it hashes to ``sha256``, else the listing without bytecode if that does
    (a tree whose commit holds a ``__pycache__`` keeps it in its hash); None if neither."""
    if git_hash(listing) == sha256:
        return listing
    bare = without_bytecode(listing)
    if len(bare.records) < len(listing.records) and git_hash(bare) == sha256:
        return bare
    return None
