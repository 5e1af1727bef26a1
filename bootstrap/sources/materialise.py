"""Content-addressed, read-only skill trees: ``<user cache>/git/trees/<sha256>/<name>/``.

A tree is written by git into a private side directory, hashed (:mod:`treehash`, which also
refuses what ``publish`` refuses), checked against the lock's sha256, made read-only, and only
then renamed into place: a directory under ``trees/<sha256>/`` is always complete, and a kill
at any instant leaves at most a side directory, removed once its writer is gone. The skill's
name is the last part of the path (not the hash) because a skill's directory name is its name
everywhere after (SKILL.md's ``name``, the editable's ``-e ./NAME``, ``publish``).

A tree in place is checked again before it is used (:func:`checked`), against its record
(:mod:`treerecord`, written when it was placed): a stat of each entry when every stamp still
holds; otherwise its modes are made read-only again and it is hashed. A tree that no longer
hashes to its name, or holds an entry this user does not own, is named with its changed files
in a warning, removed and made again from the cache's git objects, never used. A tree is used
for a lock entry only if its record holds that entry's commit and path: a commit the cache
never checked out is fetched (or fails) like any other, never believed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from bootstrap.errors import BootstrapError
from bootstrap.places import make_dir
from bootstrap.primitives import log
from bootstrap.primitives.fs import owned_token, owner_pid, pid_alive, remove_quietly
from bootstrap.sources import treerecord
from bootstrap.sources.paths import root, tree_path, trees_root
from bootstrap.sources.treehash import (
    BYTECODE,
    Listing,
    git_hash,
    git_mode,
    matching,
    read,
    without_bytecode,
)
from bootstrap.sources.treerecord import Origin, TreeRecord

if TYPE_CHECKING:  # fetch (and git) only when a tree is made: not for one that is in place
    from bootstrap.sources.fetch import Item

_SIDE: Final = ".tmp"


class TreeMismatch(BootstrapError):
    """A tree's sha256 is not the one the lock pins."""


@dataclass(frozen=True)
class Wanted:
    """A skill tree to make: ``path`` of the commit as the skill ``name``, its entries (as
    :func:`fetch.under` gives them) and the sha256 the lock pins (None: not locked yet)."""

    name: str
    path: str
    files: tuple[Item, ...]
    sha256: str | None = None


def checked(sha256: str, name: str, origin: Origin) -> Path | None:
    """The tree in place for ``sha256`` if it is still what was checked (:func:`vouched`) and
    was checked out from ``origin`` (the lock entry's repository key, commit and path); None
    otherwise, and the caller materialises it from that commit, which checks the commit and
    records it. A changed tree is removed first."""
    path = tree_path(sha256, name)
    record = vouched(path, sha256, origin)
    return path if record is not None and origin in record.origins else None


