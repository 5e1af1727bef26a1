"""The uv call log: shims that put a uv (fake or real) behind $FAKE_UV_LOG, and its reader.

Both shims write through ``fake_uv``'s own ``log_line``, so there is one log format: a JSON line
per call (``argv``, ``pid``) and, for a ``pip install``, a detail line with the same pid naming
the editables (by directory name) it was asked for.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from fake_uv.__main__ import log_line
from testing import REPO_ROOT


class Call(list[str]):
    """One logged uv call: its argv, plus what a ``pip install`` asked for."""

    def __init__(self, entry: dict[str, Any]) -> None:
        super().__init__(entry["argv"])
        self.editables: list[str] = entry.get("editables", [])
        self.requirements: list[str] = entry.get("requirements", [])
        self.wheels: int = entry.get("wheels", 0)  # skills sent as prebuilt editable wheels


@functools.cache
def _fake_uv_needs_pythonpath() -> bool:
    """Whether a child `python -m fake_uv`, run from outside the repo, cannot import it.

    It can when kernel-bootstrap is installed (editable) in the venv running the tests; a plain
    checkout needs the repo root on PYTHONPATH. Asked once per session, from `/`, because `-m`
    puts the working directory on sys.path and would hide the difference.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([sys.executable, "-c", "import fake_uv.__main__"], cwd="/", env=env,
                           capture_output=True, check=False)
    return probe.returncode != 0


def fake_uv_shim(directory: Path) -> Path:
    """Write an executable `directory/uv` that runs fake_uv with this interpreter; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["#!/bin/sh"]
    if _fake_uv_needs_pythonpath():
        root = shlex.quote(str(REPO_ROOT))
        lines.append(f'PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH')
    lines.append(f'exec {shlex.quote(sys.executable)} -m fake_uv "$@"')
    shim = directory / "uv"
    shim.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shim.chmod(0o755)
    return shim


_REAL_SHIM = """\
#!{python}
import os, sys
sys.path.insert(0, {root!r})
from testing.uvlog import log_real_call
log_real_call(sys.argv[1:])
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


def real_uv_shim(path: Path, real: str) -> Path:
    """Write an executable ``path`` that logs each call (see log_real_call), then execs the
    uv binary ``real``; return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_REAL_SHIM.format(python=sys.executable, root=str(REPO_ROOT), real=real),
                    encoding="utf-8")
    path.chmod(0o755)
    return path


def log_real_call(argv: list[str]) -> None:
    """Log a call to the real uv as fake_uv logs its own: argv, and for a ``-r`` file the
    skills in it. A skill goes in as ``-e DIR``, or as the wheel kernel-bootstrap built for it
    in a directory named after it."""
    log_line({"argv": argv, "pid": os.getpid()})
    if "-r" not in argv:
        return
    with open(argv[argv.index("-r") + 1], encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    wheels = [w for w in lines if w.endswith(".whl")]
    editables = [os.path.basename(e.split(None, 1)[1]) for e in lines if e.startswith("-e ")]
    editables += [os.path.basename(os.path.dirname(w)) for w in wheels]
    log_line({"pid": os.getpid(), "detail": True, "editables": sorted(editables),
              "requirements": [], "wheels": len(wheels)})


def read_uv_log(log: Path) -> list[list[str]]:
    """The argv of every call logged to `log` ($FAKE_UV_LOG), oldest first."""
    return [entry["argv"] for entry in read_uv_entries(log)]


def read_uv_entries(log: Path) -> list[dict[str, Any]]:
    """Every call, oldest first: ``argv`` and ``pid``, and for ``pip install`` calls that got
    as far as reading their requirements, ``editables`` (directory names), ``requirements``
    (names; the contents of -r files included) and ``wheels`` (prebuilt wheels it was given)."""
    try:
        text = log.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    calls: list[dict[str, Any]] = []
    by_pid: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry.get("detail"):
            call = by_pid.get(entry["pid"])
            if call is not None:
                call.update({k: v for k, v in entry.items() if k not in ("pid", "detail")})
            continue
        calls.append(entry)
        by_pid[entry["pid"]] = entry
    return calls


def read_calls(log: Path) -> list[Call]:
    """Every call of ``log`` as a :class:`Call`, oldest first."""
    return [Call(e) for e in read_uv_entries(log)]
