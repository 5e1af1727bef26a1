"""A locked venv's exactness (engine/exact.py), judged against a real interpreter's metadata:
what is neither pinned nor needed by a skill, and which pins drifted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.engine import exact


def _venv(root: Path, dists: dict[str, tuple[str, list[str]]]) -> Path:
    """A real venv (no pip) whose site-packages holds these distributions' metadata."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python*/site-packages"))
    for name, (version, requires) in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                 *(f"Requires-Dist: {r}" for r in requires)]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
    return root / "bin" / "python"


def _config(root: Path, pins: str) -> Path:
    (root / "pins.txt").write_text(pins)
    (root / "kernel-bootstrap.toml").write_text('venv = "venv"\nlock = "pins.txt"\n')
    return root / "kernel-bootstrap.toml"


def test_a_venv_holding_the_pins_and_the_skills_needs_is_exact(tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv", {"six": ("1.16.0", []),
                                      "My_Skill": ("0.1.0", ["Helper.Lib>=1; extra == 'x'"]),
                                      "helper-lib": ("1.2", [])})
    config = load_config(_config(tmp_path, "six==1.16.0 \\\n    --hash=sha256:00\n"))
    found = exact.inspect(config, python, ["my-skill"])
    # The skill's own requirement keeps helper-lib, markers unevaluated (the safe mistake).
    assert found.exact, found.lines()


def test_what_is_neither_pinned_nor_needed_and_what_drifted_are_named(tmp_path: Path) -> None:
    python = _venv(tmp_path / "venv", {"six": ("1.17.0", []), "stray": ("2.0", []),
                                      "my-skill": ("0.1.0", [])})
    config = load_config(_config(tmp_path, "six==1.16.0\nrequests==2.31.0\n"))
    found = exact.inspect(config, python, ["my-skill"])
    assert found.extra == {"stray": "2.0"}
    assert found.drifted == {"six": ("1.17.0", "1.16.0"), "requests": (None, "2.31.0")}
    assert found.lines() == [
        "package stray 2.0: neither pinned in pins.txt nor required by a skill",
        "package requests: not installed, pinned to 2.31.0 in pins.txt",
        "package six: 1.17.0, pinned to 1.16.0 in pins.txt",
    ]
