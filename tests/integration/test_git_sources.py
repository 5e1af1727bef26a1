"""A Python skill from a git source (a real `git daemon`), installed editable by the real uv
from its read-only materialised tree, imported in the venv."""

from __future__ import annotations

import json
from pathlib import Path

from testing.gitrepo import Repo, daemon
from tests.integration.conftest import RealWorld


def test_a_python_skill_from_git_is_installed_editable_and_imports(
        real: RealWorld, tmp_path: Path) -> None:
    repo = Repo(tmp_path / "served" / "tools")
    repo.skill("gitskill", python=True)
    repo.commit("first")
    with daemon(tmp_path / "served") as served:
        real.config.write_text(
            'venv = "venv"\n'
            f'skills = [{{ git = "{served.url("tools")}", subdirectory = "skills/gitskill" }}]\n')
        out = json.loads(real.ensure("--json").stdout)
    assert out["failed"] == [] and out["installed"] == ["gitskill"]
    assert real.imports("gitskill")
    # Editable: the venv points into the materialised tree in the cache, not at a copy.
    listed = real.run("status", "--json")
    assert listed.returncode == 0, listed.stderr
    pth = "".join(p.read_text() for p in real.venv.glob("lib/python*/site-packages/*.pth"))
    assert "/git/trees/" in pth and "gitskill" in pth
