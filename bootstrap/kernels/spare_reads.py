"""What a spare (:mod:`spare`) read before its claim that a request can change, and how a
request is compared with it.

The preparation runs with ``os.environ`` replaced by a mapping that notes every name looked up
(``os.getenv`` reads the module's global, so it is noted too; a copy or an iteration counts as
reading everything). Files: every config file the app loaded or looked for (absent ones too: one
created later is a change) and the profile's startup directory.
The server compares a request's kernel environment with its own (the spare's, as it was
forked) on those names, except the ones the claim redoes from the request's value, and
re-stamps the files; any difference means the request is forked instead, and a changed file
retires the spare.

Standard library only: the server imports this in the venv's interpreter.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from bootstrap.kernels import protocol
from bootstrap.warm import stamp  # the warm path's: what changes when a file is written

# Variables the preparation reads whose effect the claim redoes from the request's value.
_REDONE = frozenset({"JPY_SESSION_NAME", "MPLBACKEND", "JPY_PARENT_PID", "JPY_INTERRUPT_EVENT"})


@dataclass(frozen=True)
class Ready:
    """What a ready spare read that a request may change."""

    env: frozenset[str] | None  # the variables looked up; None: all of them (a copy)
    stamps: dict[str, str]  # path -> stamp()

    @classmethod
    def decode(cls, message: dict[str, object]) -> Ready | None:
        env, stamps = message.get("env"), message.get("stamps")
        if not (env is None or isinstance(env, list)) or not isinstance(stamps, dict):
            return None
        return cls(None if env is None else frozenset(map(str, env)),
                   {str(k): str(v) for k, v in stamps.items()})


def refusal(argv: list[str], env: dict[str, str], ready: Ready) -> str | None:
    """Why a request (``argv``, and ``env`` as its kernel would get it) cannot claim a spare
    that is ``ready``; None when it can. The spare saw the server's ``os.environ``."""
    if len(argv) != 4 or argv[2] != "-f":
        return "its arguments go beyond -f FILE"
    names = set(env) | set(os.environ) if ready.env is None else ready.env
    for name in sorted(names - _REDONE):
        if env.get(name) != os.environ.get(name):
            return f"{name} differs from what the spare read"
    return stale(ready)


def stale(ready: Ready) -> str | None:
    for path, was in ready.stamps.items():
        if stamp(path) != was:
            return f"{path} changed since the spare read it"
    return None


def decode_ready(line: bytes) -> Ready | str | None:
    """A spare's first message: :class:`Ready`, its failure (a string), or None if malformed."""
    message = protocol.decode(line)
    if message is None:
        return None
    if isinstance(message.get("failed"), str):
        return str(message["failed"])
    return Ready.decode(message) if message.get("ready") is True else None


class _Looked(MutableMapping[str, str]):
    """``os.environ`` during the preparation, noting every name looked up."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real
        self.names: frozenset[str] | None = frozenset()

    def _note(self, name: str | None) -> None:
        if self.names is not None:
            self.names = None if name is None else self.names | {name}

    def __getitem__(self, name: str) -> str:
        self._note(name)
        return self.real[name]

    def __contains__(self, name: object) -> bool:
        self._note(str(name))
        return name in self.real

    def __setitem__(self, name: str, value: str) -> None:
        self.real[name] = value

    def __delitem__(self, name: str) -> None:
        del self.real[name]

    def __iter__(self) -> Iterator[str]:
        self._note(None)
        return iter(self.real)

    def __len__(self) -> int:
        self._note(None)
        return len(self.real)

    def copy(self) -> dict[str, str]:
        self._note(None)
        return dict(self.real)


@contextlib.contextmanager
def recording_env() -> Iterator[_Looked]:
    real = os.environ
    looked = _Looked(real)
    # Replaced, not cleared: os.getenv reads the module global, and the values stay the same.
    os.environ = looked  # type: ignore[assignment]  # noqa: B003
    try:
        yield looked
    finally:
        os.environ = real  # noqa: B003


# The config files IPKernelApp looks for in each of its config directories (BaseIPythonApplication
# loads the base name, then the app's own).
_CONFIG_NAMES = tuple(f"{base}{suffix}" for base in ("ipython_config", "ipython_kernel_config")
                      for suffix in (".py", ".json"))


def stamps(app: Any) -> dict[str, str]:
    """The config files the app loaded or would have loaded had they existed, and the profile's
    startup directory (a startup file added or removed changes it). Not the profile directory
    itself: every kernel's history writes come and go there (sqlite's journal)."""
    paths = {os.path.abspath(p) for p in getattr(app, "loaded_config_files", [])}
    for directory in [*getattr(app, "config_file_paths", []), app.profile_dir.location]:
        paths.update(os.path.join(os.path.abspath(directory), name) for name in _CONFIG_NAMES)
    paths.add(os.path.abspath(app.profile_dir.startup_dir))
    return {path: stamp(path) for path in sorted(paths)}
