"""The directory swap: put a complete staged tree at a live path that other processes read.

Used for the venv, published skill trees and kernelspecs. With Linux ``RENAME_EXCHANGE`` there
is no instant without a tree at the live path. Elsewhere the old tree is renamed aside and the
new one in, under a journal: a kill between the two renames is finished (the staged tree is
complete) or rolled back by :func:`recover` on the next run.

A journal records names relative to the caller's own directories, never absolute paths, and
recovery rebuilds the paths from the :class:`Site` the caller passes. A journal is found on
disk, where others can write: one that is not a regular file, is malformed, or names anything
outside those directories (``..``, a link on the way, a name the caller does not use) is
ignored with a warning naming it. A forged journal once made publish rename any path to any
destination on the file system.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

from bootstrap.primitives import log
from bootstrap.primitives.atomic import exchange, write_atomic
from bootstrap.primitives.fs import (
    fsync_dir,
    is_real_dir,
    pid_alive,
    read_state_file,
    remove_quietly,
)

SCHEMA: Final = 1


def _always(_: Path) -> bool:
    return True


def _keep(_: Path) -> object:
    return None


@dataclass(frozen=True)
class Site:
    """One caller's swaps: its directories, its names, and the fate of an outgoing tree."""

    live_dir: Path  # holds the live trees
    staging_dir: Path  # holds staged trees (directly, or one container deep)
    aside_dir: Path  # holds outgoing trees (likewise)
    noun: str  # what is swapped in, for messages: "the new venv"
    journal: Callable[[Path], Path]  # the journal of swaps into a live path
    aside: Callable[[Path], Path]  # a fresh path in aside_dir for the outgoing tree
    retire: Callable[[Path], object] = _keep  # the outgoing tree, once the new one is in
    complete: Callable[[Path], bool] = _always  # may recovery move this staged tree in?
    prefix: str = ""  # every name a journal records starts with this (a shared directory)
    finish_on_interrupt: bool = False  # ^C between the renames: finish, or put the old back
    unlocked: bool = False  # no lock excludes other writers: a live writer's journal is theirs


class _Entry(NamedTuple):
    staged: Path
    aside: Path
    pid: int | None


def swap_in(site: Site, staged: Path, live: Path) -> str:
    """Put ``staged`` at ``live``; returns "rename", "exchange" or "rename-aside".

    An OSError means ``live`` was left as it was (or, if even the roll-back failed, the
    journal lets :func:`recover` put a tree there). Once the new tree is in, nothing fails:
    syncing the directory and setting the outgoing tree aside are best effort.
    """
    if not os.path.lexists(live):
        os.rename(staged, live)
        _synced(site, live)
        return "rename"
    if exchange(staged, live):  # False where unsupported, or with KERNEL_BOOTSTRAP_NO_EXCHANGE
        # ``staged`` names the outgoing tree now; a kill before it is set aside leaves it at a
        # dead process's staging name, which the next run reaps.
        _synced(site, live)
        _set_aside(site, staged, live)
        return "exchange"
    _rename_aside(site, staged, live)
    return "rename-aside"


def _synced(site: Site, live: Path) -> None:
    try:
        fsync_dir(live.parent)
    except OSError as e:
        log.warning(f"{site.noun} is in place, but its directory could not be synced; the swap "
                    "may not survive a power loss", path=str(live), error=str(e))


def _set_aside(site: Site, outgoing: Path, live: Path) -> None:
    slot = None
    try:
        slot = site.aside(live)
        os.rename(outgoing, slot)
    except OSError as e:
        if slot is not None:
            _drop_slot(site, slot)
        log.warning(f"{site.noun} is in place, but the outgoing one could not be set aside; "
                    "it is removed instead", path=str(live), error=str(e))
        remove_quietly(outgoing)
        return
    site.retire(slot)


def _drop_slot(site: Site, slot: Path) -> None:
    """Take back the container a fresh aside path was made in, if it has one (still empty)."""
    if slot.parent != site.aside_dir:
        with contextlib.suppress(OSError):
            slot.parent.rmdir()


def _rename_aside(site: Site, staged: Path, live: Path) -> None:
    """Old tree aside, new tree in. Between the two renames ``live`` is missing: the journal
    lets the next run finish the swap (or undo it) if we die there."""
    aside = site.aside(live)
    journal = site.journal(live)
    try:
        write_atomic(journal, _record(site, live, staged, aside))
        os.rename(live, aside)
    except BaseException:
        if os.path.lexists(live):  # nothing moved: take back the journal and the slot
            remove_quietly(journal)
            _drop_slot(site, aside)
        raise  # else a ^C landed just after the rename: the journal stays for the next run
    try:
        os.rename(staged, live)
    except BaseException as e:
        if isinstance(e, OSError) or not site.finish_on_interrupt:
            _undo(site, live, aside, journal)  # it would likely fail again: old tree back now
        else:
            _finish(live, staged, journal)  # ^C: the staged tree is complete, so finish now
        raise
    _synced(site, live)
    remove_quietly(journal)  # with the tree in place, recovery ignores the journal
    site.retire(aside)


