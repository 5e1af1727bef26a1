"""``KERNEL_BOOTSTRAP_PYTHON``: use an interpreter as it is, after checking it in one child.

For platforms that ship their own kernel environment: no venv is created or touched. The
system we replace accepted any path and failed later, inside the kernel; we fail now, naming
each missing requirement.
"""

from __future__ import annotations

import os
from pathlib import Path

from bootstrap.config import Config
from bootstrap.engine.results import EnsureResult
from bootstrap.env import ready_check
from bootstrap.env.probe import probe, requirement_names, unmet_requirements
from bootstrap.env.requirements import validate_requirements
from bootstrap.errors import BootstrapError
from bootstrap.primitives import log
from bootstrap.skills.python_skill import import_names, load_python_skill
from bootstrap.trees import skillmd


def ensure_override(config: Config) -> EnsureResult:
    python = config.override_python
    if python is None:
        raise AssertionError("BUG: ensure_override without KERNEL_BOOTSTRAP_PYTHON")
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise BootstrapError(
            f"KERNEL_BOOTSTRAP_PYTHON={python} is not an executable file; point it at an "
            "interpreter, or unset it to let kernel-bootstrap manage a venv"
        )
    validate_requirements(config)
    skills = [load_python_skill(s) for s in config.python_skills]
    found = probe(python, requirement_names(config.requirements),
                  {s.name: import_names(s) for s in skills})
    unmet = unmet_requirements(config.requirements, found)
    if unmet:
        raise BootstrapError(
            f"KERNEL_BOOTSTRAP_PYTHON={python} does not satisfy the requirements:\n"
            + "\n".join(f"  {u}" for u in unmet)
        )
    if config.ready_check:
        # As a venv we build must pass it before it is used, so must one we are given.
        ready_check.run(python, config.ready_check,
                        what=f"KERNEL_BOOTSTRAP_PYTHON={python} fails the config's ready-check")
    for name, error in found.import_errors.items():
        if error:
            log.warning("skill does not import in the override interpreter", skill=name,
                        error=error, python=str(python))
    failed = {n: e for n, e in found.import_errors.items() if e}
    failed.update(skillmd.report((s.name, s.spec) for s in config.skills))
    return EnsureResult(python, _env_root(python), "override", failed=failed)


def _env_root(python: Path) -> Path:
    # bin/python or Scripts/python.exe: the environment is two levels up.
    return python.parent.parent
