"""``verify``'s tree checks: each tree read once, hashed in-process, diffed file by file.

A tree is read into records (path, kind, mode, size, and the sha256 of a file's bytes), from
which both tree hashes come through the one definition of the record stream
(:func:`bootstrap.trees.skilltree.hash_fields`): the skills lock's (modes as git keeps them,
:func:`bootstrap.sources.treehash.git_mode`) and publish's. A plain tree (directories and
regular files with ASCII names, as skills are) is walked with one ``os.scandir`` of each
directory, each file opened relative to its directory's descriptor (:func:`treehash.read`),
five times cheaper than publish's walk; anything else (a link, a special file, a non-ASCII
name) goes through publish's walk, which refuses what publish refuses with its words. One
thread: threads only fight over the GIL here (measured twice as slow). 100 trees of 25 files
(7 MB): 35-41 ms on the 2-core benchmark VM (scripts/bench_sources.py), of which opening,
reading and hashing the 2,500 files alone take ~21 ms.

What a tree's records are compared with when its hash does not match, to name the files:

- a git tree: the commit's own listing in the cached repository (``git ls-tree``, blob ids
  compared with the files' git blob ids). Git runs only then: a tree that matches costs no
  child process.
- a published tree: the configured skill of that name, when its hash is the one publish
  recorded (it is what was published). Otherwise the tree is named as changed, without files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bootstrap.errors import BootstrapError, SkillError
from bootstrap.sources.lockfile import LockedSkill
from bootstrap.sources.treehash import (
    Listing,
    git_hash,
    matching,
    publish_hash,
    read,
    without_bytecode,
)


@dataclass(frozen=True)
class Problem:
    """One tree (or editable) that is not what it should be; files named when known."""

    kind: str  # "git", "published" or "editable"
    name: str
    path: str
    detail: str
    changed: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()


def read_all(roots: Sequence[Path]) -> list[Listing | BootstrapError | OSError]:
    """:func:`read` of each; an error in place of a tree that cannot be read."""
    out: list[Listing | BootstrapError | OSError] = []
    for root in roots:
        try:
            out.append(read(root))
        except (BootstrapError, OSError) as e:
            out.append(e)
    return out


def diff(expected: Mapping[str, object], found: Mapping[str, object]
         ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(changed, missing, extra) file names between two per-file listings."""
    changed = tuple(sorted(r for r in expected.keys() & found.keys()
                           if expected[r] != found[r]))
    missing = tuple(sorted(expected.keys() - found.keys()))
    extra = tuple(sorted(found.keys() - expected.keys()))
    return changed, missing, extra


def git_listing(listing: Listing) -> dict[str, tuple[str, str]]:
    """The tree's files as ``git ls-tree`` lists them: rel -> (mode, blob id)."""
    out: dict[str, tuple[str, str]] = {}
    for rel, kind, mode, _, content in listing.records:
        if kind == "file":
            with open(f"{listing.root}/{rel}", "rb") as f:  # only on a mismatch: read again
                data = f.read()
            git = "100755" if mode & 0o100 else "100644"
        elif kind == "symlink":
            data, git = content, "120000"
        else:
            continue
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False)
        out[rel] = (git, blob.hexdigest())
    return out


def parse_ls_tree(text: str, prefix: str) -> dict[str, tuple[str, str]]:
    """``git ls-tree -r -z --full-tree`` output under ``prefix`` as rel -> (mode, blob id)."""
    out: dict[str, tuple[str, str]] = {}
    cut = len(prefix) + 1 if prefix else 0
    for record in filter(None, text.split("\0")):
        meta, _, path = record.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[1] == "blob":
            out[path[cut:]] = (parts[0], parts[2])
    return out


def check_git(entries: Sequence[LockedSkill], repo_of: Callable[[LockedSkill], Path | None]
              ) -> tuple[int, list[Problem]]:
    """Every locked skill's materialised tree against the lock's sha256; ``repo_of``: the
    cached repository of an entry's source (None: none), to name the files of a mismatch."""
    from bootstrap.sources.paths import trees_root

    root = str(trees_root())  # not tree_path() each time: pathlib is most of a stat's cost
    trees = [(e, Path(f"{root}/{e.sha256}/{e.name}")) for e in entries]
    present = [(e, p) for e, p in trees if os.path.isdir(p)]
    problems = [Problem("git", e.name, str(p), f"missing: the tree of {e.git} at commit "
                        f"{e.commit} is not in the cache (`kernel-bootstrap ensure` makes it)")
                for e, p in trees if not os.path.isdir(p)]
    for (entry, path), got in zip(present, read_all([p for _, p in present]), strict=True):
        if not isinstance(got, Listing):
            problems.append(Problem("git", entry.name, str(path), _say(got)))
            continue
        bare = without_bytecode(got)  # what Python writes as root: no part of the tree
        loose = _not_sealed(path, bare)
        if matching(got, entry.sha256) is None:
            problem = _git_diff(entry, path, bare, repo_of(entry))
            problems.append(dataclasses.replace(problem, detail=f"{problem.detail}; {loose}")
                            if loose else problem)
        elif loose:
            problems.append(Problem("git", entry.name, str(path), loose))
    return len(trees), problems


