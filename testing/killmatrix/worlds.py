"""The kill matrix's worlds: the state each path starts from (a World per kind of run)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from testing.world import World

RUNTIME = ["requests>=2"]
NEW_RUNTIME = ["requests>=2", "six"]
NO_EXCHANGE = {"KERNEL_BOOTSTRAP_NO_EXCHANGE": "1"}
# The staged swap a venv without generations keeps (Windows): a plain directory throughout.
PLAIN = {"KERNEL_BOOTSTRAP_NO_GENERATIONS": "1"}


def cold(root: Path) -> World:
    w = World(root)
    w.write_config(requirements=RUNTIME)
    for name in ("alpha", "beta", "gamma"):
        w.skill(name)
    return w


def rebuild(root: Path) -> World:
    """A ready venv whose runtime then changes: the rebuild is staged beside it."""
    w = cold(root)
    w.ensure()
    w.write_config(requirements=NEW_RUNTIME)
    w.clear_log()
    return w


def skills_only(root: Path) -> World:
    """A ready venv, then three more skills."""
    w = World(root)
    w.write_config(requirements=RUNTIME)
    for name in ("alpha", "beta"):
        w.skill(name)
    w.ensure()
    for name in ("gamma", "delta", "epsilon"):
        w.skill(name)
    w.clear_log()
    return w


def one_skill_removed(root: Path) -> World:
    """A ready venv, then a skill is no longer configured: the sync uninstalls it."""
    w = World(root)
    w.write_config(requirements=RUNTIME)
    for name in ("alpha", "beta"):
        w.skill(name)
    w.ensure()
    shutil.rmtree(w.skills_dir / "beta")
    w.clear_log()
    return w


def plain_rebuild(root: Path) -> World:
    """:func:`rebuild` of a venv without generations: the staged swap, then rename-aside."""
    w = World(root)
    w.env.update(PLAIN)
    w.write_config(requirements=RUNTIME)
    for name in ("alpha", "beta", "gamma"):
        w.skill(name)
    w.ensure()
    w.write_config(requirements=NEW_RUNTIME)
    w.clear_log()
    return w


def conversion(root: Path) -> World:
    """A ready plain-directory venv of an earlier release: the next ensure makes it the first
    generation (an exchange of the directory and a link), without a rebuild."""
    w = cold(root)
    w.ensure(env=PLAIN)
    w.clear_log()
    return w


WORLDS: dict[str, Callable[[Path], World]] = {
    "cold": cold, "rebuild": rebuild, "rebuild, rename-aside": plain_rebuild,
    "conversion": conversion,
    "skills-only": skills_only, "skills-only, one removed": one_skill_removed,
}


def path_env(path: str) -> dict[str, str]:
    return dict(NO_EXCHANGE) if "rename-aside" in path else {}
