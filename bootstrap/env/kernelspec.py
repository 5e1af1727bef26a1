"""Jupyter kernelspecs that start the managed interpreter: where they go, what they hold, and an
install that a running Jupyter never sees half done.

The kernelspec starts the kernel through ``kernel-bootstrap run`` (the gate): every kernel Jupyter,
jupyter_client, VS Code or a harness starts from it is made ready first, so a skill added after
the install is installed for it. Its argv starts the tool's own interpreter ``-I -S`` (no site:
the stand-in of a served kernel then costs about one bare interpreter start), which answers a
warm ``run`` itself and execs the gate argv for anything else (:func:`lean_argv`); a kernelspec
that names the console script itself still works. ``--direct`` writes the old form, the venv's
interpreter by its stable path (it survives every rebuild: ``ensure`` swaps a new venv in at the
same path), which skips the gate. Jupyter lists every directory under ``kernels/`` that holds a
``kernel.json`` (a name it finds invalid only earns a warning), so the new spec is staged beside
``kernels/``, not inside it, and renamed into place in one step.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Final, NotRequired, TypedDict

from bootstrap.config import Config
from bootstrap.env.requirements import validate_requirements
from bootstrap.errors import ConfigError
from bootstrap.primitives import swap
from bootstrap.primitives.fs import (
    fsync_dir,
    owner_pid,
    pid_alive,
    remove_quietly,
    removed_on_failure,
    temp_name,
    write_file,
)

DEFAULT_NAME: Final = "kernel-bootstrap"
# Jupyter's rule for kernel names; it lower-cases them when it installs and when it lists.
_NAME_RE: Final = re.compile(r"[a-zA-Z0-9._-]+")
# Room under NAME_MAX (255) for the staging name's pid and random suffix.
MAX_NAME: Final = 200
LAUNCHER: Final = ("-m", "ipykernel_launcher", "-f", "{connection_file}")
SPEC_FILE: Final = "kernel.json"
# The native stand-in's file name in bootstrap/kernels/ (hatch_build.py builds it there).
NATIVE_STANDIN: Final = "kb-standin"
# bootstrap.kernels.provisioner's entry point (pyproject.toml), the name kernelspecs give.
PROVISIONERS: Final = "jupyter_client.kernel_provisioners"
PROVISIONER: Final = "kernel-bootstrap-provisioner"
# What the gate needs to manage the venv the install managed: the overrides in force then.
# Jupyter starts kernels with its own environment, which may lack them. Nothing else is
# carried: credentials (AWS_*, an index URL with a token) stay out of a world-readable file.
CARRIED_ENV: Final = ("KERNEL_BOOTSTRAP_VENV", "KERNEL_BOOTSTRAP_PYTHON",
                      "KERNEL_BOOTSTRAP_SNAPSHOTS", "KERNEL_BOOTSTRAP_UV",
                      "KERNEL_BOOTSTRAP_BUILD_CACHE", "KERNEL_BOOTSTRAP_BATCH_BUILDS",
                      "KERNEL_BOOTSTRAP_SNAPSHOT_TIMEOUT", "KERNEL_BOOTSTRAP_OFFLINE")
_CREDENTIALS: Final = re.compile(r"://[^/@\s]*@")  # user:token@ in a URL


class KernelSpec(TypedDict):
    argv: list[str]
    display_name: str
    language: str
    metadata: dict[str, Any]
    env: NotRequired[dict[str, str]]  # only what the gate needs (CARRIED_ENV)


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


def spec_for(python: Path, name: str, display_name: str | None, config: Config, *,
             direct: bool = False, provisioner: bool = False) -> KernelSpec:
    """The spec: through ``kernel-bootstrap run`` (the gate), or with ``direct`` the venv's
    interpreter alone; ``provisioner``: started by ours (:data:`PROVISIONER`), the gate's argv
    its fallback."""
    spec: KernelSpec = {
        "argv": [str(python), *LAUNCHER] if direct else kernel_argv(config),
        "display_name": display_name or f"Python ({name})",
        "language": "python",
        "metadata": {"kernel_bootstrap": {
            "config": str(config.path) if config.path else None,
            "venv": str(config.venv),
        }},
    }
    if provisioner:
        spec["metadata"]["kernel_provisioner"] = {"provisioner_name": PROVISIONER}
    env = {} if direct else carried_env()
    if env:
        spec["env"] = env
    return spec


def provisioner_installed() -> bool:
    """Whether jupyter_client, in this interpreter, would find :data:`PROVISIONER`."""
    from importlib.metadata import entry_points

    return any(e.name == PROVISIONER for e in entry_points(group=PROVISIONERS))


def gate_argv(config: Config) -> list[str]:
    """``[<this kernel-bootstrap>, "run", "--config", <config>, "--", *LAUNCHER]``."""
    if config.path is None:
        raise ConfigError("a kernelspec through `kernel-bootstrap run` needs a config file; "
                          "pass --config PATH, or --direct for one without the gate")
    return [*self_command(), "run", "--config", str(config.path), "--", *LAUNCHER]


# What the kernelspec's interpreter runs (``-I -S -c``; argv[1] the directory holding this
# ``bootstrap``, the gate argv after it): ``bootstrap.cli.lean_run``, or the gate argv itself
# when that cannot be imported (the tool moved, or an older one has no lean_run). No braces:
# jupyter_client substitutes ``{name}`` in every argument.
LEAN_CODE: Final = ("import sys;a=sys.argv\n"
                    "try:sys.path.append(a[1]);from bootstrap.cli import lean_run as r\n"
                    "except Exception:import os;os.execv(a[2],a[2:])\n"
                    "r(a[2:])")


def lean_argv(config: Config) -> list[str]:
    """``[<this interpreter>, "-I", "-S", "-c", LEAN_CODE, <dir of bootstrap>, *gate_argv]``:
    the gate without the console script's start-up (site, its imports); the gate argv alone when
    this interpreter is unknown."""
    gate = gate_argv(config)
    if not sys.executable:
        return gate
    return [sys.executable, "-I", "-S", "-c", LEAN_CODE, package_parent(), *gate]


def kernel_argv(config: Config) -> list[str]:
    """The gate's kernelspec argv: ``[<native stand-in>, <venv>, <config>, *lean_argv]`` where
    this install ships the native stand-in (native/standin.c: it asks the venv's server itself
    and execs the rest, the lean argv, for anything else), else :func:`lean_argv`."""
    lean = lean_argv(config)
    native = native_standin()
    if native is None or config.path is None:
        return lean
    return [native, str(config.venv), str(config.path), *lean]


def native_standin() -> str | None:
    """The native stand-in beside this package (a wheel built where a C compiler was: see
    hatch_build.py), if there is one to run: Linux only, as the kernel server."""
    path = os.path.join(package_parent(), "bootstrap", "kernels", NATIVE_STANDIN)
    if not sys.platform.startswith("linux") or not _executable(path):
        return None
    return path


def package_parent() -> str:
    """The directory this ``bootstrap`` package was imported from (site-packages, or the
    checkout of an editable install): what the lean entry puts on its path."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def self_command() -> list[str]:
    """How to start this kernel-bootstrap again from anywhere: the console script that is
    running, by absolute path (not resolved: a symlink on PATH stays valid across upgrades);
    else the one installed beside this interpreter; else (a checkout, ``python -m bootstrap``)
    this interpreter with ``-m bootstrap``."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(script).startswith("kernel-bootstrap") and _executable(script):
        return [script]
    beside = os.path.join(os.path.dirname(sys.executable),
                          "kernel-bootstrap.exe" if sys.platform == "win32" else
                          "kernel-bootstrap")
    if _executable(beside):
        return [beside]
    return [sys.executable, "-m", "bootstrap"]


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def carried_env() -> dict[str, str]:
    """The overrides of :data:`CARRIED_ENV` that are set, minus any value with credentials."""
    from bootstrap.primitives import log
    env = {}
    for key in CARRIED_ENV:
        value = os.environ.get(key)
        if not value:
            continue
        if _CREDENTIALS.search(value):
            log.warning(f"{key} holds credentials; not written into the kernelspec", key=key)
            continue
        env[key] = value
    return env


def install_spec(kernels: Path, name: str, spec: KernelSpec) -> Path:
    """Write ``kernels/name/kernel.json``, replacing any earlier spec of that name atomically."""
    target = kernels / name
    kernels.mkdir(parents=True, exist_ok=True)
    site = _site(kernels, name)
    _recover(site, target)
    staged = temp_name(kernels.parent / f"kernelspec-{name}", "stage")
    with removed_on_failure(staged):
        staged.mkdir()
        blob = json.dumps(spec, indent=1).encode() + b"\n"
        write_file(staged / SPEC_FILE, blob, exclusive=True, sync=True)
        fsync_dir(staged)
        swap.swap_in(site, staged, target)
    fsync_dir(kernels)
    return target


def _site(kernels: Path, name: str) -> swap.Site:
    # Staging, the outgoing spec and the journal live beside kernels/ (Jupyter lists every
    # directory inside it), in a directory shared with other data: a journal may only name
    # our own ".kernelspec-<name>." siblings. No lock guards installs, so a journal whose
    # writer is still running is left to it.
    base = kernels.parent / f"kernelspec-{name}"
    return swap.Site(
        live_dir=kernels, staging_dir=kernels.parent, aside_dir=kernels.parent,
        noun="the new kernelspec", journal=lambda _: _journal(base),
        aside=lambda _: temp_name(base, "old"), retire=remove_quietly,
        complete=lambda staged: (staged / SPEC_FILE).is_file(),
        prefix=f".{base.name}.", unlocked=True)


def _journal(base: Path) -> Path:
    return base.with_name(f".{base.name}.swap")


def _recover(site: swap.Site, target: Path) -> None:
    """Finish (or undo) a swap a kill interrupted, and remove what dead installs left."""
    swap.recover(site, target)
    journal = site.journal(target)
    kinds = ((f"{site.prefix}stage-", "stage"), (f"{site.prefix}old-", "old"),
             (f".{journal.name}.tmp-", "tmp"))
    for path in site.staging_dir.iterdir():
        tags = [tag for start, tag in kinds if path.name.startswith(start)]
        if tags and not pid_alive(owner_pid(path.name, tags[0])):
            remove_quietly(path)
