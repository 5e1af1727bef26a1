"""Jupyter kernelspecs that start the managed interpreter: where they go, what they hold, and an
install that a running Jupyter never sees half done.

The kernelspec names the venv's interpreter by its stable path, so it survives every rebuild:
``ensure`` swaps a new venv in at the same path. Jupyter lists every directory under
``kernels/`` that holds a ``kernel.json`` (a name it finds invalid only earns a warning), so the
new spec is staged beside ``kernels/``, not inside it, and renamed into place in one step.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, TypedDict

from bootstrap.atomic import exchange
from bootstrap.config import Config, validate_requirements
from bootstrap.errors import ConfigError
from bootstrap.fs import fsync_dir, temp_name

DEFAULT_NAME: Final = "kernel-bootstrap"
# Jupyter's rule for kernel names; it lower-cases them when it installs and when it lists.
_NAME_RE: Final = re.compile(r"[a-zA-Z0-9._-]+")
# Room under NAME_MAX (255) for the staging name's pid and random suffix.
MAX_NAME: Final = 200
LAUNCHER: Final = ("-m", "ipykernel_launcher", "-f", "{connection_file}")
SPEC_FILE: Final = "kernel.json"


class KernelSpec(TypedDict):
    argv: list[str]
    display_name: str
    language: str
    metadata: dict[str, Any]


def check_name(name: str) -> str:
    """The kernel's directory name, lower-cased as Jupyter does; a bad one is a ConfigError."""
    if not _NAME_RE.fullmatch(name) or name in (".", "..") or len(name) > MAX_NAME:
        raise ConfigError(
            f"invalid kernel name {name!r}: use letters, digits, '.', '_' and '-' "
            f"(at most {MAX_NAME}, and not '.' or '..'), e.g. --name {DEFAULT_NAME}"
        )
    return name.lower()


def require_ipykernel(config: Config) -> None:
    """Refuse before anything is built when the runtime would not contain ipykernel."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    validate_requirements(config)
    if any(canonicalize_name(Requirement(r).name) == "ipykernel" for r in config.requirements):
        return
    raise ConfigError(
        f"{config.path}: a Jupyter kernel needs ipykernel in the runtime, and no requirement "
        'names it: add "ipykernel" to `requirements` (e.g. requirements = ["ipykernel>=6"]), '
        "then run `kernel-bootstrap kernelspec install` again"
    )


def user_data_dir() -> Path:
    """Jupyter's per-user data directory, found the way jupyter_core finds it."""
    explicit = os.environ.get("JUPYTER_DATA_DIR")
    if explicit:
        return Path(os.path.abspath(os.path.expanduser(explicit)))
    home = Path(os.path.expanduser("~"))
    if sys.platform == "darwin":
        return home / "Library" / "Jupyter"
    if sys.platform == "win32":
        appdata = os.environ.get("APPDATA")
        return (Path(appdata) if appdata else home / "AppData" / "Roaming") / "jupyter"
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else home / ".local" / "share") / "jupyter"


def kernels_dir(prefix: Path | None = None) -> Path:
    """``PREFIX/share/jupyter/kernels`` with a prefix, else the user's ``<data dir>/kernels``."""
    if prefix is not None:
        root = Path(os.path.abspath(os.path.expanduser(prefix)))
        return root / "share" / "jupyter" / "kernels"
    return user_data_dir() / "kernels"


def spec_for(python: Path, name: str, display_name: str | None, config: Config) -> KernelSpec:
    return {
        "argv": [str(python), *LAUNCHER],
        "display_name": display_name or f"Python ({name})",
        "language": "python",
        "metadata": {"kernel_bootstrap": {
            "config": str(config.path) if config.path else None,
            "venv": str(config.venv),
        }},
    }


def install_spec(kernels: Path, name: str, spec: KernelSpec) -> Path:
    """Write ``kernels/name/kernel.json``, replacing any earlier spec of that name atomically."""
    target = kernels / name
    kernels.mkdir(parents=True, exist_ok=True)
    staged = temp_name(kernels.parent / f"kernelspec-{name}", "stage")
    with _removed_on_failure(staged):
        staged.mkdir()
        _write_durably(staged / SPEC_FILE, json.dumps(spec, indent=1).encode() + b"\n")
        fsync_dir(staged)
        _swap_in(staged, target)
    fsync_dir(kernels)
    return target


def _swap_in(staged: Path, target: Path) -> None:
    if not os.path.lexists(target):
        os.rename(staged, target)
        return
    if exchange(staged, target):
        _remove(staged)  # the old spec, now at the staging name
        return
    # Without RENAME_EXCHANGE there is an instant with no spec at `target`; a kill right there
    # leaves the old one aside, and the next install replaces it anyway. A failure (not a kill)
    # puts the old one back.
    aside = temp_name(staged.with_name(f"kernelspec-{target.name}"), "old")
    os.rename(target, aside)
    try:
        os.rename(staged, target)
    except BaseException:
        os.rename(aside, target)
        raise
    _remove(aside)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_symlink() or not path.is_dir():
            path.unlink()  # a symlinked spec: remove the link, never what it points at
        else:
            shutil.rmtree(path)


@contextlib.contextmanager
def _removed_on_failure(path: Path) -> Iterator[None]:
    # BaseException: ^C mid-install must not leave a staging directory behind either.
    try:
        yield
    except BaseException:
        _remove(path)
        raise


def _write_durably(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
