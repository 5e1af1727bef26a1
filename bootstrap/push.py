"""Push skill trees into runtimes: everything is validated first, then runtimes run in parallel.

The harness we replace let two sources race for one destination and discovered a bad skill
half-way through a copy. Here :func:`push` validates every source (SKILL.md, names, symlinks
leaving the tree, special files, unreadable files), refuses two skills that would land on one
destination (names equal up to case included, since a case-insensitive sandbox folds them) and
only then sends anything, to at most ``jobs`` runtimes at a time. One runtime failing does not
stop the others; each gets its own :class:`~bootstrap.runtimes.PushReport`.

Library use (a harness with its own runtime object)::

    reports = await bootstrap.push([Path("skills/pdf")], "/skills", [my_runtime])
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import time
from collections.abc import Sequence
from pathlib import Path

from bootstrap import log
from bootstrap.errors import BootstrapError, ConfigError, ProcessError, SkillError
from bootstrap.runtimes import PushReport, Runtime
from bootstrap.skilltree import SkillTree, check_collisions, load_skill_tree

__all__ = ["PushReport", "Runtime", "load_trees", "push", "push_sync"]


async def push(
    sources: Sequence[Path], dest: str, runtimes: Sequence[Runtime], jobs: int = 8, *,
    prune: bool = False,
) -> list[PushReport]:
    """Push every skill in ``sources`` into ``dest`` of every runtime; one report per runtime,
    in the order given. ``prune``: each runtime then removes the skills pushed into ``dest``
    earlier that ``sources`` no longer has (see :class:`~bootstrap.runtimes.Runtime`).

    Raises :class:`SkillError` / :class:`ConfigError` (exit 2) before anything is sent; a
    runtime that fails is reported with ``ok=False`` rather than raised.
    """
    _check_request(dest, runtimes, jobs)
    trees = load_trees(sources)
    limit = asyncio.Semaphore(jobs)

    async def one(runtime: Runtime) -> PushReport:
        async with limit:
            return await _push_one(runtime, trees, dest, prune)

    return list(await asyncio.gather(*(one(r) for r in runtimes)))


def push_sync(
    sources: Sequence[Path], dest: str, runtimes: Sequence[Runtime], jobs: int = 8, *,
    prune: bool = False,
) -> list[PushReport]:
    """:func:`push` for callers without an event loop."""
    return asyncio.run(push(sources, dest, runtimes, jobs, prune=prune))


def load_trees(sources: Sequence[Path]) -> list[SkillTree]:
    """Validate every source and refuse colliding destinations; SkillError names the path(s)."""
    trees = [load_skill_tree(src) for src in sources]
    check_collisions(trees)
    for tree in trees:
        _check_readable(tree)
    return trees


def _check_request(dest: str, runtimes: Sequence[Runtime], jobs: int) -> None:
    if jobs < 1:
        raise ConfigError(f"jobs must be at least 1, not {jobs}")
    if not dest or "\0" in dest:
        raise ConfigError(f"--dest {dest!r}: not a usable path")
    if posixpath.normpath(dest) in ("/", "//"):
        raise ConfigError("--dest /: refusing to push skills into the file system root")
    if not runtimes:
        raise ConfigError("no runtime to push into")
    names = [r.name for r in runtimes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        # Two pushes into one sandbox's DEST would race on the same renames.
        raise ConfigError(f"runtime given more than once: {', '.join(twice)}")


def _check_readable(tree: SkillTree) -> None:
    """An unreadable file would otherwise abort the stream half-way, after other runtimes got
    theirs: find it now, while nothing has been sent."""
    for e in tree.entries:
        need = os.R_OK | os.X_OK if e.kind == "dir" else os.R_OK
        if e.kind != "symlink" and not os.access(e.path, need):
            raise SkillError(f"skill {tree.name!r}: {e.path}: permission denied")


async def _push_one(runtime: Runtime, trees: Sequence[SkillTree], dest: str,
                    prune: bool) -> PushReport:
    start = time.monotonic()
    try:
        # Without --prune, called as the Runtime protocol always was: a harness's own runtime
        # need not know the keyword.
        report = await (runtime.push(trees, dest, prune=True) if prune
                        else runtime.push(trees, dest))
    except (BootstrapError, OSError) as e:
        # A ProcessError already names the runtime in its first line; anything else gets it.
        message = str(e) if isinstance(e, ProcessError) else f"push to {runtime.name} failed: {e}"
        log.debug("push failed", runtime=runtime.name, error=message)
        return PushReport(runtime.name, dest, ok=False, error=message)
    log.debug("pushed", runtime=runtime.name, skills=len(report.skills),
              seconds=round(time.monotonic() - start, 3))
    return report
