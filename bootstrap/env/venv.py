"""The managed venv on disk: its interpreter, its version, and the staged rebuild's swap.

A rebuild is built in a hidden sibling (same filesystem) and only then swapped into the stable
path, so until that instant the old venv and its marker are untouched and usable. The system we
replace removed the venv first; a failed rebuild then left its user with no kernel at all.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bootstrap.env.marker import MARKER_NAME
from bootstrap.errors import BootstrapError
from bootstrap.primitives import log, swap
from bootstrap.primitives.atomic import DiskError
from bootstrap.primitives.fs import read_state_file, remove_quietly, temp_name

_STAGE: Final = "stage"
_RETIRED: Final = "retired"
_WORK: Final = "work"
_LINK: Final = "link"  # a generation's new link before it is renamed over the venv


def interpreter(venv: Path) -> Path:
    """The venv's interpreter; the one place that knows the per-platform layout."""
    if sys.platform == "win32":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def scripts_dir(venv: Path) -> Path:
    return interpreter(venv).parent


@dataclass(frozen=True)
class Venv:
    """A venv's layout, made once from its directory: the paths the tool reads and runs."""

    path: Path
    python: Path
    scripts: Path
    marker: Path
    cfg: Path  # pyvenv.cfg: its existence alone does not mean the venv is complete

    @classmethod
    def at(cls, path: Path) -> Venv:
        python = interpreter(path)
        return cls(path, python, python.parent, path / MARKER_NAME, path / "pyvenv.cfg")

    def site_packages(self) -> list[Path]:
        """Where its distributions live (one directory in a venv uv or the stdlib made)."""
        return [*self.path.glob("lib/python*/site-packages"), self.path / "Lib" / "site-packages"]

    def version(self) -> str | None:
        return python_version(self.path)


def python_version(venv: Path) -> str | None:
    """The full version the venv runs, from ``pyvenv.cfg`` (no child process needed)."""
    try:
        # Never followed or read whole: a planted link to /dev/zero or a FIFO must not hang us.
        text = read_state_file(venv / "pyvenv.cfg").decode("utf-8", errors="replace")
    except (OSError, ValueError):
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
    """A hidden sibling of the live venv, named for its owner pid so leftovers can be traced:
    ``.<venv>.<kind>-<pid>-<token>``, as :func:`bootstrap.primitives.fs.temp_name` names them."""
    return temp_name(live, kind)


def staging_path(live: Path) -> Path:
    return sibling(live, _STAGE)


def work_path(live: Path) -> Path:
    """Scratch space of one skill sync (requirements file, build environments, wheels): beside
    the venv, so a killed session's is reaped by the next one like a dead staging tree."""
    return sibling(live, _WORK)


def link_path(live: Path) -> Path:
    return sibling(live, _LINK)


def retired_path(live: Path) -> Path:
    return sibling(live, _RETIRED)


def _journal(live: Path) -> Path:
    return live.with_name(f".{live.name}.swap")


def rebuild_record(live: Path) -> Path:
    """Where the last failed rebuild is recorded (skills/backoff.py): beside the venv, which a
    failed rebuild leaves as it was."""
    return live.with_name(live.name + ".rebuild-failed")


def leftovers(live: Path) -> list[Path]:
    """What interrupted writers of this venv leave behind (any owner): staging, retired and
    scratch trees beside it, a generation's new link, and temp files of the swap journal, of the
    failed rebuild's record and of the marker. (Generations are not leftovers:
    ``env/generations.py`` decides their fate.)"""
    prefixes = (f".{live.name}.{_STAGE}-", f".{live.name}.{_RETIRED}-",
                f".{live.name}.{_WORK}-", f".{live.name}.{_LINK}-",
                f".{_journal(live).name}.tmp-", f".{rebuild_record(live).name}.tmp-")
    found = [live.parent / n for n in _names(live.parent) if n.startswith(prefixes)]
    found += [live / n for n in _names(live) if n.startswith(f".{MARKER_NAME}.tmp-")]
    return sorted(found)


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _site(live: Path) -> swap.Site:
    # The venv's siblings share its parent with whatever else the user keeps there: a journal
    # may only name our own siblings of this venv.
    return swap.Site(
        live_dir=live.parent, staging_dir=live.parent, aside_dir=live.parent,
        noun="the new venv", journal=lambda _: _journal(live),
        # The new venv is live: failing to remove the old one must not fail the rebuild (the
        # next locked run reaps it as a leftover).
        aside=lambda _: sibling(live, _RETIRED), retire=remove_quietly, complete=_complete,
        prefix=f".{live.name}.")


