"""The skills locks this machine has used: what ``gc`` may not prune from the git cache.

``gc`` keeps every cached repository and tree that a skills lock names, but it can only read
the locks it knows of: each ``lock``, ``ensure``, ``run`` and ``publish``/``push`` of a config
with git sources records its lock's path here, one small file per lock
(``<user cache>/git/skills-locks/<sha256(path)[:32]>``, holding the path), so that two
processes never rewrite one shared list. A lock file that no longer exists is forgotten by
``gc``. The venvs of those configs are recorded alike (``skills-venvs/``): between ``lock
--upgrade`` and the next ``ensure`` no lock names the tree a venv's editable still uses, and
gc keeps what any of their generations uses. The files are ours but read as untrusted
(bounded, no symlink followed).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Final

_DIR: Final = "skills-locks"
# The venvs of configs with git sources: gc keeps every tree their generations' editables use.
_VENVS: Final = "skills-venvs"
_LIMIT: Final = 64 * 1024


def directory(kind: str = _DIR) -> Path:
    from bootstrap.sources.paths import root

    return root() / kind


def remember_for(sources: tuple[object, ...], lock: Path | None,
                 venv: Path | None = None) -> None:
    """:func:`remember` the skills lock and the venv of a config with git sources (the
    commands call it, never the warm path)."""
    if sources and lock is not None:
        remember(lock)
    if sources and venv is not None:
        remember(venv, _VENVS)


def remember(path: Path, kind: str = _DIR) -> None:
    """Record ``path`` (absolute; a lock, or a venv); at most one stat when it is recorded
    already. Never fails the caller: without the record, gc only keeps less (what is unused
    for 30 days)."""
    text = os.path.abspath(path)
    entry = directory(kind) / hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    if os.path.isfile(entry):
        return
    from bootstrap.places import make_dir
    from bootstrap.primitives.atomic import write_atomic

    with contextlib.suppress(OSError):
        make_dir(entry.parent)
        write_atomic(entry, text.encode("utf-8"), durable=False)


def known(kind: str = _DIR) -> list[tuple[Path, Path]]:
    """(registry entry, path) for each lock recorded (``kind``: or each venv)."""
    from bootstrap.primitives.fs import read_state_file

    out: list[tuple[Path, Path]] = []
    try:
        names = sorted(os.listdir(directory(kind)))
    except OSError:
        return out
    for name in names:
        entry = directory(kind) / name
        try:
            text = read_state_file(entry, _LIMIT).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if os.path.isabs(text) and "\0" not in text:
            out.append((entry, Path(text)))
    return out


def known_venvs() -> list[tuple[Path, Path]]:
    """(registry entry, venv path) for each venv of a config with git sources."""
    return known(_VENVS)
