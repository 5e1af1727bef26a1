"""``kernel-bootstrap publish [SRC...] --into ROOT [--prune]``: what was published (and
removed), one line per skill. Without SRC, the config's skills (:func:`configured_trees`, which
``push`` uses too): git sources included, their materialised trees checked first."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from bootstrap.errors import EXIT_OK, BootstrapError


def configured_trees(config_path: Path | None) -> list[Path]:
    """The config's skill directories, for ``publish``/``push`` given no SRC. Git skills go
    through ``prepare`` as in ``ensure`` (fetched if the cache lacks them, every tree's sha256
    checked); one that fails is an error, and nothing is published or pushed."""
    from bootstrap.config import load_config
    from bootstrap.engine import sources
    from bootstrap.sources import registry

    config = load_config(config_path)
    registry.remember_for(config.git_sources, config.skills_lock, config.venv)
    config, failed = sources.prepare(config)
    if failed:
        said = "; ".join(f"{name}: {why}" for name, why in failed.items())
        raise BootstrapError(f"git skills failed, nothing was copied: {said}")
    if not config.skills:
        raise BootstrapError(f"{config.path}: no skills configured, and no SRC given")
    return [s.path for s in config.skills]


def publish(sources: Sequence[Path], into: Path, grace: float, as_json: bool,
            prune: bool = False, config_path: Path | None = None) -> int:
    from bootstrap.trees.publish import publish_set

    if not sources:
        sources = configured_trees(config_path)

    results, pruned = publish_set(sources, into, grace=grace, prune=prune)
    if as_json:
        skills = [
            {"name": r.name, "path": str(r.path), "hash": r.hash, "changed": r.changed,
             "method": r.method}
            for r in results
        ]
        print(json.dumps({"into": str(into.resolve()), "skills": skills,
                          "removed": list(pruned.removed)}))
    else:
        for r in results:
            state = f"changed, {r.method}" if r.changed else "unchanged"
            print(f"published {r.name} -> {r.path} ({state})")
        for name in pruned.removed:
            print(f"removed {name} from {into.resolve()}")
    return EXIT_OK
