"""The names `bootstrap` exports are importable, and importing the package stays cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest

import bootstrap


@pytest.mark.parametrize("name", bootstrap.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(bootstrap, name) is not None


def test_status_is_the_read_only_check() -> None:
    from bootstrap.engine.status import status

    assert bootstrap.status is status


def test_importing_the_package_imports_no_submodule() -> None:
    code = ("import sys, bootstrap; "
            "print(sorted(m for m in sys.modules if m.startswith('bootstrap')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['bootstrap']"
