"""`gc` of the git cache never removes a tree that a venv still uses: not between
`lock --upgrade` and the next `ensure` (no skills lock names the old tree then), and not while
an older generation that uses it runs a kernel. Real `git daemon`, the fake uv."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.gitrepo import Daemon, Repo
from testing.world import World
from tests.sources.conftest import cache_root, git_config, source

# Waits on stdin after saying it started: a kernel running from its generation.
KERNEL = "import sys; print('up', flush=True); sys.stdin.readline()"


def _tree_of(world: World, name: str, venv: Path | None = None) -> Path:
    """The directory the venv's marker says the skill ``name`` is installed from."""
    marker = json.loads(((venv or world.venv) / ".bootstrap-version").read_text())
    return Path(marker["skills"][name]["path"])


def _age_cache(world: World, days: float) -> None:
    then = time.time() - days * 86400
    for entry in [*(cache_root(world) / "trees").iterdir(),
                  *(cache_root(world) / "repos").iterdir()]:
        os.utime(entry, (then, then))


def _gc(world: World) -> list[str]:
    done = world.run("gc", "--json", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    said: list[str] = json.loads(done.stdout)["done"]
    return said


def _moved_on(world: World, repo: Repo) -> None:
    repo.write("skills/pdf/NEW.txt", "moved on\n")
    repo.commit("second")
    upgraded = world.run("lock", "--upgrade", env=dict(os.environ))
    assert upgraded.returncode == 0, upgraded.stderr


@pytest.fixture
def installed(world: World, served: Daemon) -> Path:
    """`pdf` (a Python skill) installed editable from its tree; that tree."""
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    world.ensure(env=dict(os.environ))
    assert world.imports("pdf")
    return _tree_of(world, "pdf")


def test_gc_after_lock_upgrade_keeps_the_tree_the_installed_editable_uses(
        world: World, repo: Repo, installed: Path) -> None:
    _moved_on(world, repo)
    assert installed.name == "pdf" and installed.parent.name not in (
        world.root / "skills-lock.toml").read_text()  # no lock names it now
    _age_cache(world, 31)
    said = "\n".join(_gc(world))
    assert installed.is_dir() and str(installed.parent) not in said
    assert world.imports("pdf")  # the editable still points at a tree that is there
    # Once ensure has moved the venv on, nothing uses the old tree: the next gc removes it.
    world.ensure(env=dict(os.environ))
    assert _tree_of(world, "pdf") != installed
    _age_cache(world, 31)
    said = "\n".join(_gc(world))
    assert not installed.parent.exists() and str(installed.parent) in said
    assert world.imports("pdf")


@pytest.fixture
def kernel(world: World, installed: Path) -> Iterator[subprocess.Popen[str]]:
    """A kernel started from the venv's generation (its pin holds the generation)."""
    proc = subprocess.Popen([str(world.python), "-c", KERNEL], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    yield proc
    proc.kill()
    proc.wait()


def test_gc_keeps_the_tree_an_older_generation_in_use_uses(
        world: World, repo: Repo, installed: Path, kernel: subprocess.Popen[str]) -> None:
    old = world.venv.resolve()
    _moved_on(world, repo)
    # A new runtime: a new generation, with the new tree; the kernel keeps the old one.
    world.config.write_text(world.config.read_text() + 'requirements = ["six"]\n')
    world.ensure(env=dict(os.environ))
    assert world.venv.resolve() != old and _tree_of(world, "pdf") != installed
    _age_cache(world, 31)
    _gc(world)
    assert old.is_dir() and installed.is_dir()
    done = subprocess.run([str(old / "bin" / "python"), "-c", "import pdf"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
