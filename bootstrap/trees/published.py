"""The installed-hash records of publish: ``.<ROOT>.kb-publish/hashes/<name>.json``.

A record holds the tree hash of what ``ROOT/<name>`` holds, with the inode and a digest of the
tree's metadata that vouch for it, so a publish of unchanged content does not re-read the
installed tree. A record is a cache: reading it never fails a publish (a record that is not a
regular file we wrote, or is malformed, is ignored), and neither does failing to write one.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Final, TypedDict, cast

from bootstrap.errors import SkillError
from bootstrap.primitives import log
from bootstrap.primitives.atomic import write_atomic
from bootstrap.primitives.fs import read_state_file
from bootstrap.trees.skilltree import SkillTree, load_skill_tree, tree_hash

SCHEMA: Final = 1


class HashRecord(TypedDict):
    schema: int
    hash: str
    ino: int
    signature: str


def installed_hash(hashes: Path, live: Path) -> str | None:
    """The tree hash of what ``live`` holds now; None when absent or not a valid skill."""
    try:
        st = os.lstat(live)
        if not stat.S_ISDIR(st.st_mode):
            return None
        tree = load_skill_tree(live, spec=False)
        record = _read(hashes / f"{tree.name}.json")
        signature = _signature(tree)
        if record and record["ino"] == st.st_ino and record["signature"] == signature:
            return record["hash"]
        digest = tree_hash(tree)
    except (OSError, SkillError):
        return None
    _write(hashes / f"{tree.name}.json",
           {"schema": SCHEMA, "hash": digest, "ino": st.st_ino, "signature": signature})
    return digest


def remember(hashes: Path, live: Path, digest: str, tree: SkillTree) -> None:
    """Record the hash of the tree just published, with the metadata that vouches for it.

    The copy keeps every field the signature covers, so the source's signature is the live
    tree's (walking the live tree again would hold a second list of every entry). Where a file
    system rounds mtimes, the record just never matches and the next publish hashes the tree.
    """
    try:
        record: HashRecord = {"schema": SCHEMA, "hash": digest, "ino": os.lstat(live).st_ino,
                              "signature": _signature(tree)}
    except OSError as e:
        # Someone changed it already; the next publish simply hashes it again.
        log.debug("not recording the published hash", path=str(live), error=str(e))
        return
    try:
        _write(hashes / f"{live.name}.json", record)
    except OSError as e:
        # The tree is published; a stale record never matches the new tree's inode, so a
        # full disk here must not fail a publish that has already happened.
        log.warning("published, but could not record its hash; the next publish re-hashes it",
                    path=str(live), error=str(e))


def recorded_hash(hashes: Path, name: str, ino: int) -> str | None:
    """The hash last recorded for ``ROOT/<name>`` when it was inode ``ino``; None without one.

    For a record of published skills written before it held hashes (prune.py's schema 1): a
    skill out of the set was last hashed when it was last published, so this is the hash of the
    tree publish put there.
    """
    record = _read(hashes / f"{name}.json")
    return record["hash"] if record is not None and record["ino"] == ino else None


def _signature(tree: SkillTree) -> str:
    """A digest of the tree's metadata (no content): if it still matches, the content hash does.

    Like git's index: a file rewritten in place keeping its size and mtime would go unnoticed.
    """
    h = hashlib.sha256()
    for e in tree.entries:
        h.update(repr((e.rel, e.kind, e.mode, e.size, e.mtime_ns, e.target)).encode())
    return h.hexdigest()


def _read(path: Path) -> HashRecord | None:
    try:
        data: Any = json.loads(read_state_file(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        log.warning("ignoring unreadable publish hash record", path=str(path), error=str(e))
        return None
    ok = (isinstance(data, dict) and data.get("schema") == SCHEMA
          and isinstance(data.get("hash"), str) and isinstance(data.get("signature"), str)
          and isinstance(data.get("ino"), int))
    return cast(HashRecord, data) if ok else None


def _write(path: Path, record: HashRecord) -> None:
    # A crash leaves the old record or the new one, never half of one; the replace swaps the
    # name, so a link planted at it is replaced, never written through.
    write_atomic(path, json.dumps(record).encode())
