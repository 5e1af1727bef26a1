"""What a kernel server serves, and the check, at every request, that it is still current.

A server serves the generation its interpreter pinned itself to (``sys.prefix`` after the pin:
``<venv>``'s target at its start), with that generation's marker (``.bootstrap-version``: its
skill records change when a skill is added or removed without a rebuild), its interpreter, and
the config it read ``kernel-preload`` from. A kernel must never come from an environment that
differs from what ``ensure`` would give now (prime-agent's template, keyed by interpreter path
only, handed out kernels of an environment that had changed), so any difference makes the
server stale: it answers ``stale`` and exits, and the next start spawns a fresh one.

A by-hand install (``uv pip install traitlets==5.14.3``, ``%pip install -U ...`` in a notebook)
changes none of those, so the key also holds site-packages' own stat and the name and stat of
each ``*.dist-info`` directory and ``.pth`` file in it: what any install or uninstall rewrites.

Each check costs a ``realpath``, four ``stat`` calls and a scan of site-packages (about 0.2 ms
for an ipykernel venv); the marker's bytes are hashed again only when its stat changed.
"""

from __future__ import annotations

import hashlib
import os
import site
import sys
from dataclasses import dataclass

MARKER = ".bootstrap-version"  # bootstrap.env.marker.MARKER_NAME (not imported: venv interpreter)


def _stamp(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(16 * 1024 * 1024)).hexdigest()
    except OSError:
        return None


def _installed() -> tuple[object, ...] | None:
    """What an install changes in site-packages: its stat, and each ``*.dist-info`` directory's
    and ``.pth`` file's name and stat; None when it cannot be listed now (out of descriptors:
    unknown, not a change)."""
    found: list[object] = []
    for directory in site.getsitepackages([sys.prefix]):  # the pinned generation's
        found.append((directory, _stamp(directory)))
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        for entry in entries:
            if entry.name.endswith((".dist-info", ".pth")):
                found.append((entry.name, _stamp(entry.path)))
    return tuple(found)


@dataclass
class Key:
    venv: str
    generation: str
    config: str
    marker_stamp: tuple[int, int, int, int] | None
    marker_digest: str | None
    interpreter: tuple[int, int, int, int] | None
    config_stamp: tuple[int, int, int, int] | None
    installed: tuple[object, ...] | None

    @classmethod
    def now(cls, venv: str, config: str) -> Key:
        """The key of this process: ``sys.prefix`` is the generation the pin chose."""
        generation = os.path.realpath(sys.prefix)
        marker = os.path.join(generation, MARKER)
        return cls(venv, generation, config, _stamp(marker), _digest(marker),
                   _stamp(sys.executable), _stamp(config), _installed())

    def stale(self) -> str | None:
        """Why this server no longer serves (a new generation, a changed marker, interpreter or
        config); None while it is current. Updates the marker's stamp when only that changed."""
        if os.path.realpath(self.venv) != self.generation:
            return "the venv's current generation changed"
        if _stamp(sys.executable) != self.interpreter:
            return "the interpreter changed"
        if _stamp(self.config) != self.config_stamp:
            return "the config changed"
        installed = _installed()
        if installed is not None and installed != self.installed:
            return "a package was installed or removed in the venv"
        marker = os.path.join(self.generation, MARKER)
        stamp = _stamp(marker)
        if stamp != self.marker_stamp:
            if _digest(marker) != self.marker_digest:
                return "the skills changed"
            self.marker_stamp = stamp  # rewritten with the same records
        return None