def unsealed(path: Path, got: Listing) -> tuple[list[str], int | None]:
    """The entries of the tree at ``path`` (``got``: as just read) that are not as read-only
    as every tree is made (directories 0555, files 0444, or 0555 if executable; "." the
    root), and the root's owner if it is not this user. One more stat, of the root."""
    loose = [rel for rel, kind, mode, _, _ in got.records if kind != "symlink"
             and mode != (0o555 if kind == "dir" or mode & 0o100 else 0o444)]
    st = os.lstat(path)
    if stat.S_IMODE(st.st_mode) != 0o555:
        loose.insert(0, ".")
    return loose, None if st.st_uid == os.geteuid() else st.st_uid


def _not_sealed(path: Path, got: Listing) -> str | None:
    """Why the tree at ``path`` is not sealed (:func:`unsealed`), or None."""
    loose, owner = unsealed(path, got)
    whose = "" if owner is None else f"owned by uid {owner}, not this user; "
    if not loose and not whose:
        return None
    some = ", ".join(loose[:5]) + (f" and {len(loose) - 5} more" if len(loose) > 5 else "")
    modes = f"not read-only: {some}; " if loose else ""
    return f"{whose}{modes}`kernel-bootstrap ensure` makes it read-only again or makes it anew"


def _git_diff(entry: LockedSkill, path: Path, got: Listing, repo: Path | None) -> Problem:
    found = git_hash(got)
    detail = (f"does not match the skills lock ({entry.git} at commit {entry.commit}): "
              f"expected sha256 {entry.sha256}, found {found}")
    if repo is None or not os.path.isdir(repo):
        return Problem("git", entry.name, str(path), detail + "; its repository is not in "
                       "the cache to name the files")
    try:
        changed, missing, extra = git_changes(repo, entry.commit, entry.path, got)
    except (BootstrapError, OSError) as e:
        return Problem("git", entry.name, str(path), f"{detail}; {_say(e)}")
    return Problem("git", entry.name, str(path), detail, changed, missing, extra)


def git_changes(repo: Path, commit: str, path: str, got: Listing
                ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(changed, missing, extra) files of ``got`` against ``path`` of ``commit`` in the cached
    repository ``repo`` (offline: BootstrapError when git cannot list it)."""
    from bootstrap.sources import git

    text = git.run(["ls-tree", "-r", "-z", "--full-tree", commit, "--", path or "."],
                   repo=repo, offline=True, what="cannot list a cached commit").stdout
    return diff(parse_ls_tree(text, path), git_listing(got))


def check_published(root: Path, local: Mapping[str, Path],
                    hashed: Callable[[list[Path]], list[Listing | BootstrapError | OSError]]
                    = read_all) -> tuple[int, list[Problem]]:
    """Every tree publish recorded in the skill root ``root`` against its recorded hash;
    ``local``: the configured skills (name -> directory), the reference for naming files."""
    from bootstrap.trees.prune import read_record
    from bootstrap.trees.publish import state_dir

    marks = read_record(state_dir(root))
    names = sorted(marks)
    present = [n for n in names if os.path.isdir(root / n) and not os.path.islink(root / n)]
    problems = [Problem("published", n, str(root / n), "missing: publish put it there")
                for n in names if n not in present]
    for name, got in zip(present, hashed([root / n for n in present]), strict=True):
        live = str(root / name)
        if not isinstance(got, Listing):
            problems.append(Problem("published", name, live, _say(got)))
        elif publish_hash(got) != marks[name].hash:
            problems.append(_published_diff(name, live, got, marks[name].hash, local.get(name)))
    return len(names), problems


def _published_diff(name: str, live: str, got: Listing, recorded: str,
                    source: Path | None) -> Problem:
    reference = None
    if source is not None:
        try:
            candidate = read(source)
        except (BootstrapError, OSError):
            candidate = None
        if candidate is not None and publish_hash(candidate) == recorded:
            reference = candidate
    if reference is None:
        return Problem("published", name, live, f"changed since it was published (recorded "
                       f"{recorded}, found {publish_hash(got)}); its source is not at hand "
                       "to name the files")
    changed, missing, extra = diff(reference.files, got.files)
    return Problem("published", name, live, "changed since it was published",
                   changed, missing, extra)


def _say(e: BaseException) -> str:
    if isinstance(e, SkillError | BootstrapError):
        return str(e)
    return f"cannot read: {getattr(e, 'strerror', None) or e}"
