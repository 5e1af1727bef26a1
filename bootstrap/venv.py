"""The managed venv on disk: its interpreter, its version, and the staged rebuild's swap.

A rebuild is built in a hidden sibling (same filesystem) and only then swapped into the stable
path, so until that instant the old venv and its marker are untouched and usable. The system we
replace removed the venv first; a failed rebuild then left its user with no kernel at all.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Final

from bootstrap import log
from bootstrap.atomic import DiskError, exchange, write_atomic
from bootstrap.errors import BootstrapError
from bootstrap.fs import fsync_dir
from bootstrap.marker import MARKER_NAME

_STAGE: Final = "stage"
_RETIRED: Final = "retired"
_WORK: Final = "work"


def interpreter(venv: Path) -> Path:
    """The venv's interpreter; the one place that knows the per-platform layout."""
    if sys.platform == "win32":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def scripts_dir(venv: Path) -> Path:
    return interpreter(venv).parent


def python_version(venv: Path) -> str | None:
    """The full version the venv runs, from ``pyvenv.cfg`` (no child process needed)."""
    try:
        text = (venv / "pyvenv.cfg").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    # uv writes version_info; the stdlib venv module writes version.
    return values.get("version_info") or values.get("version")


def is_venv(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file()


def sibling(live: Path, kind: str) -> Path:
    """A hidden sibling of the live venv, named for its owner pid so leftovers can be traced."""
    return live.with_name(f".{live.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def staging_path(live: Path) -> Path:
    return sibling(live, _STAGE)


def work_path(live: Path) -> Path:
    """Scratch space of one skill sync (requirements file, build environments, wheels): beside
    the venv, so a killed session's is reaped by the next one like a dead staging tree."""
    return sibling(live, _WORK)


def _journal(live: Path) -> Path:
    return live.with_name(f".{live.name}.swap")


def leftovers(live: Path) -> list[Path]:
    """What interrupted writers of this venv leave behind (any owner): staging, retired and
    scratch trees beside it, and temp files of the swap journal and of the marker."""
    prefixes = (f".{live.name}.{_STAGE}-", f".{live.name}.{_RETIRED}-",
                f".{live.name}.{_WORK}-", f".{_journal(live).name}.tmp-")
    found = [live.parent / n for n in _names(live.parent) if n.startswith(prefixes)]
    found += [live / n for n in _names(live) if n.startswith(f".{MARKER_NAME}.tmp-")]
    return sorted(found)


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def swap_into_place(staged: Path, live: Path) -> str:
    """Move the validated ``staged`` venv to ``live``; return the method used.

    With ``RENAME_EXCHANGE`` there is no instant without a venv at ``live``. The fallback
    renames the old one aside first and keeps a journal so that a kill between the two renames
    is finished or rolled back by :func:`recover` on the next start.
    """
    had_venv = os.path.lexists(live)
    try:
        if not had_venv:
            os.rename(staged, live)
            method = "rename"
        elif exchange(staged, live):
            method = "exchange"
        else:
            _rename_aside(staged, live)
            return "rename-aside"
    except OSError as e:
        # A bare "[Errno 5] Input/output error: '.venv.stage-…' -> 'venv'" said neither what
        # failed nor what was left.
        left = "the old venv is unchanged" if had_venv else "nothing was created there"
        if had_venv and not os.path.lexists(live):
            left = "the old venv is beside it; the next `kernel-bootstrap ensure` puts it back"
        raise DiskError(f"could not move the new venv into place at {live}: {e.strerror or e}; "
                        f"{left}. Run `kernel-bootstrap ensure` again once that is fixed.",
                        e) from e
    _synced_after_swap(live)
    if method == "exchange":
        _retire(staged, live)
    return method


def _synced_after_swap(live: Path) -> None:
    # The new venv is in place and in use from here on: a failing directory fsync must not
    # fail (and, in the engine, remove) a rebuild that has happened. Say so instead.
    try:
        fsync_dir(live.parent)
    except OSError as e:
        log.warning("the new venv is in place, but its directory could not be synced; the swap "
                    "may not survive a power loss", venv=str(live), error=str(e))


def _rename_aside(staged: Path, live: Path) -> None:
    aside = sibling(live, _RETIRED)
    journal = _journal(live)
    write_atomic(journal, json.dumps({"aside": str(aside), "staged": str(staged)}).encode())
    try:
        os.rename(live, aside)
    except OSError as e:
        journal.unlink(missing_ok=True)
        # Windows refuses to rename a directory while a process runs from it.
        busy = isinstance(e, PermissionError) or e.errno == errno.EBUSY
        hint = "Is a kernel running from it? Stop it and" if busy else "Fix that and"
        raise BootstrapError(
            f"could not move the old venv {live} aside to swap the new one in: {e.strerror}. "
            f"{hint} run `kernel-bootstrap ensure` again; the old venv is unchanged."
        ) from e
    try:
        os.rename(staged, live)
    except BaseException:
        # Put the old venv back now rather than leave nothing at `live` until the next start;
        # if even that fails, the journal lets recover() do it.
        os.rename(aside, live)
        journal.unlink(missing_ok=True)
        raise
    _synced_after_swap(live)
    journal.unlink()
    _remove_tree(aside)


def _retire(old: Path, live: Path) -> None:
    # After the exchange the old venv sits at the staging name; rename it to a "retired" name
    # first so a kill during the slow rmtree leaves something recover() knows to remove. The
    # new venv is already live: failing to tidy up must not fail the rebuild.
    retired = sibling(live, _RETIRED)
    try:
        os.rename(old, retired)
    except OSError:
        retired = old
    _remove_tree(retired)


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def recover(live: Path) -> list[str]:
    """Finish or roll back an interrupted rename-aside, then reap what dead writers left.

    Must run under the bootstrap lock: only the lock holder builds, so every leftover found
    here belongs to a process that is gone. Returns what was done, for ``gc`` to report.
    """
    done: list[str] = []
    journal = _journal(live)
    if journal.exists():
        done += _replay_journal(journal, live)
    for path in leftovers(live):
        _remove_tree(path)
        done.append(f"removed leftover {path}")
    if done:
        log.info("recovered leftovers", venv=str(live), actions=done)
    return done


def _replay_journal(journal: Path, live: Path) -> list[str]:
    """A kill between the two renames left no venv at ``live``: put one there."""
    try:
        entry = json.loads(journal.read_bytes())
        aside, staged = Path(entry["aside"]), Path(entry["staged"])
    except (OSError, ValueError, KeyError, TypeError):
        journal.unlink(missing_ok=True)
        return [f"removed unreadable swap journal {journal}"]
    done: list[str] = []
    if not os.path.lexists(live):
        # The staged venv got its marker before the journal was written; one without it is
        # not the venv we meant to swap in, so the old one goes back.
        if (staged / MARKER_NAME).is_file() and interpreter(staged).exists():
            os.rename(staged, live)
            done.append(f"finished an interrupted swap: {staged} -> {live}")
        elif aside.is_dir():
            os.rename(aside, live)
            done.append(f"rolled back an interrupted swap: {aside} -> {live}")
        fsync_dir(live.parent)
    journal.unlink(missing_ok=True)
    return done
