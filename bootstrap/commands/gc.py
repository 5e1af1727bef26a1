"""``kernel-bootstrap gc``: remove what dead processes left beside the venv and the old
generations no process uses (saying which it kept because one does), prune the build cache
(entries whose skill is gone or that nobody used for 30 days) and the git cache (what no
skills lock on this machine names, no generation of a venv with git sources uses and nobody
used for 30 days, bootstrap.sources.gc), and stop the kernel servers of generations that are
gone (bootstrap.kernels.info.stop_stale)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bootstrap.config import load_config
from bootstrap.config_file import find_config_file
from bootstrap.env import generations
from bootstrap.env.venv import recover
from bootstrap.errors import EXIT_OK
from bootstrap.primitives import lock


def gc(config_path: Path | None, *, as_json: bool, roots: Sequence[Path] = (),
       grace: float = 30.0, lock_timeout: float = 10.0) -> int:
    """Clean beside the config's venv (when there is a config) and beside each ``--root``."""
    from bootstrap.kernels.info import stop_stale
    from bootstrap.skills.buildcache import MAX_AGE_DAYS, prune

    # The build cache and the kernel servers are the user's, not the config's: cleaned
    # whichever venv (if any) we serve.
    done: list[str] = prune()
    from bootstrap.sources.gc import prune as prune_git

    # What no skills lock names, unused as long, and no venv's generation uses.
    done += prune_git(MAX_AGE_DAYS, in_use=_git_trees_in_use())
    stopped = stop_stale()
    done += [f"stopped the kernel server of {s['venv']} (pid {s['pid']}): its generation "
             f"{s['generation']} is gone" for s in stopped]
    removal = generations.Removal([], [])
    if roots:
        from bootstrap.trees.publish import gc_publish_state

        for root in roots:
            done += [f"removed {p}" for p in gc_publish_state(root.absolute(), grace,
                                                               lock_timeout=lock_timeout)]
        if config_path is None and not find_config_file(None).exists():
            # Only roots to clean, no venv to look after.
            return _report(None, done, removal, stopped, as_json)
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
    return _report(config.venv, done, removal, stopped, as_json)


def _git_trees_in_use() -> list[str]:
    """The skill directories that the generations of every venv with git sources use (their
    markers' skills and their editables): between ``lock --upgrade`` and the next ``ensure``
    no skills lock names the tree a live kernel imports from. A venv that is gone, with
    every generation, is forgotten."""
    import contextlib

    from bootstrap.sources import registry

    out: list[str] = []
    for entry, live in registry.known_venvs():
        found = _generations(live)
        if not found and not os.path.lexists(live):
            with contextlib.suppress(OSError):
                os.unlink(entry)
        for generation in found:
            out += _used_by(generation)
    return out


def _generations(live: Path) -> list[Path]:
    """Every generation of the venv at ``live`` (a plain venv: itself)."""
    now = generations.current(live)
    here = [now] if now is not None else [live] if os.path.isdir(live) else []
    return here + generations.others(live)


def _used_by(venv: Path) -> list[str]:
    from bootstrap.env.marker import read_marker
    from bootstrap.env.venv import editable_urls, url_path

    marker = read_marker(venv)
    used = [r["path"] for r in marker.data["skills"].values()] if marker.data else []
    return used + [p for url in editable_urls(venv).values() if (p := url_path(url))]


def _report(venv: Path | None, done: list[str], removal: generations.Removal,
            stopped: list[dict[str, Any]], as_json: bool) -> int:
    kept = [f"kept generation {p}: in use" for p in removal.kept]
    if as_json:
        print(json.dumps({"venv": str(venv) if venv else None, "done": done,
                          "generations": {"removed": [str(p) for p in removal.removed],
                                          "in_use": [str(p) for p in removal.kept]},
                          # Each {"pid", "generation", "venv"}.
                          "kernel_servers_stopped": stopped}))
    else:
        print("\n".join(done + kept) if done or kept else "nothing to remove")
    return EXIT_OK
