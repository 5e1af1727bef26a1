"""``kernel-bootstrap init [--config PATH] [--force]``: write a commented starter config."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from bootstrap.config_file import DEFAULT_FILE, PYPROJECT, TABLE
from bootstrap.errors import EXIT_OK, ConfigError

# Every key with its default, commented; `status` accepts the file as written (a test holds it).
STARTER: Final = """\
# kernel-bootstrap configuration. Relative paths are relative to this file.
# `kernel-bootstrap ensure` builds the venv and installs the skills; `status` says what is missing.

# The runtime: PEP 508 requirements installed when the venv is built. ipykernel lets
# `kernel-bootstrap kernelspec install` register the venv with Jupyter.
requirements = ["ipykernel"]

# Skill directories (each holds a SKILL.md; with a pyproject.toml it is a Python skill that is
# installed into the venv). Globs are allowed; a glob whose directory does not exist is an error.
# skills = ["skills/*"]
# An entry may also be a git source, pinned in skills-lock.toml (https, ssh, git or file URLs;
# at most one of branch, tag, rev; subdirectory is a path or a glob in the repository):
# skills = ["skills/*", { git = "https://github.com/anthropics/skills", subdirectory = "skills/*" }]

# Where `ensure` pins git sources (commit and tree sha256). Default: beside this file.
# skills-lock = "skills-lock.toml"

# Seconds a git server may send nothing before its source counts as unreachable (what is
# installed stays); raise it for a slow link. And file:// repositories owned by another user
# that git may read (git runs without your git config, so its safe.directory is not read).
# git-timeout = 15
# git-safe-directories = ["/srv/git/tools"]

# The interpreter for the venv: a version ("3.12") or a path.
# Default: the interpreter running kernel-bootstrap.
# python = "3.12"

# Where the venv lives; its path never changes across rebuilds ($KERNEL_BOOTSTRAP_VENV wins).
# Default: a venv of this file's own in the user data directory
# (kernel-bootstrap/venvs/<directory>-<hash>; `kernel-bootstrap status` shows it).
# venv = ".kernel-venv"

# A constraints file for every install; its digest is part of the runtime identity.
# constraints = "constraints.txt"

# Extra arguments for every `uv pip install`.
# uv-args = ["--exclude-newer", "2025-01-01"]

# Python code that must run cleanly in a new venv before it replaces the old one.
# ready-check = "import ipykernel"

# A store of prebuilt environments (a directory, or s3://BUCKET/PREFIX with the `cloud` extra).
# snapshots = "/shared/kernel-bootstrap-snapshots"

# Pin the runtime: `kernel-bootstrap lock` writes this file (pins with hashes) and `ensure`
# then installs exactly it, refusing a lock made from other requirements.
# lock = "requirements.lock"

# Never contact a package index: everything comes from uv's cache, the build cache and the
# snapshots (KERNEL_BOOTSTRAP_OFFLINE=1 or UV_OFFLINE=1 mean the same). Without it, an index
# that cannot be reached makes a session use the caches alone, with a warning.
# offline = true

# Install the runtime and skills with bytecode compiled, so that no kernel start recompiles
# them (with PYTHONDONTWRITEBYTECODE=1, as in many images, every start would). `false` makes
# a build faster and the venv smaller; turning it back on compiles what is installed.
# compile-bytecode = true

# Kernels ready, not just the venv (Linux): a kernel server per venv generation imports
# ipykernel (and these modules) once and forks each later kernel from it. `false` (or
# KERNEL_BOOTSTRAP_KERNEL_SERVER=0) starts every kernel the ordinary way. It exits after
# kernel-idle-timeout seconds without a request and a running kernel, and gives up when its
# imports take longer than kernel-preload-timeout seconds. It keeps kernel-spares kernels
# prepared before they are asked for (each a kernel's memory while it waits; 0: none).
# kernel-server = true
# kernel-preload = ["numpy", "pandas"]
# kernel-idle-timeout = 900
# kernel-preload-timeout = 60
# kernel-spares = 1
"""


def init(config_path: Path | None, *, force: bool) -> int:
    """Write :data:`STARTER` to ``config_path`` (default ``./kernel-bootstrap.toml``); an
    existing file is an error (exit 2) unless ``force``."""
    from bootstrap.primitives.atomic import write_atomic

    path = config_path if config_path is not None else Path(DEFAULT_FILE)
    if path.name == PYPROJECT:
        raise ConfigError(f"init writes a {DEFAULT_FILE}; to configure through {path}, add a "
                          f"[{TABLE}] table to it with the same keys")
    # lexists: a dangling symlink is something there too, not a free name.
    if os.path.lexists(path) and not force:
        raise ConfigError(f"{path} already exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, STARTER.encode("utf-8"))
    print(f"wrote {path}")
    return EXIT_OK