def vouched(path: Path, sha256: str, origin: Origin | None = None) -> TreeRecord | None:
    """The record of the tree at ``path`` if the tree still hashes to ``sha256``: by its
    stamps alone when they all hold, else sealed again and hashed (:func:`_recheck`, which
    removes a changed one: None). ``origin``: where to look for the files' names when the tree
    has no record."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        log.warning(f"{path} is not a directory; removed", path=str(path))
        discard(path)
        return None
    record = treerecord.read(path)
    if record is not None and record.sha256 == sha256 and not record.racy \
            and treerecord.holds(record, path):
        return record
    return _recheck(path, sha256, record, origin)


def _recheck(path: Path, sha256: str, record: TreeRecord | None,
             origin: Origin | None) -> TreeRecord | None:
    """A tree whose stamps moved (or that has no record): read-only modes applied again first,
    so that nobody else can change it while it is hashed, then hashed. Unchanged: recorded
    again. Changed, or holding an entry another user owns: a warning naming the files, and
    it is removed."""
    loose, foreign = _seal(path)
    try:
        got: Listing | BootstrapError | OSError = read(path)
    except (BootstrapError, OSError) as e:
        got = e
    kept = matching(got, sha256) if isinstance(got, Listing) else None
    if not foreign and kept is not None:
        if loose:
            log.warning(f"the git skill tree {path} was not read-only ({_some(loose)}); made "
                        "read-only again", path=str(path))
        origins = record.origins if record is not None and record.sha256 == sha256 else ()
        return treerecord.write(path, sha256, _entries(kept), origins)
    log.warning(f"the git skill tree {path} changed since it was checked "
                f"({_changes(got, sha256, record, foreign, origin)}); not used: it is made "
                "again from the git cache", path=str(path))
    discard(path)
    return None


def _changes(got: Listing | BootstrapError | OSError, sha256: str, record: TreeRecord | None,
             foreign: list[str], origin: Origin | None) -> str:
    """What differs, by file: from the record's listing, else from the commit's in the cache."""
    if foreign:
        return f"not owned by this user: {_some(foreign)}"
    if not isinstance(got, Listing):
        return str(got) if isinstance(got, BootstrapError) else f"cannot read: {got}"
    got = without_bytecode(got)
    named: tuple[tuple[str, ...], ...] | None = None
    if record is not None and record.sha256 == sha256:
        from bootstrap.sources.verify import diff

        named = diff(record.files, _files(got))
    elif origin is not None:
        from bootstrap.sources.verify import git_changes

        with contextlib.suppress(BootstrapError, OSError):  # no repository: no file names
            named = git_changes(root() / "repos" / origin[0], origin[1], origin[2], got)
    parts = [f"{label}: {_some(list(files))}" for label, files
             in zip(("changed", "missing", "extra"), named or (), strict=False) if files]
    return "; ".join(parts) or f"expected sha256 {sha256}, found {git_hash(got)}"


def _some(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _entries(listing: Listing) -> list[treerecord.Entry]:
    """A listing as its record keeps it: the root first, then each entry with its git mode."""
    return [("", "dir", 0o755, ""), *((rel, kind, git_mode(kind, mode), content.hex())
                                      for rel, kind, mode, _, content in listing.records)]


def _files(listing: Listing) -> dict[str, tuple[str, int, str]]:
    return {rel: (kind, mode, content) for rel, kind, mode, content in _entries(listing)
            if kind != "dir"}


def discard(path: Path) -> None:
    """Remove a tree that must not be used, renamed aside first (a side directory: reaped if
    we die half way), so that no reader ever sees half of one; its record with it."""
    aside = trees_root() / f"{_SIDE}-{owned_token()}"
    try:
        os.rename(path, aside)
    except OSError:
        aside = path
    remove_quietly(aside)
    with contextlib.suppress(OSError):
        os.unlink(treerecord.record_path(path))


def materialise(repo: Path, commit: str, path: str, name: str, expected: str | None,
                describe: str) -> tuple[Path, str]:
    """Check out ``path`` of ``commit`` as the skill ``name``; return its place and sha256.
    ``expected`` (the lock's) must match: :class:`TreeMismatch` naming ``describe``, the
    expected and the found hash otherwise, and nothing is kept."""
    from bootstrap.sources import fetch

    side = _side()
    try:
        work = side / name
        fetch.checkout(repo, commit, path, work)
        return _finish(work, (repo.name, commit, path), name, expected, describe)
    finally:
        remove_quietly(side)


def materialise_all(repo: Path, commit: str, wanted: Sequence[Wanted],
                    describe: str) -> list[tuple[Path, str] | BootstrapError | OSError]:
    """:func:`materialise` of each, written by git in one pass (:func:`fetch.checkout_all`);
    each one's place and sha256, or why it failed (it fails alone). A checkout that fails as
    a whole is done again skill by skill, so that the skill git refuses is named; so is a
    skill whose listing git could not give us exactly (no entries, or a name that is not
    UTF-8: the listing is text). Each skill has its own directory in the checkout, so paths
    that nest never meet: ``<name>``, or ``.<index>/<name>`` for a name that repeats (no
    skill's name starts with a dot)."""
    from bootstrap.sources import fetch

    side = _side()
    try:
        together = _together(wanted)
        names = Counter(w.name for w in wanted)
        at = {i: side / "all" / (w.name if names[w.name] == 1 else f".{i}/{w.name}")
              for i, w in enumerate(wanted)}
        try:
            if together:
                fetch.checkout_all(repo, [(str(at[i].relative_to(side / "all")),
                                           wanted[i].files) for i in together], side / "all")
        except (BootstrapError, OSError):
            together = set()
        out: list[tuple[Path, str] | BootstrapError | OSError] = []
        for i, w in enumerate(wanted):
            try:
                out.append(_finish(at[i], (repo.name, commit, w.path),
                                   w.name, w.sha256, describe) if i in together else
                           materialise(repo, commit, w.path, w.name, w.sha256, describe))
            except (BootstrapError, OSError) as e:
                out.append(e)
        return out
    finally:
        remove_quietly(side)


def _together(wanted: Sequence[Wanted]) -> set[int]:
    """Which of ``wanted`` one checkout can write exactly as :func:`fetch.checkout` would."""
    return {i for i, w in enumerate(wanted)
            if w.files and not any("\ufffd" in f.path for f in w.files)}


def _side() -> Path:
    """A new private side directory under ``trees/`` (after reaping dead writers' ones)."""
    trees = make_dir(trees_root())
    _reap(trees)
    side = trees / f"{_SIDE}-{owned_token()}"
    side.mkdir(mode=0o700)
    return side


def _finish(work: Path, origin: Origin, name: str, expected: str | None,
            describe: str) -> tuple[Path, str]:
    """A tree git wrote at ``work`` from ``origin`` (the repository's key, the commit, the
    path): hashed, checked against ``expected``, made read-only, placed and recorded; its
    place and sha256."""
    listing = read(work)
    sha = git_hash(listing)
    if expected is not None and sha != expected:
        raise TreeMismatch(f"{describe}: the skill tree {name!r} at commit {origin[1]} does "
                           f"not match the lock: expected sha256 {expected}, found {sha}; "
                           "nothing from it is installed")
    _seal(work, with_root=False)
    return _place(work, sha, name, _entries(listing), origin), sha


def _place(work: Path, sha: str, name: str, entries: list[treerecord.Entry],
           origin: Origin) -> Path:
    """Rename the finished tree into place and record it. Another process may have placed
    the same content first: theirs is as good, if it is still what was checked."""
    parent = trees_root() / sha
    with contextlib.suppress(FileExistsError):
        parent.mkdir(mode=0o755)
    final = parent / name
    for _ in range(3):
        try:
            os.rename(work, final)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
            held = vouched(final, sha)
            if held is None:
                continue  # it was changed, and is gone: ours takes its place
            if origin not in held.origins:
                treerecord.write(final, sha, list(held.entries), held.origins | {origin})
            return final
        # Only now: moving a directory to another parent needs write access to it (its "..").
        os.chmod(final, 0o555)
        treerecord.write(final, sha, entries, {origin})
        return final
    raise BootstrapError(f"{final}: another process keeps placing a different tree here; "
                         "stop it and run `kernel-bootstrap ensure` again")


def _seal(root: Path, *, with_root: bool = True) -> tuple[list[str], list[str]]:
    """Make ``root`` read-only as every tree is (directories 0555, files 0444, 0555 if
    executable), top down, so that each directory is closed before what it holds is looked
    at; (the entries whose modes were otherwise, the entries this user does not own: those
    are left as they are, and such a tree is never used). ``with_root``: the root too (not
    before it is placed: see _place). ``__pycache__`` directories are left alone: Python (as
    root) writes its bytecode there, and the hash does not count it (treehash.matching)."""
    loose: list[str] = []
    foreign: list[str] = []
    euid = os.geteuid()
    top = str(root)

    def one(full: str, rel: str) -> None:
        st = os.lstat(full)
        if st.st_uid != euid:
            foreign.append(rel)
            return
        if stat.S_ISLNK(st.st_mode):
            return
        want = 0o555 if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o100 else 0o444
        if stat.S_IMODE(st.st_mode) != want:  # never a chmod that changes nothing: its ctime
            os.chmod(full, want)
            loose.append(rel)

    if with_root:
        one(top, ".")
    for directory, dirs, files in os.walk(top):
        if BYTECODE in dirs:
            dirs.remove(BYTECODE)  # not entered either
        for name in (*dirs, *files):
            full = os.path.join(directory, name)
            one(full, os.path.relpath(full, top))
    return loose, foreign


def _reap(trees: Path) -> None:
    """Side directories of writers that are gone (killed half way)."""
    with contextlib.suppress(OSError), os.scandir(trees) as it:
        for entry in it:
            if entry.name.startswith(_SIDE + "-") and not pid_alive(
                    owner_pid(entry.name, _SIDE)):
                remove_quietly(Path(entry.path))
