"""Git sources in ``ensure``: the config's skills completed by ``bootstrap.sources.prepare``,
and its failures folded into ensure's result.

Here, in the engine, because the sources family stands below the config's layer (the config
parses git entries with it) and so knows no Config. ``kernel-bootstrap lock`` calls
:func:`prepare` with ``upgrade``; ``ensure``/``run`` call it through
:func:`bootstrap.engine.ensure.ensure`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from bootstrap.config import Config, Skill
from bootstrap.engine.results import EnsureResult
from bootstrap.primitives import log
from bootstrap.sources import prepare as sources
from bootstrap.sources import treerecord


def wanted(config: Config, *, locked: bool = False) -> bool:
    """Whether ``config`` has git sources, or a skills lock to keep in step (a stat at most)."""
    return bool(config.git_sources) or locked or (
        config.skills_lock is not None and os.path.isfile(config.skills_lock))


def prepare(config: Config, *, upgrade: bool = False,
            locked: bool = False) -> tuple[Config, dict[str, str]]:
    """``config`` with every usable git skill in ``skills``, and the failed ones (name ->
    why). ``upgrade``: resolve every source again; ``locked``: the lock must match (exit 2)."""
    if config.skills_lock is None or not wanted(config, locked=locked):
        return config, {}
    local = tuple(s for s in config.skills if not sources.is_git(s.path))
    done = sources.prepare(config.git_sources, config.skills_lock,
                           local={s.name: s.path for s in local}, offline=config.offline,
                           upgrade=upgrade, locked=locked)
    git = tuple(Skill(s.name, s.path) for s in done.skills)
    # Every entry of every tree used is stamped by the warm fingerprint (not only its root,
    # SKILL.md and pyproject.toml): an edited file sends the next start to the check above.
    watch = config.watch + tuple(Path(p) for s in done.skills for p in treerecord.watched(s.path))
    return dataclasses.replace(config, skills=local + git, watch=watch), done.failed


def merged(result: EnsureResult, failed: dict[str, str], config: Config) -> EnsureResult:
    """``result`` with the git sources' failures, each warned about; with any, the warm
    fingerprint is forgotten: the next start must not answer "ready" without them."""
    if not failed:
        return result
    for name, error in failed.items():
        # A source that failed as a whole is named as the config names it (skills[N]).
        what = name if name.startswith("skills[") else f"skill {name}"
        log.warning(f"{what} failed: {error}", skill=name)
    if config.path is not None:
        from bootstrap import fingerprint

        fingerprint.forget(str(config.path))
    return dataclasses.replace(result, failed={**failed, **result.failed})
