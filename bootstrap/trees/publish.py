"""Atomic publish of skill trees into a skill root that agents are reading.

The incident: publishers that wrote in place (``rm -rf``, ``mkdir``, file by file) let an agent
see a skill directory without ``SKILL.md``; it silently degraded. So ``ROOT/<name>`` must always
name one complete tree:

1. validate every source and hash it before anything is written;
2. copy each changed tree into a staging directory beside ROOT (same file system, never inside
   ROOT: agents scan dot-directories too), fsync it;
3. swap it in with ``renameat2(RENAME_EXCHANGE)``, so there is no instant without a tree; where
   that is unavailable, rename the old tree aside and the new one in, under a journal that the
   next run uses to finish or undo an interrupted swap;
4. keep the outgoing tree for ``grace`` seconds (a reader may still be walking it), then reap it.

State lives beside ROOT, in ``.<ROOT name>.kb-publish/``: ``lock`` (never deleted),
``staging/<pid>-<token>/`` (reaped once the pid is gone), ``retired/<ns>-<pid>-<token>/``
(reaped after the grace), ``journal/<name>.json`` (see :mod:`bootstrap.primitives.swap`),
``hashes/<name>.json`` (see :mod:`bootstrap.trees.published`) and ``published.json``, the
record of what publish put into ROOT (see :mod:`bootstrap.trees.prune`). Others can write
beside ROOT, so
each of these must be a real directory: a symlink planted there is refused, never followed
(one to a victim directory once had publish delete its subdirectories).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

from bootstrap.errors import BootstrapError, ConfigError, SkillError
from bootstrap.primitives import lock, log, swap
from bootstrap.primitives.atomic import DiskError
from bootstrap.primitives.fs import (
    fsync_dir,
    is_real_dir,
    owned_token,
    owner_pid,
    pid_alive,
    remove_tree,
    removed_on_exit,
)
from bootstrap.trees.prune import Pruned, remember
from bootstrap.trees.prune import prune as prune_root
from bootstrap.trees.published import installed_hash
from bootstrap.trees.published import remember as remember_hash
from bootstrap.trees.skilltree import (
    SkillTree,
    check_collisions,
    copy_tree,
    load_skill_tree,
    tree_hash,
)

STATE_SUFFIX: Final = ".kb-publish"
_LOCK_ADVICE: Final = "If {who} is stuck, stop it ({stop}); otherwise publish again later."


@dataclass(frozen=True)
class PublishResult:
    name: str
    path: Path  # ROOT/<name>
    hash: str  # tree_hash of what is published there now
    changed: bool
    method: str  # "exchange" | "rename-aside" | "rename" | "unchanged"


class _State(NamedTuple):
    root: Path
    base: Path
    staging: Path
    retired: Path
    journal: Path
    hashes: Path
    lock: Path


def _state(root: Path) -> _State:
    base = state_dir(root)
    return _State(root, base,
                  *(base / n for n in ("staging", "retired", "journal", "hashes", "lock")))


def state_dir(root: Path) -> Path:
    """Where publish keeps its lock, staging and retired trees for ``root`` (beside it)."""
    return root.parent / f".{root.name}{STATE_SUFFIX}"


class Published(NamedTuple):
    results: list[PublishResult]
    pruned: Pruned  # empty unless asked to prune


def publish(
    sources: Sequence[Path], into: Path, grace: float = 30.0, *, lock_timeout: float = 600.0
) -> list[PublishResult]:
    """Publish each skill directory in ``sources`` as ``into/<name>``, atomically.

    Raises SkillError (nothing written) for an invalid source, BootstrapError when a copy
    fails (the previously published tree is left as it was).
    """
    root = _check_root(into)
    return publish_trees([load_skill_tree(src) for src in sources], root, grace,
                         lock_timeout=lock_timeout).results


def publish_set(
    sources: Sequence[Path], into: Path, grace: float = 30.0, *, lock_timeout: float = 600.0,
    prune: bool = False,
) -> Published:
    """:func:`publish`; with ``prune``, then remove from ``into`` every skill this tool
    published there that ``sources`` no longer has (``publish --prune``, :mod:`prune`).
    """
    root = _check_root(into)
    return publish_trees([load_skill_tree(src) for src in sources], root, grace,
                         lock_timeout=lock_timeout, prune=prune)


def publish_trees(
    trees: Sequence[SkillTree], into: Path, grace: float = 30.0, *, lock_timeout: float = 600.0,
    prune: bool = False,
) -> Published:
    """:func:`publish_set` for trees already loaded with
    :func:`load_skill_tree` (used by push)."""
    root = _check_root(into)
    check_collisions(trees)
    hashes = [tree_hash(tree) for tree in trees]
    # Validation is over: from here on we write.
    root.mkdir(parents=True, exist_ok=True)
    state = _state(root)
    _checked_state(state, create=True)
    if os.stat(root).st_dev != os.stat(state.base).st_dev:
        raise BootstrapError(
            f"{root} is a mount point: publish stages beside it, in {state.base}, which must be "
            "on the same file system; publish into a directory inside the mount instead"
        )
    with _locked(state, lock_timeout):
        _tidy(state, grace)
        results = [_publish_one(state, t, h) for t, h in zip(trees, hashes, strict=True)]
        remember(state.base, root, {r.name: r.hash for r in results})
        pruned = (prune_root(state.base, root, {r.name for r in results},
                             lambda name: _retired_slot(state, name)) if prune else Pruned())
        _tidy(state, grace)
    return Published(results, pruned)


def gc_publish_state(root: Path, grace: float, *, lock_timeout: float = 600.0) -> list[Path]:
    """Finish interrupted swaps, remove dead staging and trees retired over ``grace`` s ago."""
    state = _state(root.resolve())
    if not os.path.lexists(state.base):
        return []
    _checked_state(state, create=False)
    with _locked(state, lock_timeout):
        return _tidy(state, grace)


def _check_root(into: Path) -> Path:
    root = into.resolve()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root}: --into must be a directory")
    if root.parent == root:
        raise ConfigError(f"{root}: cannot publish into the file system root")
    return root


def _checked_state(state: _State, *, create: bool) -> None:
    """Make (or find) the state directories, each a real directory of its own.

    Checked one level at a time before the next is made, so nothing is ever created, removed
    or chmod'ed through a planted link.
    """
    for d in (state.base, state.staging, state.retired, state.journal, state.hashes):
        if create:
            with suppress(FileExistsError):
                d.mkdir()
        elif not os.path.lexists(d):
            continue
        if not is_real_dir(d):
            kind = "a symbolic link" if os.path.islink(d) else "not a directory"
            raise BootstrapError(
                f"{d} is {kind}: publish keeps its own state there and will not follow or "
                f"replace it; remove it (everything in {state.base} is publish's own) and "
                "run the command again"
            )


def _locked(state: _State, timeout: float) -> AbstractContextManager[None]:
    return lock.hold(state.lock, timeout, purpose="publish",
                     name=f"the publish lock of {state.root}", advice=_LOCK_ADVICE)


def _publish_one(state: _State, tree: SkillTree, new_hash: str) -> PublishResult:
    live = state.root / tree.name
    if installed_hash(state.hashes, live) == new_hash:
        return PublishResult(tree.name, live, new_hash, changed=False, method="unchanged")
    container = state.staging / owned_token()
    with removed_on_exit(container):
        staged = _stage(tree, new_hash, container)
        try:
            method = swap.swap_in(_site(state), staged, live)
        except OSError as e:
            raise _swap_failed(tree.name, live, e) from e
    remember_hash(state.hashes, live, new_hash, tree)
    log.debug("published", name=tree.name, path=str(live), swap=method)
    return PublishResult(tree.name, live, new_hash, changed=True, method=method)


def _stage(tree: SkillTree, expected: str, container: Path) -> Path:
    """A complete, fsynced copy of ``tree`` at ``container/<name>``."""
    staged = container / tree.name
    try:
        container.mkdir(mode=0o700)
        copied = copy_tree(tree, staged)
        fsync_dir(container)
    except OSError as e:
        raise BootstrapError(
            f"could not copy skill {tree.name!r} from {tree.root}: {e}; the published tree "
            "was left as it was"
        ) from e
    if copied != expected:
        raise SkillError(f"{tree.root}: skill {tree.name!r} changed while it was being "
                         "published; publish again")
    return staged


# --- the swap ----------------------------------------------------------------------------------


def _site(state: _State) -> swap.Site:
    # The outgoing tree stays in retired/ for the grace period (a reader may still be walking
    # it). A ^C between the renames finishes the swap: the staged tree is always complete.
    return swap.Site(
        live_dir=state.root, staging_dir=state.staging, aside_dir=state.retired,
        noun="the new skill tree", journal=lambda live: state.journal / f"{live.name}.json",
        aside=lambda live: _retired_slot(state, live.name), finish_on_interrupt=True)


def _retired_slot(state: _State, name: str) -> Path:
    container = state.retired / f"{time.time_ns()}-{owned_token()}"
    container.mkdir()
    return container / name


def _swap_failed(name: str, live: Path, e: OSError) -> DiskError:
    what = f"could not swap the new tree of skill {name!r} into {live}: {e.strerror or e}"
    if os.path.lexists(live):
        return DiskError(f"{what}; the published tree was left as it was", e)
    return DiskError(f"{what}; run publish again (or `kernel-bootstrap gc`) to finish or undo "
                     "the swap", e)


# --- recovery and reaping ----------------------------------------------------------------------


def _tidy(state: _State, grace: float) -> list[Path]:
    """Called with the lock held, so no journal or staging here belongs to a running publish
    of ours; staging of a live pid is still left alone (it may be a process we don't know)."""
    return [*_recover_journals(state), *_reap_staging(state), *_reap_retired(state, grace),
            *_reap_temp_files(state)]


def _recover_journals(state: _State) -> list[Path]:
    done: list[Path] = []
    site = _site(state)
    for path in _children(state.journal):
        name = path.name.removesuffix(".json")
        if name == path.name or name in ("", ".", "..") or ".tmp-" in path.name:
            continue  # not a journal: write_atomic's temp files are reaped with the others
        swap.recover(site, state.root / name)
        if not os.path.lexists(path):
            done.append(path)
    return done


def _reap_staging(state: _State) -> list[Path]:
    # Containers are named "<pid>-<token>": the pid of the publish that made them.
    dead = [p for p in _children(state.staging) if not pid_alive(owner_pid(p.name))]
    return [p for p in dead if _removed(p)]


def _reap_retired(state: _State, grace: float) -> list[Path]:
    now = time.time_ns()
    expired = []
    for p in _children(state.retired):
        stamp = p.name.split("-", 1)[0]
        if not stamp.isdigit() or now - int(stamp) >= grace * 1e9:
            expired.append(p)
    return [p for p in expired if _removed(p)]


def _reap_temp_files(state: _State) -> list[Path]:
    """Temp files of journals, hash records and the record of published skills whose writer
    was killed mid-write."""
    found = [p for d in (state.base, state.journal, state.hashes) for p in _children(d)
             if ".tmp-" in p.name and not pid_alive(owner_pid(p.name, "tmp"))]
    return [p for p in found if _removed(p)]


def _children(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _removed(path: Path) -> bool:
    """Remove a leftover (a link is unlinked, never followed); failing to is a warning."""
    try:
        remove_tree(path)
    except OSError as e:
        log.warning("could not remove a publish leftover", path=str(path), error=str(e))
        return False
    return True
