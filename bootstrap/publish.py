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
(reaped after the grace), ``journal/<name>.json``, and ``hashes/<name>.json`` (the installed
hash, so a no-op publish does not re-read the installed tree).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple, TypedDict, cast

from bootstrap import log
from bootstrap.atomic import DiskError, exchange, write_atomic
from bootstrap.errors import BootstrapError, ConfigError, LockTimeout, SkillError
from bootstrap.fs import fsync_dir
from bootstrap.skilltree import (
    SkillTree,
    check_collisions,
    copy_tree,
    load_skill_tree,
    tree_hash,
)

STATE_SUFFIX: Final = ".kb-publish"
SCHEMA: Final = 1


@dataclass(frozen=True)
class PublishResult:
    name: str
    path: Path  # ROOT/<name>
    hash: str  # tree_hash of what is published there now
    changed: bool
    method: str  # "exchange" | "rename-aside" | "rename" | "unchanged"


class _Journal(TypedDict):
    schema: int
    live: str
    aside: str
    staged: str


class _HashRecord(TypedDict):
    schema: int
    hash: str
    ino: int
    signature: str


class _State(NamedTuple):
    base: Path
    staging: Path
    retired: Path
    journal: Path
    hashes: Path
    lock: Path


def _state(root: Path) -> _State:
    base = state_dir(root)
    return _State(base, *(base / n for n in ("staging", "retired", "journal", "hashes", "lock")))


def state_dir(root: Path) -> Path:
    """Where publish keeps its lock, staging and retired trees for ``root`` (beside it)."""
    return root.parent / f".{root.name}{STATE_SUFFIX}"


def publish(
    sources: Sequence[Path], into: Path, grace: float = 30.0, *, lock_timeout: float = 600.0
) -> list[PublishResult]:
    """Publish each skill directory in ``sources`` as ``into/<name>``, atomically.

    Raises SkillError (nothing written) for an invalid source, BootstrapError when a copy
    fails (the previously published tree is left as it was).
    """
    root = _check_root(into)
    return publish_trees([load_skill_tree(src) for src in sources], root, grace,
                         lock_timeout=lock_timeout)


def publish_trees(
    trees: Sequence[SkillTree], into: Path, grace: float = 30.0, *, lock_timeout: float = 600.0
) -> list[PublishResult]:
    """:func:`publish` for trees already loaded with :func:`load_skill_tree` (used by push)."""
    root = _check_root(into)
    check_collisions(trees)
    hashes = [tree_hash(tree) for tree in trees]
    # Validation is over: from here on we write.
    root.mkdir(parents=True, exist_ok=True)
    state = _state(root)
    for d in (state.staging, state.retired, state.journal, state.hashes):
        d.mkdir(parents=True, exist_ok=True)
    if os.stat(root).st_dev != os.stat(state.base).st_dev:
        raise BootstrapError(
            f"{root} is a mount point: publish stages beside it, in {state.base}, which must be "
            "on the same file system; publish into a directory inside the mount instead"
        )
    with _locked(state, lock_timeout):
        _tidy(state, grace)
        results = [_publish_one(state, root, t, h) for t, h in zip(trees, hashes, strict=True)]
        _tidy(state, grace)
    return results


def gc_publish_state(root: Path, grace: float, *, lock_timeout: float = 600.0) -> list[Path]:
    """Finish interrupted swaps, remove dead staging and trees retired over ``grace`` s ago."""
    state = _state(root.resolve())
    if not state.base.is_dir():
        return []
    with _locked(state, lock_timeout):
        return _tidy(state, grace)


def _check_root(into: Path) -> Path:
    root = into.resolve()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root}: --into must be a directory")
    if root.parent == root:
        raise ConfigError(f"{root}: cannot publish into the file system root")
    return root


@contextlib.contextmanager
def _locked(state: _State, timeout: float) -> Iterator[None]:
    from filelock import FileLock, Timeout

    lock = FileLock(state.lock)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        # Say something only when we actually have to wait.
        log.info("waiting for another publish into this root", lock=str(state.lock))
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise LockTimeout(
                f"{state.lock}: another publish held the lock for over {timeout:g} s; "
                "retry, or check for a stuck kernel-bootstrap process"
            ) from None
    try:
        yield
    finally:
        lock.release()


def _publish_one(state: _State, root: Path, tree: SkillTree, new_hash: str) -> PublishResult:
    live = root / tree.name
    if _installed_hash(state, live) == new_hash:
        return PublishResult(tree.name, live, new_hash, changed=False, method="unchanged")
    container = state.staging / f"{os.getpid()}-{secrets.token_hex(4)}"
    with _removed_on_exit(container):
        staged = _stage(tree, new_hash, container)
        try:
            method = _swap(state, staged, live)
        except OSError as e:
            raise _swap_failed(tree.name, live, e) from e
    _remember(state, live, new_hash, tree)
    log.debug("published", name=tree.name, path=str(live), swap=method)
    return PublishResult(tree.name, live, new_hash, changed=True, method=method)


# --- the installed hash ------------------------------------------------------------------------


