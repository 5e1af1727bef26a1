"""The real home directory, guarded: while a test runs, the suite may neither write where the
tool keeps a person's state nor start a child that would.

The guard used to compare what existed in the real home before and after each test, and so
blamed the suite for a directory the person made with the tool while the suite ran (and saw
nothing once they had used it). It now judges only what the suite itself does, seen through
audit hooks (PEP 578): a write by the test process under a watched directory, or a child
started with an environment or arguments that lead there (no ``HOME``, a ``HOME`` or XDG
directory in the real home, a path inside a watched directory). Whatever else writes there,
the person included, is none of the suite's business. A child the tool starts inherits its
environment, so a clean start is all the suite's own processes need.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

_APP: Final = "kernel-bootstrap"
# XDG variable, the default under HOME, and what of it the tool (or uv, or Jupyter) owns.
_XDG: Final = (("XDG_DATA_HOME", ".local/share", (_APP, "jupyter")),
               ("XDG_CACHE_HOME", ".cache", (_APP, "uv")),
               ("XDG_CONFIG_HOME", ".config", (_APP,)),
               ("XDG_STATE_HOME", ".local/state", (_APP,)))
_WRITE_FLAGS: Final = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)  # an open directory is a dir_fd to write in
# Audit events that change a path: event -> the positions of (path, dir_fd) pairs in its args.
_CHANGES: Final[dict[str, tuple[tuple[int, int | None], ...]]] = {
    "os.mkdir": ((0, 2),), "os.rmdir": ((0, 1),), "os.remove": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 3),),
    "os.truncate": ((0, None),), "os.mkfifo": ((0, 2),), "os.mknod": ((0, 3),),
    "shutil.rmtree": ((0, 1),),
}
# Audit events that start a program: event -> positions of (argv, env) in its args.
_STARTS: Final[dict[str, tuple[int, int | None]]] = {
    "subprocess.Popen": (1, 3), "os.posix_spawn": (1, 2), "os.exec": (1, 2),
    "os.spawn": (2, 3), "os.system": (0, None),
}
_JUDGED: Final = frozenset({"open", *_CHANGES, *_STARTS})
_guards: list[HomeGuard] = []  # the watching ones; one audit hook for all (it cannot be removed)


def tool_dirs(env: Mapping[str, str], home: Path) -> set[str]:
    """Where the tool, uv and Jupyter keep a person's state under ``env`` (platformdirs' XDG
    rules: a relative XDG value is ignored; no ``HOME`` means the account's, ``home``)."""
    base = Path(env.get("HOME") or home)
    found: set[str] = set()
    for var, default, owned in _XDG:
        value = env.get(var, "")
        root = Path(value) if os.path.isabs(value) else base / default
        found.update(os.path.normpath(root / name) for name in owned)
    if os.path.isabs(env.get("UV_CACHE_DIR", "")):
        found.add(os.path.normpath(env["UV_CACHE_DIR"]))
    return found


class HomeGuard:
    """The directories of the person's state under ``real_home`` and the launching ``environ``,
    and what the suite did to them while :meth:`watching`."""

    def __init__(self, real_home: Path, environ: Mapping[str, str]) -> None:
        self.real_home = real_home
        # Where the person's XDG variables put their state, and the defaults under the home.
        dirs = tool_dirs({**environ, "HOME": str(real_home)}, real_home) | \
            tool_dirs({"HOME": str(real_home)}, real_home)
        self.watched = frozenset(dirs | {os.path.realpath(d) for d in dirs})
        self.launch = dict(environ)
        self.offences: list[str] = []
        self._busy = False  # the hook's own calls must not come back into it

    @contextlib.contextmanager
    def watching(self) -> Iterator[list[str]]:
        """Record offences while the block runs; yields the list they go into."""
        _install()
        self.offences = []
        _guards.append(self)
        try:
            yield self.offences
        finally:
            _guards.remove(self)

    def inside(self, path: object, dir_fd: object = None) -> str | None:
        """``path`` (relative to ``dir_fd`` or the working directory) if a watched directory
        is it or holds it."""
        if isinstance(path, int) or not isinstance(path, str | bytes | os.PathLike):
            return None
        text = os.fsdecode(path)
        if isinstance(dir_fd, int) and not os.path.isabs(text):
            try:
                text = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
            except OSError:
                return None
        full = os.path.abspath(text)
        if any(full == w or full.startswith(w + os.sep) for w in self.watched):
            return full
        return None

    def environment_offences(self, env: Mapping[str, str], what: str) -> list[str]:
        """Why a process with ``env`` would read or write the person's state, if it would."""
        shared = tool_dirs(env, self.real_home) & self.watched
        found = [f"{what} would use {d}" for d in sorted(shared)]
        # A variable as the person launched us with it (a PATH through their kernel venv) is
        # theirs, not the suite's doing.
        found += [f"{what} names {p} in ${k}" for k, v in env.items()
                  if self.launch.get(k) != v and (p := self.inside(v)) is not None]
        return found

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in _JUDGED or self._busy:
            return
        self._busy = True
        try:
            self.offences.extend(self._judge(event, args))
        finally:
            self._busy = False

    def _judge(self, event: str, args: tuple[Any, ...]) -> list[str]:
        if event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and mode.strip("rbt") != "") or \
                bool(isinstance(flags, int) and flags & (_WRITE_FLAGS | _DIRECTORY))
            hit = self.inside(path) if writes else None
            return [f"open({hit!r}, {mode or flags!r})"] if hit else []
        if event in _CHANGES:
            hits = [self.inside(args[p], None if d is None else args[d])
                    for p, d in _CHANGES[event]]
            return [f"{event}({h!r})" for h in hits if h]
        if event in _STARTS:
            return self._start_offences(event, args)
        return []

    def _start_offences(self, event: str, args: tuple[Any, ...]) -> list[str]:
        at_argv, at_env = _STARTS[event]
        argv = args[at_argv]
        words = [argv] if isinstance(argv, str | bytes) else list(_strings(argv))
        what = f"{event} of {os.fsdecode(words[0]) if words else '?'}"
        env = args[at_env] if at_env is not None else None
        env = os.environ if env is None else {os.fsdecode(k): os.fsdecode(v)
                                              for k, v in dict(env).items()}
        found = self.environment_offences(env, what)
        found += [f"{what} names {p}" for w in words if (p := self.inside(w)) is not None]
        return found


def _strings(argv: object) -> Iterable[str | bytes]:
    if isinstance(argv, Iterable):
        return (a if isinstance(a, str | bytes) else os.fspath(a) for a in argv
                if isinstance(a, str | bytes | os.PathLike))
    return ()


def _hook(event: str, args: tuple[Any, ...]) -> None:
    for guard in _guards:
        guard.audit(event, args)


_installed: list[bool] = []


def _install() -> None:
    if not _installed:
        sys.addaudithook(_hook)
        _installed.append(True)
