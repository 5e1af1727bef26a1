"""``kernel-bootstrap gc``: remove what dead processes left beside the venv."""

from __future__ import annotations

import json
from pathlib import Path

from bootstrap import lock
from bootstrap.config import load_config
from bootstrap.errors import EXIT_OK
from bootstrap.venv import recover


def gc(config_path: Path | None, *, as_json: bool, lock_timeout: float = 10.0) -> int:
    config = load_config(config_path)
    done: list[str] = []
    # Nothing can be left where nothing was ever built; and taking the lock would create its
    # directory and file on a machine that never ran `ensure`.
    if config.venv.parent.is_dir():
        # Under the lock, every staging or retired tree belongs to a process that is gone: only
        # the holder builds. A live holder makes us wait (bounded), never remove its work.
        with lock.hold(config.venv, lock_timeout, purpose="gc"):
            done = recover(config.venv)
    if as_json:
        print(json.dumps({"venv": str(config.venv), "done": done}))
    else:
        print("\n".join(done) if done else "nothing to remove")
    return EXIT_OK