def _installed_hash(state: _State, live: Path) -> str | None:
    """The tree hash of what ``live`` holds now; None when absent or not a valid skill."""
    try:
        st = os.lstat(live)
        if not stat.S_ISDIR(st.st_mode):
            return None
        tree = load_skill_tree(live)
        record = _read_record(state, tree.name)
        signature = _signature(tree)
        if record and record["ino"] == st.st_ino and record["signature"] == signature:
            return record["hash"]
        digest = tree_hash(tree)
    except (OSError, SkillError):
        return None
    _write_json(state.hashes / f"{tree.name}.json",
                {"schema": SCHEMA, "hash": digest, "ino": st.st_ino, "signature": signature})
    return digest


def _signature(tree: SkillTree) -> str:
    """A digest of the tree's metadata (no content): if it still matches, the content hash does.

    Like git's index: a file rewritten in place keeping its size and mtime would go unnoticed.
    """
    h = hashlib.sha256()
    for e in tree.entries:
        h.update(repr((e.rel, e.kind, e.mode, e.size, e.mtime_ns, e.target)).encode())
    return h.hexdigest()


def _read_record(state: _State, name: str) -> _HashRecord | None:
    path = state.hashes / f"{name}.json"
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable publish hash record", path=str(path), error=str(e))
        return None
    ok = isinstance(data, dict) and data.get("schema") == SCHEMA
    return cast(_HashRecord, data) if ok and {"hash", "ino", "signature"} <= data.keys() else None


def _remember(state: _State, live: Path, digest: str, tree: SkillTree) -> None:
    """Record the hash of the tree just published, with the metadata that vouches for it.

    The copy keeps every field the signature covers, so the source's signature is the live
    tree's. Walking the live tree again held a second list of every entry (10^5 files: peak
    RSS 141 MiB, now 93). Where a file system rounds mtimes, the record just never matches
    and the next publish hashes the tree, as it does without a record.
    """
    try:
        record: _HashRecord = {"schema": SCHEMA, "hash": digest, "ino": os.lstat(live).st_ino,
                               "signature": _signature(tree)}
    except OSError as e:
        # Someone changed it already; the next publish simply hashes it again.
        log.debug("not recording the published hash", path=str(live), error=str(e))
        return
    try:
        _write_json(state.hashes / f"{live.name}.json", record)
    except OSError as e:
        # The tree is published; the record only saves the next publish a re-hash, and a stale
        # one never matches the new tree's inode. A full disk here used to fail a publish
        # that had already happened.
        log.warning("published, but could not record its hash; the next publish re-hashes it",
                    path=str(live), error=str(e))


def _write_json(path: Path, data: _HashRecord | _Journal) -> None:
    # A crash leaves the old record or the new one, never half of one.
    write_atomic(path, json.dumps(data).encode())


# --- staging -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _removed_on_exit(container: Path) -> Iterator[None]:
    """Remove the staging container however we leave: success, error, ^C (not SIGKILL)."""
    try:
        yield
    finally:
        _rmtree(container)


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


def _swap(state: _State, staged: Path, live: Path) -> str:
    """Put ``staged`` at ``live``; the outgoing tree goes to ``retired/``. Returns the method.

    An OSError means ``live`` was left as it was (or, if even the roll-back failed, the
    journal lets the next run put a tree there). Once the new tree is in, nothing fails the
    publish: tidying up the outgoing tree and syncing the directory are best effort.
    """
    if not os.path.lexists(live):
        os.rename(staged, live)
        _synced_after_swap(live)
        return "rename"
    if exchange(staged, live):  # False where unsupported, or with KERNEL_BOOTSTRAP_NO_EXCHANGE
        # ``staged`` now names the outgoing tree; a crash before it is retired leaves it in a
        # dead process's staging, which the next run reaps.
        _synced_after_swap(live)
        _retire_outgoing(state, staged, live)
        return "exchange"
    _rename_aside(state, staged, live)
    return "rename-aside"


def _synced_after_swap(live: Path) -> None:
    try:
        fsync_dir(live.parent)
    except OSError as e:
        log.warning("published, but could not sync the skill root; the swap may not survive a "
                    "power loss", path=str(live), error=str(e))


def _retire_outgoing(state: _State, outgoing: Path, live: Path) -> None:
    """Keep the tree that was just swapped out for the grace period (readers may still be in
    it). Failing to is a warning: it then goes with the staging directory, at once."""
    slot = None
    try:
        slot = _retired_slot(state, live.name)
        os.rename(outgoing, slot)
    except OSError as e:
        if slot is not None:
            with contextlib.suppress(OSError):
                slot.parent.rmdir()
        log.warning("published, but could not keep the outgoing tree for readers; removing it "
                    "now", path=str(live), error=str(e))


def _swap_failed(name: str, live: Path, e: OSError) -> DiskError:
    what = f"could not swap the new tree of skill {name!r} into {live}: {e.strerror or e}"
    if os.path.lexists(live):
        return DiskError(f"{what}; the published tree was left as it was", e)
    return DiskError(f"{what}; run publish again (or `kernel-bootstrap gc`) to finish or undo "
                     "the swap", e)


