"""`kernel-bootstrap init`: a starter config that works as written, never written over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bootstrap.commands.init import STARTER


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bootstrap", *args], capture_output=True,
                          text=True, cwd=cwd, check=False)


def test_init_writes_the_file_discovery_finds_and_status_accepts_it(tmp_path: Path) -> None:
    result = cli(tmp_path, "init")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "kernel-bootstrap.toml").read_text() == STARTER
    status = cli(tmp_path, "status", "--json")
    assert status.returncode == 1, status.stderr  # accepted, and not built yet
    assert status.stderr == ""


def test_the_starter_explains_every_key_it_leaves_commented(tmp_path: Path) -> None:
    from bootstrap.config import _KEYS

    for key in _KEYS:
        assert f"\n# {key} = " in STARTER or f"\n{key} = " in STARTER, key


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    target = tmp_path / "kernel-bootstrap.toml"
    target.write_text("venv = 'mine'\n")
    result = cli(tmp_path, "init")
    assert result.returncode == 2 and "--force" in result.stderr
    assert target.read_text() == "venv = 'mine'\n"
    assert cli(tmp_path, "init", "--force").returncode == 0
    assert target.read_text() == STARTER


def test_init_config_path_writes_there(tmp_path: Path) -> None:
    assert cli(tmp_path, "init", "--config", "conf/k.toml").returncode == 0
    assert (tmp_path / "conf" / "k.toml").read_text() == STARTER
    assert cli(tmp_path, "status", "--config", "conf/k.toml").returncode == 1


def test_init_does_not_write_over_a_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    result = cli(tmp_path, "init", "--config", "pyproject.toml", "--force")
    assert result.returncode == 2 and "[tool.kernel-bootstrap]" in result.stderr
    assert (tmp_path / "pyproject.toml").read_text() == "[project]\nname = 'x'\n"
