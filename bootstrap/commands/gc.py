"""``kernel-bootstrap gc``: remove what dead processes left beside the venv, and prune the build
cache (entries whose skill is gone or that nobody used for 30 days)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.config_file import find_config_file
from bootstrap.env.venv import recover
from bootstrap.errors import EXIT_OK
from bootstrap.primitives import lock


def gc(config_path: Path | None, *, as_json: bool, roots: Sequence[Path] = (),
       grace: float = 30.0, lock_timeout: float = 10.0) -> int:
    """Clean beside the config's venv (when there is a config) and beside each ``--root``."""
    from bootstrap.skills.buildcache import prune

    # The build cache is the user's, not the config's: pruned whichever venv (if any) we serve.
    done: list[str] = prune()
    if roots:
        from bootstrap.trees.publish import gc_publish_state

        for root in roots:
            done += [f"removed {p}" for p in gc_publish_state(root.absolute(), grace,
                                                               lock_timeout=lock_timeout)]
        if config_path is None and not find_config_file(None).exists():
            return _report(None, done, as_json)  # only roots to clean, no venv to look after
    config = load_config(config_path)
    # Nothing can be left where nothing was ever built; and taking the lock would create its
    # directory and file on a machine that never ran `ensure`.
    if config.venv.parent.is_dir():
        # Under the lock, every staging or retired tree belongs to a process that is gone: only
        # the holder builds. A live holder makes us wait (bounded), never remove its work.
        with lock.hold(lock.lock_path(config.venv), lock_timeout, purpose="gc"):
            done += recover(config.venv)
    return _report(config.venv, done, as_json)


def _report(venv: Path | None, done: list[str], as_json: bool) -> int:
    if as_json:
        print(json.dumps({"venv": str(venv) if venv else None, "done": done}))
    else:
        print("\n".join(done) if done else "nothing to remove")
    return EXIT_OK