def _retired_slot(state: _State, name: str) -> Path:
    container = state.retired / f"{time.time_ns()}-{os.getpid()}-{secrets.token_hex(4)}"
    container.mkdir()
    return container / name


def _rename_aside(state: _State, staged: Path, live: Path) -> None:
    """Old tree aside, new tree in. Between the two renames ``live`` is missing: the journal
    lets the next run finish the swap (or undo it) if we die there."""
    aside = _retired_slot(state, live.name)
    journal = state.journal / f"{live.name}.json"
    try:
        _write_json(journal, {"schema": SCHEMA, "live": str(live), "aside": str(aside),
                              "staged": str(staged)})
        os.rename(live, aside)
    except BaseException:
        # Nothing moved yet: take back the journal and the empty slot (they used to stay until
        # the next run, and the slot until its grace ran out). Should a ^C land just after the
        # rename, the journal stays for the next run to put the old tree back.
        if os.path.lexists(live):
            with contextlib.suppress(OSError):
                journal.unlink(missing_ok=True)
                aside.parent.rmdir()
        raise
    try:
        _rename_staged(staged, live)
    except OSError:
        # The rename into place failed and would likely fail again; undoing the one that just
        # worked puts the old tree back now. If that fails too, the journal stays for the
        # next run.
        with contextlib.suppress(OSError):
            os.rename(aside, live)
            fsync_dir(live.parent)
            journal.unlink()
            aside.parent.rmdir()
        raise
    except BaseException:
        # ^C in the window: the staged tree is complete, so finish the swap now rather than
        # at the next run.
        with contextlib.suppress(OSError):
            _finish_swap(live, aside, staged)
            journal.unlink()
        raise
    _synced_after_swap(live)
    with contextlib.suppress(OSError):  # with the tree in place, recovery ignores the journal
        journal.unlink()


def _rename_staged(staged: Path, live: Path) -> None:
    os.rename(staged, live)  # its own function: the seam where tests simulate a crash


# --- recovery and reaping ----------------------------------------------------------------------


def _tidy(state: _State, grace: float) -> list[Path]:
    """Called with the lock held, so no journal or staging here belongs to a running publish
    of ours; staging of a live pid is still left alone (it may be a process we don't know)."""
    return [*_recover_journals(state), *_reap_staging(state), *_reap_retired(state, grace)]


def _recover_journals(state: _State) -> list[Path]:
    done: list[Path] = []
    for path in sorted(state.journal.glob("*.json")):
        journal = _read_journal(path)
        if journal is not None:
            _finish_swap(Path(journal["live"]), Path(journal["aside"]), Path(journal["staged"]))
        path.unlink()
        done.append(path)
    return done


def _read_journal(path: Path) -> _Journal | None:
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable publish journal", path=str(path), error=str(e))
        return None
    if not (isinstance(data, dict) and data.get("schema") == SCHEMA
            and all(isinstance(data.get(k), str) for k in ("live", "aside", "staged"))):
        log.warning("ignoring publish journal of an unknown format", path=str(path))
        return None
    return cast(_Journal, data)


def _finish_swap(live: Path, aside: Path, staged: Path) -> None:
    if os.path.lexists(live):
        return  # the swap never started, or it completed: nothing is missing
    # The journal is written only once staging is complete and fsynced, so a staged tree
    # that still exists is whole: finish the swap. Otherwise put the old tree back.
    source = staged if os.path.lexists(staged) else aside
    log.warning("recovering an interrupted publish", live=str(live), restored=str(source))
    os.rename(source, live)
    fsync_dir(live.parent)


def _reap_staging(state: _State) -> list[Path]:
    dead = [p for p in _children(state.staging) if not _owner_alive(p.name)]
    return [p for p in dead if _removed(p)]


def _owner_alive(container_name: str) -> bool:
    pid_text = container_name.split("-", 1)[0]
    if not pid_text.isdigit() or int(pid_text) <= 0:
        return False
    try:
        # A zombie still counts as alive: the parent must have reaped a killed child first.
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap_retired(state: _State, grace: float) -> list[Path]:
    now = time.time_ns()
    expired = []
    for p in _children(state.retired):
        stamp = p.name.split("-", 1)[0]
        if not stamp.isdigit() or now - int(stamp) >= grace * 1e9:
            expired.append(p)
    return [p for p in expired if _removed(p)]


def _children(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except FileNotFoundError:
        return []


def _removed(path: Path) -> bool:
    """Remove a leftover; failing to is a warning, never a failed publish."""
    try:
        _rmtree(path)
    except OSError as e:
        log.warning("could not remove a publish leftover", path=str(path), error=str(e))
        return False
    return True


def _rmtree(path: Path) -> None:
    """Remove a tree even when it holds read-only directories (copied modes)."""

    def make_writable(func: Callable[..., Any], target: str, _exc: Any) -> None:
        # Deleting an entry needs write permission on its directory.
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
        func(target)

    if not os.path.lexists(path):
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable)
    else:
        shutil.rmtree(path, onerror=make_writable)
