"""``kernel-bootstrap ensure``: make the environment ready; print the interpreter path."""

from __future__ import annotations

import json
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.engine.ensure import ensure as run_ensure
from bootstrap.errors import EXIT_OK, EXIT_SKILLS_FAILED, EXIT_USAGE, BootstrapError
from bootstrap.primitives import progress


def ensure(config_path: Path | None, *, as_json: bool, strict: bool, lock_timeout: float,
           retry: bool = False, locked: bool = False) -> int:
    """stdout: the interpreter path (or one JSON object); on a terminal, stderr closes with what
    this run installed and removed (``+ name==version`` / ``- name==version``), as uv does."""
    try:
        return _ensure(config_path, as_json=as_json, strict=strict, lock_timeout=lock_timeout,
                       retry=retry, locked=locked)
    except BootstrapError as e:
        if as_json and e.exit_code == EXIT_USAGE:
            # A program reading `ensure --json` gets its object for a config it cannot use (as
            # from `status --json`); stderr and the exit code (2) say the same as without it.
            # Only these: a refused rebuild (exit 1) is answered by the warm path too, with
            # nothing on stdout, and both paths must answer alike.
            print(json.dumps({"error": str(e)}))
        raise


def _ensure(config_path: Path | None, *, as_json: bool, strict: bool, lock_timeout: float,
            retry: bool, locked: bool) -> int:
    config = load_config(config_path)
    if config.git_sources:  # without any, nothing of bootstrap.sources is imported
        from bootstrap.sources import registry

        registry.remember_for(config.git_sources, config.skills_lock, config.venv)
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