def _complete(staged: Path) -> bool:
    # The staged venv got its marker before the journal was written; one without it is not
    # the venv we meant to swap in, so the old one goes back.
    venv = Venv.at(staged)
    return venv.marker.is_file() and venv.python.exists()


def swap_into_place(staged: Path, live: Path) -> str:
    """Move the validated ``staged`` venv to ``live``; return the method used.

    With ``RENAME_EXCHANGE`` there is no instant without a venv at ``live``. The fallback
    renames the old one aside first and keeps a journal so that a kill between the two renames
    is finished or rolled back by :func:`recover` on the next start.
    """
    had_venv = os.path.lexists(live)
    try:
        return swap.swap_in(_site(live), staged, live)
    except OSError as e:
        raise _swap_failed(live, had_venv, e) from e


def _swap_failed(live: Path, had_venv: bool, e: OSError) -> BootstrapError:
    # A bare "[Errno 5] Input/output error: '.venv.stage-…' -> 'venv'" said neither what failed
    # nor what was left.
    left = "the old venv is unchanged" if had_venv else "nothing was created there"
    if had_venv and not os.path.lexists(live):
        left = "the old venv is beside it; the next `kernel-bootstrap ensure` puts it back"
    # Windows refuses to rename a directory while a process runs from it.
    if had_venv and (isinstance(e, PermissionError) or e.errno == errno.EBUSY):
        hint = "Is a kernel running from it? Stop it and run `kernel-bootstrap ensure` again."
    else:
        hint = "Run `kernel-bootstrap ensure` again once that is fixed."
    return DiskError(f"could not move the new venv into place at {live}: {e.strerror or e}; "
                     f"{left}. {hint}", e)


def interrupted_rebuild(live: Path) -> bool:
    """Whether a staged rebuild of ``live`` was left behind by a writer that died (call it
    under the bootstrap lock, before :func:`recover` reaps it)."""
    prefix = f".{live.name}.{_STAGE}-"
    return any(p.name.startswith(prefix) for p in leftovers(live))


def recover(live: Path) -> list[str]:
    """Finish or roll back an interrupted rename-aside, then reap what dead writers left.

    Must run under the bootstrap lock: only the lock holder builds, so every leftover found
    here belongs to a process that is gone. Returns what was done, for ``gc`` to report.
    """
    done: list[str] = []
    replayed = swap.recover(_site(live), live)
    if replayed:
        done.append(replayed)
    for path in leftovers(live):
        remove_quietly(path)
        done.append(f"removed leftover {path}")
    if done:
        log.info("recovered leftovers", venv=str(live), actions=done)
    return done


def editable_urls(venv: Path) -> dict[str, str]:
    """Normalised project name (:func:`project_key`) -> the URL of each editable install in
    the venv, from its ``direct_url.json`` (PEP 610); read as untrusted (bounded, no link)."""
    import json

    out: dict[str, str] = {}
    for site in Venv.at(venv).site_packages():
        try:
            infos = [e for e in os.scandir(site) if e.name.endswith(".dist-info")]
        except OSError:
            continue
        for info in infos:
            try:
                data = json.loads(read_state_file(Path(info.path) / "direct_url.json"))
            except (OSError, ValueError, RecursionError):
                continue
            if isinstance(data, dict) and isinstance(data.get("url"), str) and \
                    isinstance(data.get("dir_info"), dict) and data["dir_info"].get("editable"):
                out[project_key(info.name[:-len(".dist-info")].rsplit("-", 1)[0])] = data["url"]
    return out


def project_key(project: str) -> str:
    """A project's name as a ``.dist-info`` directory spells it, lower case."""
    import re

    return re.sub(r"[-_.]+", "_", project).lower()


def url_path(url: str) -> str | None:
    """The real path a ``file:`` URL names (None for any other URL)."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    return os.path.realpath(unquote(parsed.path)) if parsed.scheme == "file" else None
