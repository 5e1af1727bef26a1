"""The warm fingerprint's writing side: the stamps a full check takes, the text, the save.

The reading side, and the answer it gives, is ``warm.py``, which every kernel start imports;
this half runs only after a full check, so nothing here costs the warm path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bootstrap.primitives.fs import is_real_dir
from bootstrap.warm import (
    ENV_KEYS,
    FORMAT,
    fingerprint_path,
    read_text,
    stamp,
    trusted_dir,
)
from bootstrap.warm_failures import escape


def stamps(paths: list[str]) -> list[tuple[str, str]]:
    return [(p, stamp(p)) for p in paths]


# A file changed again within the file system's clock tick keeps all four numbers (git's
# "racily clean" index entries): a same-size edit right after we stamped it would go unseen.
# A stamp this close to the clock is recorded as RACY, which no later stat matches, so the next
# start checks fully and stamps it again once it has settled. The tick is 1/HZ (<= 20 ms) where
# timestamps have nanoseconds; whole-second timestamps tell a coarse file system (FAT: 2 s).
RACY = "racy"
_TICK_NS = 20_000_000
_COARSE_TICK_NS = 2_000_000_000


def input_stamps(paths: list[str]) -> list[tuple[str, str]]:
    """:func:`stamps` of what a person or agent edits (the config, skills): those changed within
    a clock tick of now are RACY. The venv's own files are written only under our lock."""
    out: list[tuple[str, str]] = []
    for path in paths:
        text = stamp(path)
        # The time after the stat: a later edit's time is at least this tick's.
        out.append((path, RACY if is_racy(text, time.time_ns()) else text))
    return out


def is_racy(text: str, now: int) -> bool:
    """Whether the :func:`stamp` ``text``, taken at ``now`` (ns) or before, is within a clock
    tick of it: a same-size edit in that tick would leave it as it is."""
    if text == "-":
        return False
    _, _, mtime, ctime = (int(n) for n in text.split(":"))
    whole = mtime % 1_000_000_000 == 0 and ctime % 1_000_000_000 == 0
    return max(mtime, ctime) >= now - (_COARSE_TICK_NS if whole else _TICK_NS)


# A failure backing off (skill name, failures in a row, retry time in ISO 8601, error), and
# an invalid skill (name, error).
Failed = tuple[str, int, str, str]
Invalid = tuple[str, str]


def render(config_file: str, venv: str, python: str, stamped: list[tuple[str, str]],
           failed: tuple[Failed, ...] = (), until: float | None = None,
           refused: str | None = None, invalid: tuple[Invalid, ...] = (),
           kernel_server: bool = True) -> str:
    """The fingerprint text; ``stamped`` were taken before the check that found us ready,
    ``failed`` are the failures backing off then (skill name, failures in a row, retry time in
    ISO 8601, error), and the fingerprint holds ``until`` the first of them is due.
    ``invalid``: the skills whose SKILL.md no agent can load (name, error); their files are
    stamped, so the fingerprint holds while those are unchanged. ``refused``: the error of a
    rebuild backing off, which the warm path then answers with (exit 1) instead of the
    interpreter. ``kernel_server``: the config's key, which the warm ``run`` cannot read."""

    lines = [FORMAT, f"config\t{config_file}", f"venv\t{venv}", f"python\t{python}"]
    lines += [f"env\t{k}\t{os.environ.get(k, '')}" for k in ENV_KEYS]
    plain, trees = _by_tree(stamped)
    lines += [f"stat\t{p}\t{s}" for p, s in plain]
    lines += ["\t".join(["tree", root, *(f for entry in entries for f in entry)])
              for root, entries in trees.items()]
    if until is not None:
        lines.append(f"until\t{until!r}")
    # Errors escaped: one line, no tab; the warm path prints them in its warnings.
    lines += [f"failed\t{n}\t{count}\t{at}\t{escape(e)}" for n, count, at, e in failed]
    lines += [f"invalid\t{n}\t{escape(e)}" for n, e in invalid]
    if refused is not None:
        lines.append(f"refused\t{escape(refused)}")
    if not kernel_server:
        lines.append("kernel-server\toff")
    return "\n".join(lines) + "\n"


def _by_tree(stamped: list[tuple[str, str]]
             ) -> tuple[list[tuple[str, str]], dict[str, list[tuple[str, str]]]]:
    """``stamped`` apart: the paths in a git skill's tree (``<cache>/git/trees/SHA/NAME``),
    by tree (path in it, stamp), for one ``tree`` line each (warm._tree_holds), and the rest."""
    from bootstrap.warm import git_trees_dir

    prefix = f"{git_trees_dir()}/"
    plain: list[tuple[str, str]] = []
    trees: dict[str, list[tuple[str, str]]] = {}
    for path, text in stamped:
        parts = path[len(prefix):].split("/", 2) if path.startswith(prefix) else []
        if len(parts) < 2 or not all(parts[:2]):
            plain.append((path, text))
            continue
        root = f"{prefix}{parts[0]}/{parts[1]}"
        trees.setdefault(root, []).append((parts[2] if len(parts) > 2 else "", text))
    return plain, trees


def save(config_file: str, venv: str, python: str, stamped: list[tuple[str, str]],
         failed: tuple[Failed, ...] = (), until: float | None = None,
         refused: str | None = None, invalid: tuple[Invalid, ...] = (),
         kernel_server: bool = True) -> None:
    """Write the fingerprint (slow path only); a failure just means no warm path next time."""
    path = fingerprint_path(config_file)
    if path is None or any("\t" in p or "\n" in p for p, _ in stamped):
        return
    from bootstrap.primitives.atomic import write_atomic

    text = render(config_file, venv, python, stamped, failed, until, refused, invalid,
                  kernel_server)
    # Every warm in-process ensure() lands here; rewriting identical bytes cost an fsync'd
    # replace (~1.3 ms, more than the rest of the call) and broke "the warm path writes nothing".
    if read_text(path) == text:
        return
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, 0o755, exist_ok=True)  # no group/other write, whatever the umask
    except OSError:
        return
    if not trusted_dir(directory):
        # Never written through a link, nor where another user could write what we believe.
        from bootstrap.primitives import log
        log.warning("no warm start: the fingerprint directory is not a directory of this user "
                    "that only this user can write; remove it or chmod go-w it", path=directory)
        return
    try:
        write_atomic(Path(path), text.encode("utf-8"))
    except OSError:
        return  # no warm path next time, nothing worse


def forget(config_file: str) -> None:
    import contextlib

    path = fingerprint_path(config_file)
    # Never through a planted link: the name would be unlinked in whatever it points at.
    if path is not None and is_real_dir(Path(os.path.dirname(path))):
        with contextlib.suppress(OSError):
            os.unlink(path)
