"""Helpers shared by the test modules. Append new helpers; do not rewrite others' code."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _fake_uv_needs_pythonpath() -> bool:
    """Whether a child `python -m fake_uv`, run from outside the repo, cannot import it.

    It can when kernel-bootstrap is installed (editable) in the venv running the tests; a plain
    checkout needs the repo root on PYTHONPATH. Asked once per session, from `/`, because `-m`
    puts the working directory on sys.path and would hide the difference.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([sys.executable, "-c", "import fake_uv.__main__"], cwd="/", env=env,
                           capture_output=True, check=False)
    return probe.returncode != 0


def fake_uv_shim(directory: Path) -> Path:
    """Write an executable `directory/uv` that runs fake_uv with this interpreter; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["#!/bin/sh"]
    if _fake_uv_needs_pythonpath():
        root = shlex.quote(str(REPO_ROOT))
        lines.append(f'PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH')
    lines.append(f'exec {shlex.quote(sys.executable)} -m fake_uv "$@"')
    shim = directory / "uv"
    shim.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shim.chmod(0o755)
    return shim


def read_uv_log(log: Path) -> list[list[str]]:
    """The argv of every fake_uv call logged to `log` ($FAKE_UV_LOG), oldest first."""
    return [entry["argv"] for entry in read_uv_entries(log)]


def read_uv_entries(log: Path) -> list[dict[str, Any]]:
    """Every fake_uv call, oldest first: ``argv`` and ``pid``, and for ``pip install`` calls
    that got as far as reading their requirements, ``editables`` (directory names) and
    ``requirements`` (names) — the contents of -r files included."""
    try:
        text = log.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    calls: list[dict[str, Any]] = []
    by_pid: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry.get("detail"):
            call = by_pid.get(entry["pid"])
            if call is not None:
                call["editables"] = entry["editables"]
                call["requirements"] = entry["requirements"]
            continue
        calls.append(entry)
        by_pid[entry["pid"]] = entry
    return calls


def make_skill(parent: Path, name: str, files: dict[str, str] | None = None,
               executables: tuple[str, ...] | list[str] = ()) -> Path:
    """A skill directory ``parent/name`` with SKILL.md plus ``files`` (rel -> text); the paths in
    ``executables`` get mode 0o755. (Added by the push tests.)"""
    root = parent / name
    root.mkdir(parents=True)
    (root / "SKILL.md").write_text(f"---\nname: {name}\ndescription: test skill\n---\n")
    for rel, text in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel in executables:
        (root / rel).chmod(0o755)
    return root


def run_with_tty_stderr(cmd: list[str], env: dict[str, str], timeout: float = 60.0,
                        ) -> tuple[int, str, str]:
    """Run ``cmd`` with stderr on a pseudo-terminal (stdout stays a pipe): what a person at a
    shell sees. Returns (exit code, stdout, stderr) with the terminal's CRLF turned back into LF.
    (Added by the logging and progress tests.)"""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=slave, env=env)
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
        else:
            proc.kill()
            raise AssertionError(f"{cmd} did not finish within {timeout} s")
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
        code = proc.wait(timeout=timeout)
    finally:
        os.close(master)
        if proc.stdout is not None:
            proc.stdout.close()
    return code, stdout, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


# --- child processes: start, wait, kill (moved here from test_crash.py) ----------------------
# (Added by the reliability tests; test_crash.py and test_safety.py import them from here.)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import pytest

    from tests.world import World


def start(world: World, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``ensure ARGS`` of ``world`` as a child in a process group of its own, so the kill takes
    uv (fake or real) down with it, as a sandbox teardown would."""
    return spawn(world.command("ensure", *args), {**world.env, **(env or {})})


def spawn(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def wait_for(predicate: Callable[[], object], timeout: float = 30.0,
             proc: subprocess.Popen[str] | None = None) -> None:
    """Poll ``predicate`` until true; with ``proc``, fail early (with its stderr) if it ends."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the child ended (exit {proc.returncode}) before the "
                                 f"condition was reached:\n{err}")
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def kill_group(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)


# --- seams: kill or fail one syscall of a kernel-bootstrap run ---------------------------------
#
# A rule names a call (os.replace, os.rename, the RENAME_EXCHANGE swap, os.write or os.fsync on
# a descriptor, the copy's syncfs), which of its calls to hit (by a path substring, by content,
# by its index in the run's trace, after `skip` matches, for `times` calls) and what to do:
# "kill" sends SIGKILL to the whole process group (before or after the real call), an errno
# name raises that OSError instead of making the call. A child gets its rules through
# $KB_SEAMS and runs the real CLI (SEAM_CHILD); in-process tests use apply_seams().
# Every replace/rename/exchange is numbered and, with $KB_SEAM_TRACE, logged as one JSON line
# (the marker's content in short for writes of a marker), so a test can find the index of,
# say, "the last marker write" in one run and kill exactly there in the next.

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
    import bootstrap.atomic
    import bootstrap.skilltree
    import bootstrap.swap

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
    exchange = wrap("exchange", bootstrap.atomic.exchange, two, lambda *_: b"")
    patches.append((bootstrap.swap, "exchange", exchange))
    if "write" in calls:
        patches.append((os, "write", wrap("write", os.write, lambda fd, *_: [_fd_path(fd)],
                                          lambda fd, data, *_: bytes(data))))
    if "fsync" in calls:
        patches.append((os, "fsync", wrap("fsync", os.fsync, lambda fd, *_: [_fd_path(fd)],
                                          lambda fd, *_: _read(_fd_path(fd)))))
    if "syncfs" in calls:
        patches.append((bootstrap.skilltree, "_sync_fs",
                        wrap("syncfs", bootstrap.skilltree._sync_fs,
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
    "from tests.helpers import install_seams_from_env\n"
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


# Linux carries a process's memory high-water mark across fork and exec into the child's
# ru_maxrss, so a child started straight from a pytest process that has grown to 250 MB reports
# >= 250 MB whatever it used itself (seen in CI, not in a short local run). A small launcher
# process starts the measured command and reports its wait4 figures instead.
_RSS_LAUNCHER = """
import json, os, subprocess, sys
proc = subprocess.Popen(json.loads(sys.argv[1]), stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss]))
"""


def peak_rss_run(argv: Sequence[str], env: dict[str, str], timeout: float = 600.0
                 ) -> tuple[int, float, int, str]:
    """Run ``argv``; return (exit code, wall seconds, peak RSS in bytes, stderr).

    The peak comes from ``os.wait4`` in a small launcher (see above): the child's own maximum
    resident set (Linux counts its waited-for children in too, e.g. the ``sh``/``tar`` of an
    exec push).
    """
    import time

    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _RSS_LAUNCHER, json.dumps(list(argv))],
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.monotonic() - began
    if done.returncode != 0 or not done.stdout.strip():
        raise AssertionError(f"the RSS launcher failed: {done.stderr[-2000:]}")
    code, maxrss = json.loads(done.stdout.strip().splitlines()[-1])
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
    return int(code), wall, int(maxrss) * scale, done.stderr


@contextlib.contextmanager
def sampling(classify: Callable[[], str], pause: float = 0.0) -> Iterator[Counter[str]]:
    """A reader thread counting ``classify()`` results continuously until the block ends."""
    counts: Counter[str] = Counter()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            counts[classify()] += 1
            if pause:
                time.sleep(pause)

    reader = threading.Thread(target=loop, daemon=True)
    reader.start()
    try:
        yield counts
    finally:
        stop.set()
        reader.join()
