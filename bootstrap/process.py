"""The one helper that runs child processes.

Children get a cleaned environment (see :func:`child_env`) and their failures become a
:class:`~bootstrap.errors.ProcessError` that names the command and the tail of its stderr.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bootstrap.errors import ProcessError

# Variables that would make a child act on some other environment than the one we name:
# - VIRTUAL_ENV / CONDA_PREFIX: uv targets an activated env when no --python is given, and
#   `python` children would report the activated env in sys.prefix-based checks.
# - PYTHONHOME / PYTHONPATH: a kernel platform's own paths leak into the venv's interpreter and
#   make "is it installed in the venv?" checks pass for packages that live elsewhere.
# - PYTHONSTARTUP / PYTHONNOUSERSITE left alone: harmless for -c children.
_REMOVED_VARS = ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME", "PYTHONPATH", "__PYVENV_LAUNCHER__")


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: ours, minus what would retarget it, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _REMOVED_VARS}
    if extra:
        env.update(extra)
    return env


def run(
    *cmd: str | Path,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    what: str = "",
    error: type[ProcessError] = ProcessError,
    stdin: IO[bytes] | None = None,
) -> Result:
    """Run ``cmd`` to completion and capture its output.

    ``check`` turns a non-zero exit (or a command that cannot start) into ``error``; ``what``
    is the one-line description of the step used at the top of that error's message. ``stdin``
    is an open file for the child to read (by default it reads nothing).
    """
    argv = tuple(str(c) for c in cmd)
    try:
        proc = subprocess.run(
            argv,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            env=dict(env) if env is not None else child_env(),
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as e:
        raise error(argv, 127, f"{e.filename}: not found", what or "could not start") from e
    except PermissionError as e:
        raise error(argv, 126, str(e), what or "could not start") from e
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
        raise error(argv, -9, stderr + f"\ntimed out after {timeout} s", what) from e
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise error(argv, proc.returncode, proc.stderr, what)
    return result
