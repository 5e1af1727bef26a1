"""Exact skill sets in a skill root: the record of what publish put there, and pruning by it.

Agent harnesses leave the skills of earlier runs in a skill directory forever ("skills dir never
cleared"): publish only added or replaced. ``publish --prune`` removes every skill that this
tool published into ROOT earlier and that is not in the set any more, and nothing else: a
directory made by hand or by another tool stays, with a note. Which is which is decided from the
tool's own record, ``.<ROOT>.kb-publish/published.json`` (name -> the device and inode of the
tree publish swapped in), never from what ROOT looks like. A tree replaced since (another inode)
is no longer ours either.

Each removal is one ``rename`` of ``ROOT/<name>`` into publish's ``retired/`` (same file system):
a reader sees the whole tree or nothing, never a part, and one that opened it keeps reading it
for the grace period, as after a replace. The record is rewritten after the renames; a prune
killed in between leaves names whose trees are gone, which the next prune drops.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bootstrap.primitives import log
from bootstrap.primitives.atomic import write_atomic
from bootstrap.primitives.fs import read_state_file
from bootstrap.trees.skillmd import unsafe_name

RECORD: Final = "published.json"
SCHEMA: Final = 1
Owned = dict[str, tuple[int, int]]  # name -> (st_dev, st_ino) of the tree we put there


@dataclass(frozen=True)
class Pruned:
    """What a prune did: skills ``removed``, and entries ``kept`` that were not ours."""

    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


def read_record(base: Path) -> Owned:
    """The record in the publish state directory ``base``; {} when absent or unusable (a
    warning: with no record, prune removes nothing)."""
    path = base / RECORD
    try:
        data: Any = json.loads(read_state_file(path))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:
        log.warning("ignoring an unreadable record of published skills; --prune removes only "
                    "what it finds recorded", path=str(path), error=str(e))
        return {}
    owned = _parse(data)
    if owned is None:
        log.warning("ignoring a malformed record of published skills; --prune removes only "
                    "what it finds recorded", path=str(path))
        return {}
    return owned


def _parse(data: Any) -> Owned | None:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    skills = data.get("skills")
    if not isinstance(skills, dict):
        return None
    owned: Owned = {}
    for name, where in skills.items():
        ok = (isinstance(name, str) and unsafe_name(name) is None and isinstance(where, list)
              and len(where) == 2 and all(type(n) is int and n >= 0 for n in where))
        if not ok:
            return None
        owned[name] = (where[0], where[1])
    return owned


def _write(base: Path, owned: Owned) -> None:
    body = {"schema": SCHEMA, "skills": {n: list(owned[n]) for n in sorted(owned)}}
    try:
        write_atomic(base / RECORD, json.dumps(body).encode())
    except OSError as e:
        # The skills are in place; only a later --prune is affected, and it errs on the safe
        # side: what it cannot find recorded, it keeps.
        log.warning("could not update the record of published skills; a later --prune keeps "
                    "what it does not find in it", path=str(base / RECORD), error=str(e))


def remember(base: Path, root: Path, names: Iterable[str]) -> None:
    """Record ``ROOT/<name>`` for each of ``names`` as put there by us (after the swap: a
    session killed before this leaves a tree unrecorded, which prune then keeps)."""
    owned = read_record(base)
    before = dict(owned)
    for name in names:
        try:
            st = os.lstat(root / name)
        except OSError:
            continue
        owned[name] = (st.st_dev, st.st_ino)
    if owned != before:
        _write(base, owned)


def prune(base: Path, root: Path, keep: Collection[str],
          retire: Callable[[str], Path]) -> Pruned:
    """Remove from ``root`` every skill the record says we put there and ``keep`` does not
    name; ``retire(name)`` gives the path each is renamed to. Called under the publish lock."""
    owned = read_record(base)
    removed: list[str] = []
    kept: list[str] = []
    for name in _entries(root):
        if name in keep:
            continue
        if _ours(root / name, owned.get(name)):
            os.rename(root / name, retire(name))
            removed.append(name)
            log.info("pruned a skill no longer in the set", skill=name, path=str(root / name))
        else:
            kept.append(name)
            why = ("replaced since kernel-bootstrap published it" if name in owned
                   else "not put there by kernel-bootstrap")
            log.info(f"kept {root / name}: {why}", path=str(root / name))
    # Only what is still there and ours stays recorded: a name whose tree is gone (removed now,
    # by a prune killed before this write, or by hand) or was replaced is dropped.
    still = {n: w for n, w in owned.items() if n not in removed and _ours(root / n, w)}
    if still != owned:
        _write(base, still)
    return Pruned(tuple(removed), tuple(kept))


def _entries(root: Path) -> list[str]:
    # Hidden entries are never skills we publish (names cannot start with a dot).
    return sorted(n for n in os.listdir(root) if not n.startswith("."))


def _ours(path: Path, where: tuple[int, int] | None) -> bool:
    if where is None:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == where
