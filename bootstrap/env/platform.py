"""The platform an interpreter builds for: what a snapshot or a lock file is only valid on.

Every field is a property of the binary that runs. A venv built for one platform is never
restored on another, and a lock file resolved for one is stale on another.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from bootstrap.env.uv import Uv


@dataclass(frozen=True)
class Platform:
    python_version: str
    implementation: str
    os: str
    machine: str
    libc: str

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


def platform_of(uv: Uv, request: str) -> Platform:
    """The platform of the interpreter ``uv venv --python request`` would use.

    For an absolute path ``uv venv`` runs that very binary (uv 0.13.9 keeps the path as given,
    takes a venv's base interpreter, and a pyenv shim's target). So the interpreter running us
    (the default) is answered in-process, another absolute path is probed directly, and only a
    request such as "3.11" asks ``uv python find`` first (with the probe, ~0.1 s of every
    restore).
    """
    import platform

    if is_running_interpreter(request):
        return local_platform(platform.python_version())
    from bootstrap.env.probe import probe

    python = Path(request) if _is_executable(request) else _find_python(uv, request)
    return Platform(**probe(python, isolated=True).platform)


def local_platform(python_version: str) -> Platform:
    """The platform as seen from this process: no child (``status``, and a restore for the
    interpreter running us). The same expressions as the probe's: ``libc_ver()`` asks the libc
    loaded in this process (glibc's confstr), not the executable's file, which names an older
    symbol version (2.34 where confstr says 2.36 here).
    """
    import platform

    libc = "-".join(platform.libc_ver()) or "none"
    return Platform(python_version, sys.implementation.name, sys.platform, platform.machine(),
                    libc)


def is_running_interpreter(request: str) -> bool:
    # realpath, not samefile: a hard link elsewhere would find another prefix's stdlib.
    return os.path.isabs(request) and os.path.realpath(request) == os.path.realpath(
        sys.executable)


def _is_executable(request: str) -> bool:
    return os.path.isabs(request) and os.path.isfile(request) and os.access(request, os.X_OK)


def _find_python(uv: Uv, request: str) -> Path:
    found = uv.run("python", "find", "--system", request,
                   what=f"uv found no interpreter for {request!r}", index=False)
    return Path(found.stdout.strip().splitlines()[-1])
