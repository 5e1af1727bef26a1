"""``kernel-bootstrap run``: ensure, then become the managed interpreter.

Jupyter (or any launcher) starts ``kernel-bootstrap run -- -m ipykernel_launcher -f FILE``: the
environment is made ready exactly as ``ensure`` makes it, and the process then execs the venv's
interpreter with the Python arguments, so the kernel keeps the pid its launcher started. A warm
start never gets here: ``bootstrap.warm`` execs from its fingerprint check.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bootstrap.config import Config, load_config
from bootstrap.engine.ensure import ensure
from bootstrap.engine.status import status
from bootstrap.errors import BootstrapError
from bootstrap.primitives import log, process


def run(config_path: Path | None, *, strict: bool, python_args: Sequence[str]) -> int:
    """Exec the ready interpreter; with ``strict``, exit 3 instead when a skill failed."""
    config = load_config(config_path)
    try:
        result = ensure(config)
    except (BootstrapError, OSError) as e:  # OSError: the environment's, as the CLI says
        earlier = usable_earlier(config)
        if earlier is None:
            raise
        # A kernel that starts beats one that does not: the earlier runtime still works.
        log.warning(f"the environment could not be made ready ({e}); starting the earlier "
                    f"runtime in {config.venv}", venv=str(config.venv))
        process.replace(earlier, python_args)
    if strict and result.failed:
        from bootstrap import warm_failures  # the words and exit the warm path gives too

        return warm_failures.refuse_strict(list(result.failed))
    process.replace(result.python, python_args)


def usable_earlier(config: Config) -> Path | None:
    """The venv's interpreter if the venv holds a runtime a rebuild left (a readable marker of
    the current schema and an interpreter that can be executed); None otherwise, and always
    with ``KERNEL_BOOTSTRAP_PYTHON`` (no venv is managed then)."""
    if config.override_python is not None:
        return None
    found = status(config)
    if found.marker.state != "ok" or not os.access(found.python, os.X_OK):
        return None
    return found.python
