"""The names `bootstrap` exports are importable, and importing the package stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import bootstrap


@pytest.mark.parametrize("name", bootstrap.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(bootstrap, name) is not None


CALLABLES = ("ensure", "status", "repair", "publish", "push", "load_config", "Config",
             "EnsureResult", "BootstrapError", "ConfigError", "SkillError", "LockTimeout",
             "UvError")


def test_each_callable_of_the_api_is_the_same_callable_on_every_access() -> None:
    # In a fresh interpreter: importing a submodule used to replace the function of the same
    # name (bootstrap.repair was the function, then the module; `from bootstrap import push`
    # gave the module). Each name is read, its module imported as a caller would, read again.
    code = (
        "import importlib, json, bootstrap\n"
        f"names = {CALLABLES!r}\n"
        "first = {n: getattr(bootstrap, n) for n in names}\n"
        "for n in names:\n"
        "    importlib.import_module(first[n].__module__)\n"
        "from bootstrap import ensure, publish, push, repair, status\n"
        "again = {n: getattr(bootstrap, n) for n in names}\n"
        "print(json.dumps({n: [callable(first[n]), callable(again[n]), first[n] is again[n]]\n"
        "                  for n in names}))\n"
        "assert all(callable(f) for f in (ensure, publish, push, repair, status))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == {n: [True, True, True] for n in CALLABLES}


def test_status_is_the_read_only_check() -> None:
    from bootstrap.engine.status import status

    assert bootstrap.status is status


def test_importing_the_package_imports_no_submodule() -> None:
    code = ("import sys, bootstrap; "
            "print(sorted(m for m in sys.modules if m.startswith('bootstrap')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['bootstrap']"
