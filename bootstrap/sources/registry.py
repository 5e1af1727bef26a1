"""The skills locks this machine has used: what ``gc`` may not prune from the git cache.

``gc`` keeps every cached repository and tree that a skills lock names, but it can only read
the locks it knows of: each ``lock``, ``ensure``, ``run`` and ``publish``/``push`` of a config
with git sources records its lock's path here, one small file per lock
(``<user cache>/git/skills-locks/<sha256(path)[:32]>``, holding the path), so that two
processes never rewrite one shared list. A lock file that no longer exists is forgotten by
``gc``. The files are ours but read as untrusted (bounded, no symlink followed).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Final

_DIR: Final = "skills-locks"
_LIMIT: Final = 64 * 1024


def directory() -> Path:
    from bootstrap.sources.fetch import root

    return root() / _DIR


def remember_for(sources: tuple[object, ...], lock: Path | None) -> None:
    """:func:`remember` the skills lock of a config with git sources (the commands call it,
    never the warm path)."""
    if sources and lock is not None:
        remember(lock)


def remember(lock: Path) -> None:
    """Record ``lock`` (absolute); at most one stat when it is recorded already. Never fails
    the caller: without the record, gc only keeps less (what is unused for 30 days)."""
    text = os.path.abspath(lock)
    entry = directory() / hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    if os.path.isfile(entry):
        return
    from bootstrap.places import make_dir
    from bootstrap.primitives.atomic import write_atomic

    with contextlib.suppress(OSError):
        make_dir(entry.parent)
        write_atomic(entry, text.encode("utf-8"), durable=False)


def known() -> list[tuple[Path, Path]]:
    """(registry entry, lock path) for each lock recorded."""
    from bootstrap.primitives.fs import read_state_file

    out: list[tuple[Path, Path]] = []
    try:
        names = sorted(os.listdir(directory()))
    except OSError:
        return out
    for name in names:
        entry = directory() / name
        try:
            text = read_state_file(entry, _LIMIT).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if os.path.isabs(text) and "\0" not in text:
            out.append((entry, Path(text)))
    return out
