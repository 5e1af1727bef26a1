"""Exact skill sets in a skill root: the record of what publish put there, and pruning by it.

Agent harnesses leave the skills of earlier runs in a skill directory forever ("skills dir never
cleared"): publish only added or replaced. ``publish --prune`` removes every skill that this
tool published into ROOT earlier and that is not in the set any more, and nothing else: a
directory made by hand or by another tool stays, with a note. Which is which is decided from the
tool's own record, ``.<ROOT>.kb-publish/published.json`` (name -> the device, inode and tree hash
of the tree publish swapped in), never from what ROOT looks like. A tree replaced since (another
inode) or changed since (another hash) is no longer ours either.

Why the hash and not the inode alone: ``rm -rf ROOT/x; mkdir ROOT/x`` often gets the freed
inode back (ext4, tmpfs), and a prune once deleted the files a person had just put there. A
timestamp would not do (birth times are not in ``os.stat`` on Linux, ctimes are coarse on some
file systems and move with clock steps), nor would a marker file (agents would read it in the
skill, and ``cp -a`` copies it). The hash says exactly what matters: removing the tree loses
nothing that is not what publish put there, and a tree a person edited in place stays.

Each removal is one ``rename`` of ``ROOT/<name>`` into publish's ``retired/`` (same file system):
a reader sees the whole tree or nothing, never a part, and one that opened it keeps reading it
for the grace period, as after a replace. The record is rewritten after the renames; a prune
killed in between leaves names whose trees are gone, which the next prune drops.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

from bootstrap.errors import SkillError
from bootstrap.primitives import log
from bootstrap.primitives.atomic import write_atomic
from bootstrap.primitives.fs import read_state_file
from bootstrap.trees.published import recorded_hash
from bootstrap.trees.skillmd import unsafe_name
from bootstrap.trees.skilltree import is_tree_hash, load_skill_tree, tree_hash

RECORD: Final = "published.json"
SCHEMA: Final = 2  # 1: name -> [dev, ino]; 2: name -> [dev, ino, tree hash]
# publish's installed-hash records (published.py), in the same state directory: where a
# schema-1 record's trees get the hash they were published with.
HASHES: Final = "hashes"
_REPLACED: Final = "replaced or changed since kernel-bootstrap published it"


class Mark(NamedTuple):
    """What ``ROOT/<name>`` was when publish put it there."""

    dev: int
    ino: int
    hash: str  # tree_hash


Owned = dict[str, Mark]


@dataclass(frozen=True)
class Pruned:
    """What a prune did: skills ``removed``, and entries ``kept`` that were not ours."""

    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


def read_record(base: Path) -> Owned:
    """The record in the publish state directory ``base``; {} when absent or unusable (a
    warning: with no record, prune removes nothing)."""
    return _load(base)[0]


def _load(base: Path) -> tuple[Owned, bool]:
    """:func:`read_record`, and whether it is in an earlier schema (rewritten in this one by
    the next write, even when nothing else changed)."""
    path = base / RECORD
    try:
        data: Any = json.loads(read_state_file(path))
    except FileNotFoundError:
        return {}, False
    except (OSError, ValueError, RecursionError) as e:
        log.warning("ignoring an unreadable record of published skills; --prune removes only "
                    "what it finds recorded", path=str(path), error=str(e))
        return {}, False
    owned = _parse(data, base / HASHES)
    if owned is None:
        log.warning("ignoring a malformed record of published skills; --prune removes only "
                    "what it finds recorded", path=str(path))
        return {}, False
    return owned, data["schema"] != SCHEMA


def _parse(data: Any, hashes: Path) -> Owned | None:
    schema = data.get("schema") if isinstance(data, dict) else None
    skills = data.get("skills") if type(schema) is int and schema in (1, SCHEMA) else None
    if not isinstance(skills, dict):
        return None
    current = schema == SCHEMA
    owned: Owned = {}
    for name, where in skills.items():
        if not (isinstance(name, str) and unsafe_name(name) is None and isinstance(where, list)
                and len(where) == (3 if current else 2)
                and all(type(n) is int and n >= 0 for n in where[:2])):
            return None
        digest = where[2] if current else recorded_hash(hashes, name, where[1])
        if current and not is_tree_hash(digest):
            return None
        if isinstance(digest, str):  # a schema-1 tree without a hash to vouch for it is kept
            owned[name] = Mark(where[0], where[1], digest)
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


def remember(base: Path, root: Path, published: Mapping[str, str]) -> None:
    """Record ``ROOT/<name>`` for each name -> tree hash of ``published`` as put there by us
    (after the swap: a session killed before this leaves a tree unrecorded, which prune then
    keeps)."""
    owned, old = _load(base)
    before = dict(owned)
    for name, digest in published.items():
        try:
            st = os.lstat(root / name)
        except OSError:
            continue
        owned[name] = Mark(st.st_dev, st.st_ino, digest)
    if owned != before or old:
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
            why = _REPLACED if name in owned else "not put there by kernel-bootstrap"
            log.info(f"kept {root / name}: {why}", path=str(root / name))
    # Only the set just put in place stays recorded: every other name was removed now, is no
    # longer ours (kept above), or its tree is gone (by a prune killed before this write, or by
    # hand).
    still = {n: m for n, m in owned.items() if n in keep}
    if still != owned:
        _write(base, still)
    return Pruned(tuple(removed), tuple(kept))


def _entries(root: Path) -> list[str]:
    # Hidden entries are never skills we publish (names cannot start with a dot).
    return sorted(n for n in os.listdir(root) if not n.startswith("."))


def _ours(path: Path, mark: Mark | None) -> bool:
    """Whether ``path`` is still the tree publish put there: the same inode, holding the same
    tree (hashed in full: only a tree about to be removed gets here)."""
    if mark is None:
        return False
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != (mark.dev, mark.ino):
            return False
        return tree_hash(load_skill_tree(path, spec=False)) == mark.hash
    except (OSError, SkillError):
        return False
