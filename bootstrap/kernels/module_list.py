"""The list of loaded modules' files that ipykernel's ``IPythonKernel.__init__`` makes for its
debugger, made once in the server instead of in every kernel.

``IPythonKernel.__init__`` walks ``sys.modules.copy().values()`` and reads each module's
``__file__``. In a kernel forked from the server that walk writes the reference count of every
module object, of every name in ``sys.modules`` and of every file name, and so copies every page
those objects sit on out of the server's: 1.4 MiB in each kernel, of its ~16.5 MiB of private
pages (BENCHMARKS.md, "The module list made once"). The server lists them before its first fork
(:func:`list_now`, beside ``gc.freeze()``: copies of the names and files, made together, so the
list's objects sit on a few pages of their own); while a kernel is made (:func:`listed`),
ipykernel's module reads ``sys.modules`` through a view that answers from that list, with the
modules imported since added and those removed since left out, in ``sys.modules``'s order, as
the walk would have found them. ``__main__`` is read where it is now (``runpy`` replaced it for
the kernel).

Finding what changed takes no reference to what ``sys.modules`` holds but the names imported
since the list was made and one listed name (membership tests, and a walk from its newest name
back to the newest listed one), so it copies next to nothing of the server's. A module replaced
under the same name since the server listed it (``__main__`` aside) is listed with the server's
file: only the debugger's rules read the list.

Runs in the server and its forks, in the venv's interpreter: standard library only.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any


class _File:
    """A module as ``IPythonKernel.__init__`` reads one: its ``__file__``."""

    __slots__ = ("__file__",)

    def __init__(self, file: str) -> None:
        self.__file__ = file


class _Modules:
    """``sys.modules`` for ``copy().values()``: the listed modules still loaded, then those
    loaded since."""

    def __init__(self, values: list[object]) -> None:
        self._values = values

    def copy(self) -> _Modules:
        return self

    def values(self) -> list[object]:
        return self._values


class _Sys(types.ModuleType):
    """``sys`` with ``modules`` answered by :class:`_Modules`, everything else the real one's."""

    def __init__(self, modules: _Modules) -> None:
        super().__init__("sys")
        self.modules = modules

    def __getattr__(self, name: str) -> Any:
        return getattr(sys, name)


# (name, _File or None) for each module the server had loaded, in sys.modules's order, and the
# names: copies, made together, so that reading them copies none of the server's own objects.
_listed: list[tuple[str, _File | None]] = []
_known: frozenset[str] = frozenset()


def _copy(text: str) -> str:
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def list_now() -> None:
    """List the loaded modules and their files (in the server, before its first fork)."""
    global _listed, _known
    _listed = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        _listed.append((_copy(name), _File(_copy(file)) if isinstance(file, str) else None))
    _known = frozenset(name for name, _ in _listed)


def _now() -> list[object] | None:
    """What ``sys.modules.copy().values()`` holds now, the listed modules' files from
    :data:`_listed`; None when nothing was listed, nothing listed is loaded any more, or
    another thread imported meanwhile (ipykernel's IOPub thread runs as a forked kernel is
    made; ``copy()`` is one step, this walk is not): the real walk then."""
    if not _listed:
        return None
    try:
        return _read()
    except (RuntimeError, KeyError):  # changed size during iteration; removed meanwhile
        return None


def _read() -> list[object] | None:
    added: list[str] = []
    for name in reversed(sys.modules):  # the newest first: what was imported since
        if name in _known:
            break
        added.append(name)
    else:
        return None
    values: list[object] = []
    for name, file in _listed:
        if name not in sys.modules:
            continue
        if name == "__main__":
            values.append(sys.modules[name])
        elif file is not None:
            values.append(file)
    values.extend(sys.modules[name] for name in reversed(added))
    return values


@contextlib.contextmanager
def listed() -> Iterator[None]:
    """While the block makes the kernel, ``IPythonKernel.__init__`` reads the listed modules
    (nothing changes where nothing was listed or ipykernel has no such module)."""
    module: Any = sys.modules.get("ipykernel.ipkernel")
    values = _now() if getattr(module, "sys", None) is sys else None
    if values is None:
        yield
        return
    module.sys = _Sys(_Modules(values))
    try:
        yield
    finally:
        module.sys = sys
