"""``kernel-bootstrap lock``: pin the runtime's requirements (the ``lock`` key) and the git
sources (the skills lock), each file as it applies.

The runtime lock is written as before; the skills lock through the same
:func:`bootstrap.engine.sources.prepare` that ``ensure`` runs, so a locked tree is fetched and
checked here too. Without ``--upgrade`` a source the skills lock holds is never resolved again
(only missing ones are added, stale ones dropped); with it every branch and tag moves to its
current commit. A config with git sources and no ``lock`` key locks the skills alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bootstrap.config import Config, load_config
from bootstrap.errors import EXIT_FAILED, EXIT_OK
from bootstrap.primitives.log import counted


def lock(config_path: Path | None, *, upgrade: bool, as_json: bool) -> int:
    config = load_config(config_path)
    out: dict[str, Any] = {}
    lines: list[str] = []
    skills = _skills_wanted(config)
    if config.lock is not None or not skills:
        # No `lock` key and no git source: pins.write says what is missing (exit 2), as before.
        out, line = _runtime(config, upgrade)
        lines.append(line)
    failed: dict[str, str] = {}
    if skills:
        out["skills_lock"], line, failed = _skills(config, upgrade)
        lines.append(line)
    if as_json:
        print(json.dumps(out))
    else:
        print("\n".join(lines))
    return EXIT_FAILED if failed else EXIT_OK


def _skills_wanted(config: Config) -> bool:
    from bootstrap.engine import sources

    return sources.wanted(config)


def _runtime(config: Config, upgrade: bool) -> tuple[dict[str, Any], str]:
    from bootstrap.env.pins import write

    result = write(config, upgrade=upgrade)
    pinned = counted(result.packages, "pinned package")
    data = {"lockfile": str(result.path), "format": result.format, "changed": result.changed,
            "inputs": result.inputs, "packages": result.packages}
    if result.changed:
        return data, f"{result.path}: written ({pinned}, {result.format})"
    why = "nothing newer" if upgrade else "the inputs are unchanged"
    return data, f"{result.path}: unchanged ({why}; {pinned})"


def _skills(config: Config, upgrade: bool) -> tuple[dict[str, Any], str, dict[str, str]]:
    """The skills lock brought in step (``upgrade``: every source resolved again)."""
    from bootstrap.engine import sources
    from bootstrap.sources import lockfile

    path = config.skills_lock
    assert path is not None, "BUG: git sources without a skills lock path"
    before = _bytes(path)
    from bootstrap.sources import registry

    # The venv too: once this moves the lock on, only its editables name the trees it uses.
    registry.remember_for(config.git_sources, config.skills_lock, config.venv)
    _, failed = sources.prepare(config, upgrade=upgrade)
    changed = _bytes(path) != before
    entries = lockfile.read(path)
    data = {"path": str(path), "changed": changed,
            "skills": [{"name": e.name, "git": e.git, "path": e.path or ".",
                        "commit": e.commit, "sha256": e.sha256} for e in entries],
            "failed": [{"name": n, "error": e} for n, e in failed.items()]}
    pinned = counted(len(entries), "git skill")
    line = f"{path}: {'written' if changed else 'unchanged'} ({pinned})"
    for name, error in failed.items():
        line += f"\n{name}: failed: {error}"
    return data, line, failed


def _bytes(path: Path) -> bytes | None:
    from bootstrap.primitives.fs import read_state_file

    try:
        return read_state_file(path, 8 * 1024 * 1024)  # only compared: lockfile.read parses
    except OSError:
        return None
