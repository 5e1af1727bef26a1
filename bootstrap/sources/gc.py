"""``gc`` of the git cache: repositories and trees no skills lock on this machine names and
unused for 30 days (the build cache's rule, bootstrap.skills.buildcache).

"Named" is read from every lock in :mod:`registry` (a lock file gone is forgotten; one that
cannot be read stops this prune: what it names is unknown, so nothing is removed). "Used" is
an mtime, as for the build cache: a tree's directory (set when it is placed), a repository's
directory or its lock file (taken on every use), whichever is newest. A tree that a venv's
generation uses is never removed (``gc`` finds them: :func:`prune`'s ``in_use``), even when no
lock names it any more (``lock --upgrade`` moved on, the venv not yet). A repository is removed
under its own lock (skipped if busy); a tree by renaming it aside first, so that no reader
ever sees half of one.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bootstrap.errors import BootstrapError
from bootstrap.primitives import log
from bootstrap.primitives.fs import owned_token, remove_quietly


def prune(max_age_days: float, now: float | None = None,
          in_use: Iterable[str] = ()) -> list[str]:
    """Remove what is neither named nor used for ``max_age_days`` (``gc`` gives the build
    cache's); what was done, for ``gc`` to report. ``in_use``: the directories the venvs'
    generations use (their editables, their markers' skills): a tree among them is kept
    whatever its age, named or not (after ``lock --upgrade`` only they name the old one)."""
    from bootstrap.sources.paths import root as cache_root

    root = cache_root()
    if not os.path.isdir(root):
        return []
    named = _named()
    if named is None:
        return []
    repos, trees = named
    trees |= _trees_in(in_use, root / "trees")
    cutoff = (time.time() if now is None else now) - max_age_days * 86400
    done = [f"removed cached git tree {p} (no skills lock names it, unused for "
            f"{max_age_days:g} days)" for p in _old(root / "trees", trees, cutoff, _tree_used)
            if _remove_tree(p)]
    done += [f"removed cached git repository {p} (no skills lock names it, unused for "
             f"{max_age_days:g} days)" for p in _old(root / "repos", repos, cutoff, _repo_used)
             if _remove_repo(p)]
    return done


def _named() -> tuple[set[str], set[str]] | None:
    """(repository keys, tree hashes) named by the locks known; None if one is unreadable."""
    from bootstrap.sources import lockfile, registry
    from bootstrap.sources.spec import GitSource

    repos: set[str] = set()
    trees: set[str] = set()
    for entry, lock in registry.known():
        if not os.path.lexists(lock):
            with contextlib.suppress(OSError):
                os.unlink(entry)  # that lock is gone: it names nothing any more
            continue
        try:
            entries = lockfile.read(lock)
        except BootstrapError as e:
            log.warning(f"gc leaves the git cache alone: {e}")
            return None
        for locked in entries:
            repos.add(GitSource(0, locked.git).cache_key)
            trees.add(locked.sha256)
    return repos, trees


def _trees_in(paths: Iterable[str], trees: Path) -> set[str]:
    """The hashes of the trees (``trees/<sha256>/<name>``) that ``paths`` are in."""
    top = os.path.realpath(trees)
    out = set()
    for path in paths:
        rel = os.path.relpath(os.path.realpath(path), top)
        if not rel.startswith(".."):
            out.add(rel.split(os.sep, 1)[0])
    return out


def _old(directory: Path, keep: set[str], cutoff: float,
         used: Callable[[Path], float]) -> list[Path]:
    """The entries of ``directory`` not in ``keep`` and last used before ``cutoff``."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out = []
    for name in names:
        path = directory / name
        if name.startswith(".") or name.endswith(".lock") or name in keep:
            continue  # side directories are materialise's to reap; locks stay
        if os.path.isdir(path) and not os.path.islink(path) and used(path) < cutoff:
            out.append(path)
    return out


def _tree_used(path: Path) -> float:
    """A tree's directory: its mtime is when the tree was placed in it."""
    return max(_mtimes(path))


def _repo_used(path: Path) -> float:
    """A repository's directory, or its lock file (taken on every use), whichever is newer."""
    return max(_mtimes(path, path.with_name(path.name + ".lock")))


def _mtimes(*paths: Path) -> list[float]:
    out = [0.0]
    for p in paths:
        with contextlib.suppress(OSError):
            out.append(os.stat(p).st_mtime)
    return out


def _remove_tree(path: Path) -> bool:
    aside = path.with_name(f".tmp-{owned_token()}")  # materialise reaps it if we die here
    try:
        os.rename(path, aside)
    except OSError:
        return False
    return remove_quietly(aside)


def _remove_repo(path: Path) -> bool:
    from bootstrap.primitives import lock

    try:
        with lock.hold(path.with_name(path.name + ".lock"), 0.1, "gc",
                       name="a git cache repository"):
            return remove_quietly(path)
    except BootstrapError:
        return False  # in use: kept, and its use makes it recent
