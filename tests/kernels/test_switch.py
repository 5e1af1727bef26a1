"""Whether kernels are served: Linux only; there the environment variable wins over the
config."""

from __future__ import annotations

import sys

import pytest

from bootstrap.kernels import switch


@pytest.mark.parametrize("value, configured, expected", [
    ("", True, True), ("", False, False), ("0", True, False), ("1", False, True),
])
def test_the_environment_variable_wins_over_the_config(
        monkeypatch: pytest.MonkeyPatch, value: str, configured: bool, expected: bool) -> None:
    monkeypatch.setenv("KERNEL_BOOTSTRAP_KERNEL_SERVER", value)
    assert switch.enabled(configured) is (expected and sys.platform.startswith("linux"))


def test_never_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setenv("KERNEL_BOOTSTRAP_KERNEL_SERVER", "1")
    assert switch.enabled(True) is False
