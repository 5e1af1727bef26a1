"""The git skills a config can use without git: those the skills lock pins for a configured
source whose tree the cache holds as it was checked out from the locked commit. ``status``,
``publish`` and the warm fingerprint see them; ``prepare`` checks each again before ``ensure``
installs it, and makes a changed one again. Read-only: nothing here changes a tree."""

from __future__ import annotations

from pathlib import Path

from bootstrap.errors import BootstrapError
from bootstrap.sources import lockfile, treerecord
from bootstrap.sources.paths import tree_path
from bootstrap.sources.spec import GitSource


def cached_skills(sources: tuple[GitSource, ...], lock: Path) -> list[tuple[str, Path, str]]:
    """(name, tree, how to name its source) for each locked, cached skill of ``sources``."""
    keys = {lockfile.source_key(s): s.cache_key for s in sources}
    out = []
    for entry in lockfile.read(lock):
        key = keys.get(entry.source_key)
        if key is None:
            continue
        path = tree_path(entry.sha256, entry.name)
        if _usable(path, entry.sha256, (key, entry.commit, entry.path)):
            out.append((entry.name, path, describe(entry)))
    return out


def _usable(path: Path, sha256: str, origin: treerecord.Origin) -> bool:
    """Whether the tree at ``path`` is what ``origin`` (repository, commit, path) hashed to:
    its record says it was checked out from there, and every entry still has its recorded
    stamp (a stat each, no hash). When a stamp moved (a file changed, or Python wrote bytecode
    beside a source), the tree is hashed and its modes looked at, as ``ensure`` would, without
    fixing anything."""
    record = treerecord.read(path)
    if record is None or record.sha256 != sha256 or origin not in record.origins:
        return False
    if treerecord.holds(record, path, vouch=True):
        return True
    from bootstrap.sources.treehash import matching, read
    from bootstrap.sources.verify import unsealed

    try:
        kept = matching(read(path), sha256)
    except (BootstrapError, OSError):
        return False
    return kept is not None and unsealed(path, kept) == ([], None)


def describe(entry: lockfile.LockedSkill) -> str:
    return f"{entry.git} (path {entry.path or '.'}, commit {entry.commit})"
