"""Push skill trees into targets: everything is validated first, then targets run in parallel.

The harness we replace let two sources race for one destination and discovered a bad skill
half-way through a copy. Here :func:`push` validates every source (SKILL.md, names, symlinks
leaving the tree, special files, unreadable files), refuses two skills that would land on one
destination (names equal up to case included, since a case-insensitive sandbox folds them) and
only then sends anything, to at most ``jobs`` targets at a time. One target failing does not
stop the others; each gets its own :class:`~bootstrap.trees.targets.PushReport`.

Library use (a harness with its own target object)::

    reports = await bootstrap.trees.push([Path("skills/pdf")], "/skills", [my_target])
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import time
from collections.abc import Sequence
from pathlib import Path

from bootstrap.errors import BootstrapError, ConfigError, ProcessError, SkillError
from bootstrap.primitives import log
from bootstrap.trees.skilltree import SkillTree, check_collisions, load_skill_tree
from bootstrap.trees.targets import PushReport, Target

__all__ = ["PushReport", "Target", "load_trees", "push", "push_sync"]


async def push(
    sources: Sequence[Path], dest: str, targets: Sequence[Target], jobs: int = 8, *,
    prune: bool = False,
) -> list[PushReport]:
    """Push every skill in ``sources`` into ``dest`` of every target; one report per target,
    in the order given. ``prune``: each target then removes the skills pushed into ``dest``
    earlier that ``sources`` no longer has (see :class:`~bootstrap.trees.targets.Target`).

    Raises :class:`SkillError` / :class:`ConfigError` (exit 2) before anything is sent; a
    target that fails is reported with ``ok=False`` rather than raised.
    """
    _check_request(dest, targets, jobs)
    trees = load_trees(sources)
    limit = asyncio.Semaphore(jobs)

    async def one(target: Target) -> PushReport:
        async with limit:
            return await _push_one(target, trees, dest, prune)

    return list(await asyncio.gather(*(one(r) for r in targets)))


def push_sync(
    sources: Sequence[Path], dest: str, targets: Sequence[Target], jobs: int = 8, *,
    prune: bool = False,
) -> list[PushReport]:
    """:func:`push` for callers without an event loop."""
    return asyncio.run(push(sources, dest, targets, jobs, prune=prune))


def load_trees(sources: Sequence[Path]) -> list[SkillTree]:
    """Validate every source and refuse colliding destinations; SkillError names the path(s)."""
    trees = [load_skill_tree(src) for src in sources]
    check_collisions(trees)
    for tree in trees:
        _check_readable(tree)
    return trees


def _check_request(dest: str, targets: Sequence[Target], jobs: int) -> None:
    if jobs < 1:
        raise ConfigError(f"jobs must be at least 1, not {jobs}")
    if not dest or "\0" in dest:
        raise ConfigError(f"--dest {dest!r}: not a usable path")
    if posixpath.normpath(dest) in ("/", "//"):
        raise ConfigError("--dest /: refusing to push skills into the file system root")
    if not targets:
        raise ConfigError("no runtime to push into")
    names = [r.name for r in targets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        # Two pushes into one sandbox's DEST would race on the same renames.
        raise ConfigError(f"runtime given more than once: {', '.join(twice)}")


def _check_readable(tree: SkillTree) -> None:
    """An unreadable file would otherwise abort the stream half-way, after other targets got
    theirs: find it now, while nothing has been sent."""
    for e in tree.entries:
        need = os.R_OK | os.X_OK if e.kind == "dir" else os.R_OK
        if e.kind != "symlink" and not os.access(e.path, need):
            raise SkillError(f"skill {tree.name!r}: {e.path}: permission denied")


async def _push_one(target: Target, trees: Sequence[SkillTree], dest: str,
                    prune: bool) -> PushReport:
    start = time.monotonic()
    try:
        # Without --prune, called as the Target protocol always was: a harness's own target
        # need not know the keyword.
        report = await (target.push(trees, dest, prune=True) if prune
                        else target.push(trees, dest))
    except (BootstrapError, OSError) as e:
        # A ProcessError already names the target in its first line; anything else gets it.
        message = str(e) if isinstance(e, ProcessError) else f"push to {target.name} failed: {e}"
        log.debug("push failed", runtime=target.name, error=message)
        return PushReport(target.name, dest, ok=False, error=message)
    log.debug("pushed", runtime=target.name, skills=len(report.skills),
              seconds=round(time.monotonic() - start, 3))
    return report
