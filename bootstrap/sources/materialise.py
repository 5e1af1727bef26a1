"""Content-addressed, read-only skill trees: ``<user cache>/git/trees/<sha256>/<name>/``.

A tree is written by git into a private side directory, hashed (:mod:`treehash`, which also
refuses what ``publish`` refuses), checked against the lock's sha256, made read-only, and only
then renamed into place: a directory under ``trees/<sha256>/`` is always complete, and a kill
at any instant leaves at most a side directory, removed once its writer is gone. The skill's
name is the last part of the path (not the hash) because a skill's directory name is its name
everywhere after (SKILL.md's ``name``, the editable's ``-e ./NAME``, ``publish``).

The hash of a tree already in place is checked again before it is used (:func:`checked`): a
tree whose content does not match its name is removed and made again, never used.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Final

from bootstrap.errors import BootstrapError, SkillError
from bootstrap.places import make_dir
from bootstrap.primitives.fs import owned_token, owner_pid, pid_alive, remove_quietly
from bootstrap.sources import fetch
from bootstrap.sources.treehash import tree_sha256

_SIDE: Final = ".tmp"


class TreeMismatch(BootstrapError):
    """A tree's sha256 is not the one the lock pins."""


def trees_root() -> Path:
    return fetch.root() / "trees"


def tree_path(sha256: str, name: str) -> Path:
    return trees_root() / sha256 / name


def checked(sha256: str, name: str) -> Path | None:
    """The tree in place for ``sha256`` if its content still hashes to it; a tree that does
    not (edited, half removed) is removed and None returned, so it is made again."""
    path = tree_path(sha256, name)
    if not os.path.isdir(path):
        return None
    try:
        found = tree_sha256(path)
    except SkillError:
        found = None
    if found == sha256:
        return path
    remove_quietly(path)
    return None


def materialise(repo: Path, commit: str, path: str, name: str, expected: str | None,
                describe: str) -> tuple[Path, str]:
    """Check out ``path`` of ``commit`` as the skill ``name``; return its place and sha256.
    ``expected`` (the lock's) must match: :class:`TreeMismatch` naming ``describe``, the
    expected and the found hash otherwise, and nothing is kept."""
    trees = make_dir(trees_root())
    _reap(trees)
    side = trees / f"{_SIDE}-{owned_token()}"
    side.mkdir(mode=0o700)
    try:
        work = side / name
        fetch.checkout(repo, commit, path, work)
        sha = tree_sha256(work)
        if expected is not None and sha != expected:
            raise TreeMismatch(f"{describe}: the skill tree {name!r} at commit {commit} does not "
                               f"match the lock: expected sha256 {expected}, found {sha}; "
                               "nothing from it is installed")
        _read_only(work)
        return _place(work, sha, name), sha
    finally:
        remove_quietly(side)


def _place(work: Path, sha: str, name: str) -> Path:
    """Rename the finished tree into place (another process may have placed it first)."""
    parent = trees_root() / sha
    with contextlib.suppress(FileExistsError):
        parent.mkdir(mode=0o755)
    final = parent / name
    try:
        os.rename(work, final)
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        return final  # the same content, placed by another process: theirs is as good
    # Only now: moving a directory to another parent needs write access to it (its "..").
    os.chmod(final, 0o555)
    return final


def _read_only(root: Path) -> None:
    """Nobody may change a tree others trust by its name: files 0444 (0555 executable),
    directories 0555, children first; the root itself after it is placed (see _place)."""
    for directory, dirs, files in os.walk(root, topdown=False):
        for name in files:
            full = os.path.join(directory, name)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                os.chmod(full, 0o555 if st.st_mode & 0o100 else 0o444)
        for name in dirs:
            full = os.path.join(directory, name)
            if not os.path.islink(full):
                os.chmod(full, 0o555)


def _reap(trees: Path) -> None:
    """Side directories of writers that are gone (killed half way)."""
    with contextlib.suppress(OSError), os.scandir(trees) as it:
        for entry in it:
            if entry.name.startswith(_SIDE + "-") and not pid_alive(
                    owner_pid(entry.name, _SIDE)):
                remove_quietly(Path(entry.path))
