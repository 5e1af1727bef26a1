"""Whether the server may fork a kernel for a request: everything a forked kernel cannot
reproduce sends the request to the ordinary start (``{"ordinary": REASON}``), never to a failed
kernel.

A request is refused when the server does not serve at all (``not_serving``: a preload left a
thread), is not an ipykernel launch (:func:`protocol.served_module`), is another venv's,
generation's or config's (two configs naming one venv would share
one server's ``kernel-preload``), when a variable that acts only at interpreter start differs
(:func:`protocol.ordinary_reason`), when the launcher's context differs from the server's
(:mod:`context`), when it asks the server to make the gate's warm check for it (the native
stand-in's ``"warm": true``) and that does not hold (:mod:`gate`), or when the kernel's
directory holds a module that would shadow one the server has imported: ``-m`` puts the start's
directory first on ``sys.path``, so a bare kernel started beside a ``sqlite3.py`` imports that
file, and a forked one must not differ.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from bootstrap.kernels import context, gate, protocol

_SUFFIXES = (".py", ".pyc", ".pyw")


@dataclass(frozen=True)
class Server:
    """What the server is, as requests are compared with it."""

    venv: str
    generation: str
    config: str
    started_env: dict[str, str]
    context: context.Context
    loaded: frozenset[str]  # top-level names of the modules imported from files
    not_serving: str | None = None

    @classmethod
    def now(cls, venv: str, generation: str, config: str, started_env: dict[str, str],
            not_serving: str | None) -> Server:
        return cls(venv, generation, _real(config), started_env, context.own(), _loaded(),
                   not_serving)


def refusal(server: Server, message: dict[str, object], env: dict[str, str], cwd: str,
            peer: int) -> tuple[str | None, context.Context | None]:
    """Why the request ``message`` (from process ``peer``, its ``env`` and ``cwd`` checked
    already) gets the ordinary start, or None and the context its kernel must carry."""
    argv = message.get("argv")
    launch = isinstance(argv, list) and protocol.served_module(argv) is not None
    reason = server.not_serving or _other(server, message) \
        or (None if launch else "not an ipykernel launch") \
        or protocol.ordinary_reason(env, server.started_env) \
        or (gate.refusal(message.get("config"), message.get("venv"), env)
            if message.get("warm") is True else None)
    if reason is not None:
        return reason, None
    securebits = message.get("securebits")
    if not isinstance(securebits, int) or isinstance(securebits, bool):
        return "the request carries no securebits", None
    try:
        theirs = context.read(peer, securebits)
    except (OSError, ValueError, KeyError, IndexError) as e:
        return f"its launcher's context cannot be read ({e})", None
    reason = context.refusal(theirs, server.context) or _shadowed(cwd, server.loaded)
    return reason, (theirs if reason is None else None)


def _other(server: Server, message: dict[str, object]) -> str | None:
    if message.get("venv") != server.venv:
        return "the kernel server serves another venv"
    if message.get("generation") != server.generation:
        return "the kernel server serves another generation"
    config = message.get("config")
    if not isinstance(config, str) or _real(config) != server.config:
        return "the kernel server serves another config"
    return None


def _shadowed(cwd: str, loaded: frozenset[str]) -> str | None:
    """A module in ``cwd`` that a bare start would import instead of one the server has."""
    try:
        names = os.listdir(cwd)
    except OSError as e:
        return f"its directory cannot be listed ({e.strerror})"
    for name in names:
        module = _module_name(cwd, name)
        if module in loaded:
            return f"{name} in its directory would shadow the module {module}"
    return None


def _module_name(cwd: str, name: str) -> str | None:
    """The top-level module ``name`` in a ``sys.path`` directory would provide, if any."""
    stem, dot, suffix = name.partition(".")
    if dot and ("." + suffix in _SUFFIXES or suffix.endswith("so")):
        return stem
    if not dot and any(os.path.exists(os.path.join(cwd, name, "__init__" + s))
                       for s in _SUFFIXES[:2]):
        return name  # a regular package (a directory without __init__ shadows nothing)
    return None


def _loaded() -> frozenset[str]:
    """Top-level modules imported from a file (built-in and frozen ones cannot be shadowed)."""
    names = set()
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None)
        if "." in name or name in sys.builtin_module_names or origin in (None, "frozen",
                                                                          "built-in"):
            continue
        names.add(name)
    return frozenset(names)


def _real(path: str) -> str:
    return os.path.realpath(path) if path else ""
