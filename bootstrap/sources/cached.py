"""The git skills a config can use without git: those the skills lock pins for a configured
source whose tree the cache already holds (one stat each, no hash: ``status``, ``publish`` and
the warm fingerprint see them; ``prepare`` checks their hash before ``ensure`` installs them)."""

from __future__ import annotations

import os
from pathlib import Path

from bootstrap.sources import lockfile
from bootstrap.sources.materialise import tree_path
from bootstrap.sources.spec import GitSource


def cached_skills(sources: tuple[GitSource, ...], lock: Path) -> list[tuple[str, Path, str]]:
    """(name, tree, how to name its source) for each locked, cached skill of ``sources``."""
    wanted = {lockfile.source_key(s) for s in sources}
    out = []
    for entry in lockfile.read(lock):
        if entry.source_key not in wanted:
            continue
        path = tree_path(entry.sha256, entry.name)
        if os.path.isfile(path / "SKILL.md"):
            out.append((entry.name, path, describe(entry)))
    return out


def describe(entry: lockfile.LockedSkill) -> str:
    return f"{entry.git} (path {entry.path or '.'}, commit {entry.commit})"
