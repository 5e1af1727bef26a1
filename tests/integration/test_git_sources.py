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


def test_a_typo_in_the_branch_leaves_the_real_install_importable_and_the_lock_as_it_was(
        real: RealWorld, tmp_path: Path) -> None:
    repo = Repo(tmp_path / "served" / "tools")
    repo.skill("gitskill", python=True)
    repo.commit("first")
    entry = '{{ git = "{url}", branch = "{branch}", subdirectory = "skills/*" }}'
    with daemon(tmp_path / "served") as served:
        url = served.url("tools")
        real.config.write_text(
            f'venv = "venv"\nskills = [{entry.format(url=url, branch="main")}]\n')
        real.ensure()
        lock = real.root / "skills-lock.toml"
        locked = lock.read_bytes()
        real.config.write_text(
            f'venv = "venv"\nskills = [{entry.format(url=url, branch="mian")}]\n')
        kept = real.ensure("--json")
        strict = real.run("ensure", "--strict")
    assert json.loads(kept.stdout)["removed"] == [] and real.imports("gitskill")
    assert url in kept.stderr and "mian" in kept.stderr and "gitskill" in kept.stderr
    assert lock.read_bytes() == locked
    assert strict.returncode == 3, strict.stderr
    assert not [c for c in real.uv_calls() if c[:2] == ["pip", "uninstall"]]
