"""Generations: each built runtime in its own directory, ``<venv>`` a symlink to the current one.

A rebuild used to swap the new tree in at ``<venv>`` and remove the old one at once, so every
kernel still running from ``<venv>`` read the new tree on its next import. Now each runtime is
built in a generation directory beside the venv, ``.<venv>.gen-<pid>-<token>``, and
``<venv>`` is a relative symlink naming it. The link is replaced in one ``rename`` once the new
generation is complete and validated, so ``<venv>/bin/python`` is the same path across
rebuilds and, at every instant, names a complete generation. Each process pins itself to the
generation it started in (``env/pin.py``) and holds a lock on its ``.in-use`` file (a record
lock on its own byte, or a shared ``flock``); a generation other than the current one is
removed only when a lock conflicting with both kinds can be taken without waiting, that is
when no process uses it.

Where a directory cannot be replaced by a symlink without an instant with nothing at
``<venv>`` (Windows; a file system without ``RENAME_EXCHANGE`` holding a venv of an earlier
release) the venv stays a plain directory and rebuilds use the staged swap of ``env/venv.py``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bootstrap.config import Config
from bootstrap.env import pin
from bootstrap.env.identity import identity_of, runtime_inputs
from bootstrap.env.marker import MARKER_NAME, RuntimeRecord, read_marker
from bootstrap.env.venv import (
    Venv,
    link_path,
    retired_path,
    sibling,
    staging_path,
    swap_into_place,
)
from bootstrap.primitives import log
from bootstrap.primitives.atomic import exchange
from bootstrap.primitives.fs import (
    fsync_dir,
    is_real_dir,
    open_regular,
    remove_quietly,
    remove_tree,
)

GEN: Final = pin.GEN
_NOLOCK: Final = {errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES}


def supported() -> bool:
    """Whether ``<venv>`` may be a symlink to a generation (``KERNEL_BOOTSTRAP_NO_GENERATIONS=1``
    keeps the plain directory and the staged swap, for tests and for debugging)."""
    return sys.platform != "win32" and not os.environ.get("KERNEL_BOOTSTRAP_NO_GENERATIONS")


def new_path(live: Path) -> Path:
    """Where the next generation is built: named for its builder, like every staging tree."""
    return sibling(live, GEN)


def _prefix(live: Path) -> str:
    return f".{live.name}.{GEN}-"


def current(live: Path) -> Path | None:
    """The generation ``<venv>`` names, or None when it is no symlink of ours (a plain
    directory, nothing, or a link someone else made)."""
    try:
        target = os.readlink(live)
    except (OSError, ValueError):
        return None
    if os.sep in target or "/" in target or not target.startswith(_prefix(live)):
        return None
    return live.parent / target


def is_generation(live: Path, path: Path) -> bool:
    return path.parent == live.parent and path.name.startswith(_prefix(live))


def interrupted(live: Path) -> bool:
    """Whether a generation beside ``live`` has no marker: its builder died (ask under the
    bootstrap lock, where every builder but us is gone)."""
    return any(not Venv.at(p).marker.is_file() for p in others(live))


def is_foreign_link(live: Path) -> bool:
    """``<venv>`` is a symlink, but not to one of our generations: someone else's."""
    return os.path.islink(live) and current(live) is None


def others(live: Path) -> list[Path]:
    """Every generation directory beside ``live`` except the current one."""
    now = current(live)
    try:
        names = os.listdir(live.parent)
    except OSError:
        return []
    found = [live.parent / n for n in names if n.startswith(_prefix(live))]
    return sorted(p for p in found if p != now and is_real_dir(p))


# --- in use ------------------------------------------------------------------------------------


def _open_in_use(generation: Path) -> int | None:
    try:  # never through a link, never blocking, a regular file only: like our state files
        return open_regular(generation / pin.IN_USE)
    except OSError:
        return None  # no file: no process can hold its lock (a pin finding none pins nothing)


