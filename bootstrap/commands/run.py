"""``kernel-bootstrap run``: ensure, then become the managed interpreter.

Jupyter (or any launcher) starts ``kernel-bootstrap run -- -m ipykernel_launcher -f FILE``: the
environment is made ready exactly as ``ensure`` makes it, and the process then execs the venv's
interpreter with the Python arguments, so the kernel keeps the pid its launcher started. A warm
start never gets here: ``bootstrap.warm`` execs from its fingerprint check.

Right before that exec, an ipykernel launch is offered to the venv's kernel server
(``commands.serve.offer``, the one hook both paths call): when one serves it, this process stays
as the kernel's stand-in instead (docs/architecture.md, "Kernel server").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bootstrap.commands.serve import offer
from bootstrap.config import Config, load_config
from bootstrap.engine.ensure import ensure
from bootstrap.engine.status import status
from bootstrap.errors import BootstrapError, ConfigError
from bootstrap.primitives import log, process


def run(config_path: Path | None, *, strict: bool, python_args: Sequence[str],
        locked: bool = False) -> int:
    """Exec the ready interpreter; with ``strict``, exit 3 instead when a skill failed;
    ``locked``: exit 2 when the skills lock does not match the git sources."""
    config = load_config(config_path)
    if config.git_sources:  # without any, nothing of bootstrap.sources is imported
        from bootstrap.sources import registry

        registry.remember_for(config.git_sources, config.skills_lock, config.venv)
    try:
        result = ensure(config, locked=locked)
    except (BootstrapError, OSError) as e:  # OSError: the environment's, as the CLI says
        earlier = usable_earlier(config)
        # --locked asked for the lock to match or nothing: never the earlier runtime instead.
        if earlier is None or (locked and isinstance(e, ConfigError)):
            raise
        # A kernel that starts beats one that does not: the earlier runtime still works.
        log.warning(f"the environment could not be made ready ({e}); starting the earlier "
                    f"runtime in {config.venv}", venv=str(config.venv))
        process.replace(earlier, python_args)
    if strict and result.failed:
        from bootstrap import warm_failures  # the words and exit the warm path gives too

        return warm_failures.refuse_strict(list(result.failed))
    if config.path is not None and config.override_python is None:
        # Not for the earlier runtime above, nor an interpreter of the user's: a server serves
        # the venv's current generation only.
        offer(str(config.venv), str(result.python), list(python_args), str(config.path),
              config.kernel_server)
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
