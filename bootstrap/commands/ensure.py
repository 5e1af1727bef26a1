"""``kernel-bootstrap ensure``: make the environment ready; print the interpreter path."""

from __future__ import annotations

import json
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.engine.ensure import ensure as run_ensure
from bootstrap.errors import EXIT_OK, EXIT_SKILLS_FAILED
from bootstrap.primitives import progress
from bootstrap.sources import registry


def ensure(config_path: Path | None, *, as_json: bool, strict: bool, lock_timeout: float,
           retry: bool = False, locked: bool = False) -> int:
    """stdout: the interpreter path (or one JSON object); on a terminal, stderr closes with what
    this run installed and removed (``+ name==version`` / ``- name==version``), as uv does."""
    config = load_config(config_path)
    registry.remember_for(config.git_sources, config.skills_lock)
    venv = str(config.venv) if progress.enabled() else None
    before = progress.distributions(venv)
    result = run_ensure(config, lock_timeout=lock_timeout, retry=retry, locked=locked)
    progress.summary(before, progress.distributions(venv))
    if as_json:
        print(json.dumps({
            "python": str(result.python),
            "venv": str(result.venv),
            "action": result.action,
            "installed": list(result.installed),
            "failed": [{"name": n, "error": e} for n, e in result.failed.items()],
            "removed": list(result.removed),
        }))
    else:
        print(result.python)
    return EXIT_SKILLS_FAILED if strict and result.failed else EXIT_OK

