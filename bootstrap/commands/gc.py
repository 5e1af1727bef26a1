"""``kernel-bootstrap gc``: remove what dead processes left beside the venv and the old
generations no process uses (saying which it kept because one does), and prune the build cache
(entries whose skill is gone or that nobody used for 30 days)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.config_file import find_config_file
from bootstrap.env import generations
from bootstrap.env.venv import recover
from bootstrap.errors import EXIT_OK
from bootstrap.primitives import lock


def gc(config_path: Path | None, *, as_json: bool, roots: Sequence[Path] = (),
       grace: float = 30.0, lock_timeout: float = 10.0) -> int:
    """Clean beside the config's venv (when there is a config) and beside each ``--root``."""
    from bootstrap.skills.buildcache import prune

    # The build cache is the user's, not the config's: pruned whichever venv (if any) we serve.
    done: list[str] = prune()
    removal = generations.Removal([], [])
    if roots:
        from bootstrap.trees.publish import gc_publish_state

        for root in roots:
            done += [f"removed {p}" for p in gc_publish_state(root.absolute(), grace,
                                                               lock_timeout=lock_timeout)]
        if config_path is None and not find_config_file(None).exists():
            # Only roots to clean, no venv to look after.
            return _report(None, done, removal, as_json)
    config = load_config(config_path)
    # Nothing can be left where nothing was ever built; and taking the lock would create its
    # directory and file on a machine that never ran `ensure`.
    if config.venv.parent.is_dir():
        # Under the lock, every staging or retired tree belongs to a process that is gone: only
        # the holder builds. A live holder makes us wait (bounded), never remove its work.
        with lock.hold(lock.lock_path(config.venv), lock_timeout, purpose="gc"):
            done += recover(config.venv)
            removal = generations.remove_unused(config.venv)
    done += [f"removed generation {p}" for p in removal.removed]
    return _report(config.venv, done, removal, as_json)


def _report(venv: Path | None, done: list[str], removal: generations.Removal,
            as_json: bool) -> int:
    kept = [f"kept generation {p}: in use" for p in removal.kept]
    if as_json:
        print(json.dumps({"venv": str(venv) if venv else None, "done": done,
                          "generations": {"removed": [str(p) for p in removal.removed],
                                          "in_use": [str(p) for p in removal.kept]}}))
    else:
        print("\n".join(done + kept) if done or kept else "nothing to remove")
    return EXIT_OK
