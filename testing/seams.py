"""Seams: kill or fail one syscall of a kernel-bootstrap run, in this process or in a child.

A rule names a call (os.replace, os.rename, the RENAME_EXCHANGE swap or conversion, os.write
or os.fsync on a descriptor, the copy's syncfs), which of its calls to hit (by a path
substring, by content, by its index in the run's trace, after `skip` matches, for `times`
calls) and what to do: "kill" sends SIGKILL to the whole process group (before or after the
real call), an errno name raises that OSError instead of making the call. A child gets its
rules through $KB_SEAMS and runs the real CLI (SEAM_CHILD); in-process tests use apply_seams().
Every replace/rename/exchange is numbered and, with $KB_SEAM_TRACE, logged as one JSON line
(the marker's content in short for writes of a marker), so a test can find the index of,
say, "the last marker write" in one run and kill exactly there in the next.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testing import REPO_ROOT

if TYPE_CHECKING:
    import pytest


SEAMS_ENV = "KB_SEAMS"
TRACE_ENV = "KB_SEAM_TRACE"
TRACED = ("replace", "rename", "exchange")
_TMP_NAME = re.compile(r"^\.(?P<name>.+)\.tmp-\d+-[0-9a-f]+$")


@dataclass(frozen=True)
class Seam:
    call: str  # replace | rename | exchange | write | fsync | syncfs
    action: str  # "kill", or an errno name: ENOSPC, EIO, EACCES, ...
    match: str = ""  # a substring of one of the paths involved
    path: str = ""  # or exactly one of them (a directory's fsync: the directory itself)
    contains: str = ""  # a substring of the bytes written / being replaced in
    index: int | None = None  # the call's number in the trace (replace/rename/exchange)
    skip: int = 0  # let this many matching calls through first
    times: int | None = None  # then hit this many (None: every later one)
    when: str = "before"  # "after": kill once the real call has returned
    message: str = ""  # the OSError's text (default: os.strerror)


@dataclass
class SeamRun:
    """The rules in force in one process, the calls seen, and what was hit."""

    rules: list[Seam]
    trace: str | None = None
    count: int = 0
    hits: list[int] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hits = [0] * len(self.rules)

    def pick(self, call: str, paths: list[str], data: Callable[[], bytes]
             ) -> tuple[Seam | None, int | None]:
        index = None
        if call in TRACED:
            index, self.count = self.count, self.count + 1
            self.log({"i": index, "call": call, "paths": paths, **_summary(call, paths)})
        for n, rule in enumerate(self.rules):
            if rule.call != call or (rule.index is not None and rule.index != index):
                continue
            if rule.match and not any(rule.match in p for p in paths):
                continue
            if rule.path and rule.path not in paths:
                continue
            if rule.contains and rule.contains.encode() not in data():
                continue
            self.hits[n] += 1
            seen = self.hits[n] - rule.skip
            if seen >= 1 and (rule.times is None or seen <= rule.times):
                return rule, index
        return None, index

    def act(self, rule: Seam, call: str, paths: list[str], index: int | None) -> None:
        event = {"event": rule.action, "call": call, "paths": paths, "i": index}
        if rule.action == "kill":
            self.log(event)
            assert os.getpgrp() == os.getpid(), "BUG: a kill seam outside its own process group"
            os.killpg(os.getpgrp(), signal.SIGKILL)
        code = getattr(errno, rule.action)
        self.faults.append({**event, "previous": _previous_bytes(call, paths)})
        self.log(event)
        text = rule.message or os.strerror(code)
        if call in ("write", "fsync"):
            raise OSError(code, text)  # as the kernel reports it: no file name on an fd
        raise OSError(code, text, paths[0], None, *paths[1:2])

    def log(self, entry: dict[str, Any]) -> None:
        if self.trace:
            _append(self.trace, json.dumps(entry) + "\n")



_REAL: dict[str, Any] = {}


def _append(path: str, text: str) -> None:
    write = _REAL.get("write", os.write)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        write(fd, text.encode())
    finally:
        os.close(fd)


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _previous_bytes(call: str, paths: list[str]) -> bytes | None:
    """What the file being replaced holds at the instant of a fault (None: nothing there)."""
    target = paths[1] if call in ("replace", "rename") and len(paths) > 1 else paths[0]
    m = _TMP_NAME.match(os.path.basename(target))
    if m and call != "replace":
        target = os.path.join(os.path.dirname(target), m["name"])
    return _read(target) if os.path.isfile(target) else None


def _summary(call: str, paths: list[str]) -> dict[str, Any]:
    """For a marker write: which skills and failures it records, and whether an attempt."""
    if call != "replace" or not paths[-1].endswith("/.bootstrap-version"):
        return {}
    try:
        data = json.loads(_read(paths[0]))
        return {"marker": {"skills": sorted(data["skills"]), "failed": sorted(data["failed"]),
                           "attempt": "attempt" in data}}
    except (ValueError, KeyError, TypeError):
        return {"marker": None}


def seam_patches(run: SeamRun) -> list[tuple[object, str, object]]:
    """(object, attribute, replacement) for every seam; the caller applies them."""
    import bootstrap.env.generations
    import bootstrap.primitives.atomic
    import bootstrap.primitives.swap
    import bootstrap.trees.skilltree

    calls = {r.call for r in run.rules}
    patches: list[tuple[object, str, object]] = []

    def wrap(call: str, real: Callable[..., Any], paths_of: Callable[..., list[str]],
             data_of: Callable[..., bytes]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            paths = paths_of(*args)
            rule, index = run.pick(call, paths, lambda: data_of(*args))
            if rule is not None and rule.when == "before":
                run.act(rule, call, paths, index)
            result = real(*args, **kwargs)
            if rule is not None and rule.when == "after":
                run.act(rule, call, paths, index)
            return result

        return patched

    def two(a: Any, b: Any, *_: Any) -> list[str]:
        return [os.fsdecode(a), os.fsdecode(b)]

    _REAL.setdefault("write", os.write)
    for name in ("replace", "rename"):
        patches.append((os, name, wrap(name, getattr(os, name), two,
                                       lambda a, *_: _read(os.fsdecode(a)))))
    exchange = wrap("exchange", bootstrap.primitives.atomic.exchange, two, lambda *_: b"")
    patches.append((bootstrap.primitives.swap, "exchange", exchange))
    patches.append((bootstrap.env.generations, "exchange", exchange))  # the conversion
    if "write" in calls:
        patches.append((os, "write", wrap("write", os.write, lambda fd, *_: [_fd_path(fd)],
                                          lambda fd, data, *_: bytes(data))))
    if "fsync" in calls:
        patches.append((os, "fsync", wrap("fsync", os.fsync, lambda fd, *_: [_fd_path(fd)],
                                          lambda fd, *_: _read(_fd_path(fd)))))
    if "syncfs" in calls:
        patches.append((bootstrap.trees.skilltree, "_sync_fs",
                        wrap("syncfs", bootstrap.trees.skilltree._sync_fs,
                             lambda p, *_: [os.fsdecode(p)], lambda *_: b"")))
    return patches


def apply_seams(m: pytest.MonkeyPatch, *rules: Seam, trace: Path | None = None) -> SeamRun:
    """Install ``rules`` in this process for the life of ``m`` (a monkeypatch.context())."""
    run = SeamRun(list(rules), str(trace) if trace else None)
    for obj, name, replacement in seam_patches(run):
        m.setattr(obj, name, replacement)
    return run


def install_seams_from_env() -> None:
    """In a child: install the rules of $KB_SEAMS for the rest of the process."""
    rules = [Seam(**r) for r in json.loads(os.environ.get(SEAMS_ENV) or "[]")]
    run = SeamRun(rules, os.environ.get(TRACE_ENV) or None)
    for obj, name, replacement in seam_patches(run):
        setattr(obj, name, replacement)


# The real CLI, with the seams of $KB_SEAMS installed first.
SEAM_CHILD = (
    "import sys\n"
    "from testing.seams import install_seams_from_env\n"
    "install_seams_from_env()\n"
    "from bootstrap.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def seam_argv(cli_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-c", SEAM_CHILD, *cli_args]


def seam_env(base: dict[str, str], *rules: Seam, trace: Path | None = None) -> dict[str, str]:
    env = {**base, SEAMS_ENV: json.dumps([asdict(r) for r in rules]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                       base.get("PYTHONPATH", "")]))}
    if trace is not None:
        env[TRACE_ENV] = str(trace)
    return env


def read_trace(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    except FileNotFoundError:
        return []

