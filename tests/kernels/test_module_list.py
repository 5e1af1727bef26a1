"""The debugger's module list made in the server (bootstrap.kernels.module_list): what
ipykernel's ``IPythonKernel.__init__`` reads through it is what its own walk of ``sys.modules``
reads, modules imported and removed since the list was made included."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.kernels import module_list

# ipykernel's own walk (IPythonKernel.__init__), in a module of the name the view is made for.
WALK = ('def walk():\n'
        '    return [m.__file__ for m in sys.modules.copy().values()\n'
        '            if hasattr(m, "__file__") and m.__file__]\n')


def module(name: str, source: str, file: str | None = None) -> types.ModuleType:
    made = types.ModuleType(name)
    if file is not None:
        made.__file__ = file
    exec(source, made.__dict__)
    return made


@pytest.fixture
def ipkernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in ``ipykernel.ipkernel`` holding the walk, and an empty list afterwards."""
    fake = module("ipykernel.ipkernel", "import sys\n" + WALK, "/site/ipykernel/ipkernel.py")
    monkeypatch.setitem(sys.modules, "ipykernel.ipkernel", fake)
    monkeypatch.setattr(module_list, "_listed", [])
    monkeypatch.setattr(module_list, "_known", frozenset())
    yield fake


def test_the_listed_walk_is_the_real_one_with_what_changed_since(
        ipkernel: types.ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "kb_test_gone", module("kb_test_gone", "", "/gone.py"))
    monkeypatch.setitem(sys.modules, "kb_test_kept", module("kb_test_kept", "", "/kept.py"))
    module_list.list_now()
    del sys.modules["kb_test_gone"]  # removed since: not listed
    monkeypatch.setitem(sys.modules, "kb_test_new", module("kb_test_new", "", "/new.py"))
    monkeypatch.setitem(sys.modules, "kb_test_nofile", module("kb_test_nofile", ""))
    real = ipkernel.walk()
    with module_list.listed():
        assert ipkernel.sys is not sys  # the view, while the kernel is made
        listed = ipkernel.walk()
    assert ipkernel.sys is sys
    assert listed == real
    assert "/kept.py" in listed and "/new.py" in listed and "/gone.py" not in listed


def test_main_is_read_where_it_is_now(ipkernel: types.ModuleType,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    module_list.list_now()
    monkeypatch.setitem(sys.modules, "__main__", module("__main__", "", "/launcher.py"))
    with module_list.listed():
        listed = ipkernel.walk()
    assert listed == ipkernel.walk() and "/launcher.py" in listed


def test_nothing_listed_leaves_ipykernel_its_own_walk(ipkernel: types.ModuleType) -> None:
    with module_list.listed():
        assert ipkernel.sys is sys


def test_an_import_in_another_thread_meanwhile_means_the_real_walk(
        ipkernel: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """ipykernel's IOPub thread runs while a forked kernel is made: the view's walk of
    ``sys.modules`` is not one step as ``copy()`` is, and a module imported meanwhile must
    make it give way to the real walk, not fail the kernel's start. The import is made at the
    walk's first step (the seam: its test of a name against the list)."""
    module_list.list_now()
    monkeypatch.setitem(sys.modules, "kb_test_new", module("kb_test_new", "", "/new.py"))

    class ImportingMeanwhile(frozenset[str]):
        def __contains__(self, name: object) -> bool:
            monkeypatch.setitem(sys.modules, "kb_test_meanwhile", module("kb_test_meanwhile", ""))
            return super().__contains__(name)

    monkeypatch.setattr(module_list, "_known", ImportingMeanwhile(module_list._known))
    with module_list.listed():
        assert ipkernel.sys is sys  # the real walk
        assert "/new.py" in ipkernel.walk()