def _undo(site: Site, live: Path, aside: Path, journal: Path) -> None:
    # If even this fails the journal stays, and the next run puts a tree back.
    with contextlib.suppress(OSError):
        os.rename(aside, live)
        fsync_dir(live.parent)
        journal.unlink()
        _drop_slot(site, aside)


def _finish(live: Path, staged: Path, journal: Path) -> None:
    with contextlib.suppress(OSError):
        os.rename(staged, live)
        journal.unlink()


def _record(site: Site, live: Path, staged: Path, aside: Path) -> bytes:
    return json.dumps({
        "schema": SCHEMA, "pid": os.getpid(), "live": live.name,
        "staged": staged.relative_to(site.staging_dir).as_posix(),
        "aside": aside.relative_to(site.aside_dir).as_posix(),
    }).encode()


# --- recovery ----------------------------------------------------------------------------------


def recover(site: Site, live: Path) -> str | None:
    """Finish or roll back an interrupted rename-aside into ``live``; say what was done.

    The caller holds the lock that excludes other writers (or sets ``site.unlocked``), so the
    journal's writer is gone. A staged tree that ``site.complete`` accepts is moved in;
    otherwise the old tree goes back.
    """
    journal = site.journal(live)
    if not os.path.lexists(journal):
        return None
    entry = _read_journal(site, journal, live)
    if entry is None:
        remove_quietly(journal)
        return f"removed unusable swap journal {journal}"
    if site.unlocked and entry.pid != os.getpid() and pid_alive(entry.pid):
        return None  # its writer is still at work
    done = None if os.path.lexists(live) else _restore(site, live, entry, journal)
    remove_quietly(journal)
    return done


def _restore(site: Site, live: Path, entry: _Entry, journal: Path) -> str | None:
    """A kill between the two renames left nothing at ``live``: put a tree there."""
    if _reachable(site.staging_dir, entry.staged) and site.complete(entry.staged):
        os.rename(entry.staged, live)
        fsync_dir(live.parent)
        if _reachable(site.aside_dir, entry.aside):
            site.retire(entry.aside)
        return f"finished an interrupted swap: {entry.staged} -> {live}"
    if _reachable(site.aside_dir, entry.aside):
        log.warning("recovering an interrupted swap", live=str(live), restored=str(entry.aside))
        os.rename(entry.aside, live)
        fsync_dir(live.parent)
        if _reachable(site.staging_dir, entry.staged):
            remove_quietly(entry.staged)
        return f"rolled back an interrupted swap: {entry.aside} -> {live}"
    log.warning("an interrupted swap left no tree to put back", live=str(live),
                journal=str(journal))
    return None


def _read_journal(site: Site, journal: Path, live: Path) -> _Entry | None:
    try:
        data: Any = json.loads(read_state_file(journal))
    except (OSError, ValueError, RecursionError) as e:
        log.warning("ignoring an unreadable swap journal", journal=str(journal), error=str(e))
        return None
    if not isinstance(data, dict) or data.get("schema", SCHEMA) != SCHEMA:
        log.warning("ignoring a swap journal of an unknown format", journal=str(journal))
        return None
    staged = _inside(site, site.staging_dir, data.get("staged"))
    aside = _inside(site, site.aside_dir, data.get("aside"))
    if staged is None or aside is None or data.get("live", live.name) not in (live.name,
                                                                             str(live)):
        log.warning("ignoring a swap journal that names paths outside its own places",
                    journal=str(journal))
        return None
    pid = data.get("pid")
    return _Entry(staged, aside, pid if isinstance(pid, int) and pid > 0 else None)


def _inside(site: Site, base: Path, value: object) -> Path | None:
    """``value`` (relative to ``base``; earlier journals held absolute paths) as a path one or
    two names deep in ``base``, or None if it could name anything else."""
    if not isinstance(value, str):
        return None
    if os.path.isabs(value):
        try:
            parts: tuple[str, ...] = Path(value).relative_to(base).parts
        except ValueError:
            return None
    else:
        parts = tuple(value.split("/"))
    bad = any(p in ("", ".", "..") or "\\" in p or "\0" in p or os.sep in p for p in parts)
    if bad or not 1 <= len(parts) <= 2 or not parts[0].startswith(site.prefix):
        return None
    return base.joinpath(*parts)


def _reachable(base: Path, path: Path) -> bool:
    """Whether ``path`` and every directory between ``base`` and it are real directories: a
    link planted on the way would lead recovery out of our own places."""
    current = base
    for part in path.relative_to(base).parts:
        current = current / part
        if not is_real_dir(current):
            return False
    return True