def _try_exclusive(fd: int) -> bool:
    """Whether no pin holds ``fd``'s file: an exclusive ``flock`` (against the flock kind) and a
    read lock over every byte (against each process's write lock on its own byte), both without
    waiting; they last until ``fd`` is closed."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in _NOLOCK:
            return False
        raise
    return True


def _ours(generation: Path) -> bool:
    """Whether this process runs from ``generation`` (a library call inside a kernel): a
    process's own record lock never conflicts with its own test, and closing any descriptor of
    the file would drop it, so its file is not even opened."""
    try:
        return os.path.samefile(sys.prefix, generation)
    except OSError:
        return False


def in_use(generation: Path) -> bool:
    """Whether a process holds the generation's ``.in-use`` lock.

    Read-only: the exclusive lock is released at once and nothing is written. A process
    starting in that microsecond waits for it and then pins itself as usual (the file is still
    linked). ``/proc/locks`` would tell without locking, but only on Linux, and only by device
    and inode numbers.
    """
    if _ours(generation):
        return True
    fd = _open_in_use(generation)
    if fd is None:
        return False
    try:
        return not _try_exclusive(fd)
    finally:
        os.close(fd)  # closing drops the lock


@dataclass
class Removal:
    removed: list[Path]
    kept: list[Path]  # in use


def remove_unused(live: Path) -> Removal:
    """Remove every generation but the current one that no process uses; call it under the
    bootstrap lock (a generation being built belongs to the lock holder)."""
    done = Removal([], [])
    _reap_links(live)
    for generation in others(live):
        try:
            removed = _remove(live, generation)
        except OSError as e:
            log.warning("could not remove an old generation; the next run tries again",
                        path=str(generation), error=str(e))
            continue
        (done.removed if removed else done.kept).append(generation)
    if done.removed or done.kept:
        log.info("old generations", venv=str(live), removed=[str(p) for p in done.removed],
                 in_use=[str(p) for p in done.kept])
    return done


def _remove(live: Path, generation: Path) -> bool:
    """Remove ``generation`` unless it is in use. Holding its lock, first move it to a retired
    name (a kill from here on leaves a leftover the next locked run reaps, never half a
    generation that looks whole), then unlink ``.in-use`` (a process that waited for the lock
    sees it gone and pins itself to the current generation instead) and let the lock go, so
    that no start waits while the files are removed."""
    if _ours(generation):
        return False
    fd = _open_in_use(generation)
    try:
        if fd is not None and not _try_exclusive(fd):
            return False
        retired = retired_path(live)
        os.rename(generation, retired)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(retired / pin.IN_USE)
    finally:
        if fd is not None:
            os.close(fd)
    remove_tree(retired)
    return True


def _reap_links(live: Path) -> None:
    """A conversion killed before its exchange leaves a self-naming link at a generation's
    name (see :func:`convert`); it names nothing, so it goes."""
    with contextlib.suppress(OSError):
        for name in os.listdir(live.parent):
            path = live.parent / name
            if name.startswith(_prefix(live)) and os.path.islink(path):
                os.unlink(path)


# --- putting a generation in place ---------------------------------------------------------------


def build_path(live: Path) -> Path:
    """Where a rebuild (or a restore) builds its tree: a new generation, or, where ``<venv>``
    stays a plain directory, the staging sibling that :func:`place` swaps in. Call it after
    :func:`convert`, under the bootstrap lock."""
    if supported() and not is_real_dir(live):  # nothing there yet, or our link
        return new_path(live)
    return staging_path(live)


def place(live: Path, tree: Path) -> str:
    """Put the validated ``tree`` (from :func:`build_path`) at ``<venv>``; the method used.
    The caller then removes the generations no process uses (:func:`remove_unused`)."""
    if not is_generation(live, tree):
        return swap_into_place(tree, live)
    return flip(live, tree)


@contextlib.contextmanager
def removed_unless_current(live: Path, tree: Path) -> Iterator[Path]:
    """Remove the tree being built if the block fails, unless it became current first (an
    interrupt just after the flip): ``<venv>`` must never name a removed generation."""
    try:
        yield tree
    except BaseException:
        if current(live) != tree:
            remove_quietly(tree)
        raise


def prepare(generation: Path) -> None:
    """Make a built generation pin the processes that will start in it (before validation,
    which then runs with the pin, and before the base marker, which means "complete")."""
    venv = Venv.at(generation)
    pin.install(generation, venv.site_packages(), venv.python)


def flip(live: Path, generation: Path) -> str:
    """Point ``<venv>`` at ``generation`` with one rename of a new link over the old one.

    ``<venv>`` must be absent or a symlink (a plain directory is converted first). The old
    generation stays: processes may be running in it.
    """
    link = link_path(live)
    os.symlink(generation.name, link)
    try:
        os.rename(link, live)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(link)
        raise
    _synced(live)
    return "flip"


def _synced(live: Path) -> None:
    # The new generation is in place: failing to make that durable must not fail the rebuild.
    try:
        fsync_dir(live.parent)
    except OSError as e:
        log.warning("the new venv is in place, but its directory could not be synced; the "
                    "change may not survive a power loss", path=str(live), error=str(e))


def convert(live: Path) -> Path | None:
    """Turn a plain-directory venv of ours (it has our marker) into the first generation,
    without a rebuild and without an instant where ``<venv>`` is missing; return it, or None
    where that cannot be done here (the venv then stays a plain directory).

    A symlink is made at the new generation's name naming that same name, then exchanged with
    the directory (``renameat2(RENAME_EXCHANGE)``): in one step ``<venv>`` becomes a link naming
    the generation and the directory lands at exactly that name. A kill before the exchange
    leaves only the dangling link, which :func:`remove_unused` reaps.
    """
    if not wants_conversion(live):
        return None
    prepare(live)  # processes started from here on pin themselves; earlier ones cannot
    _reap_links(live)  # a conversion killed before its exchange
    generation = new_path(live)
    os.symlink(generation.name, generation)
    try:
        swapped = exchange(generation, live)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(generation)
        raise
    if not swapped:
        os.unlink(generation)
        log.info("the venv stays a plain directory: this file system cannot exchange it for "
                 "a link", venv=str(live))
        return None
    _synced(live)
    log.info("the venv is now the first generation", venv=str(live), generation=str(generation))
    return generation


def wants_conversion(live: Path) -> bool:
    """A plain-directory venv of ours that :func:`convert` would turn into a generation (an
    lstat, a stat and an access: the ready gate asks it). Not one we cannot write, a read-only
    volume mounted there: the conversion writes the pin into it, and every start used to fail
    trying."""
    return (supported() and is_real_dir(live) and Venv.at(live).marker.is_file()
            and os.access(live, os.W_OK))


# --- adoption ------------------------------------------------------------------------------------


def adoptable(config: Config) -> tuple[Path, RuntimeRecord] | None:
    """A complete generation beside the venv built for ``config``'s runtime (a killed session's
    that never became current, or an earlier one still in use), newest first: its marker
    (written only after validation) records this runtime and its interpreter exists."""
    live = config.venv
    for generation in sorted(others(live), key=_mtime, reverse=True):
        venv = Venv.at(generation)
        data = read_marker(generation).data
        version = venv.version()
        if data is None or version is None or not venv.python.exists():
            continue
        if identity_of(runtime_inputs(config, version)) == data["runtime"]["identity"]:
            return generation, data["runtime"]
    return None


def _mtime(path: Path) -> float:
    try:
        return os.stat(path / MARKER_NAME).st_mtime
    except OSError:
        return 0.0


# --- what status shows ---------------------------------------------------------------------------


def describe(live: Path) -> dict[str, object]:
    """``status --json``'s ``generation``: the current one and the others, whether in use."""
    now = current(live)
    return {"current": str(now) if now else None,
            "others": [{"path": str(p), "in_use": in_use(p)} for p in others(live)]}
