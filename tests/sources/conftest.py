"""Fixtures for git sources: a world (fake uv) beside a served repository of skills."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.gitrepo import Daemon, Repo, daemon
from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path / "world")


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    """``served/skills``: skills ``pdf`` (a Python skill) and ``docx`` under ``skills/``."""
    made = Repo(tmp_path / "served" / "skills")
    made.skill("pdf", python=True)
    made.skill("docx")
    made.commit("first")
    return made


@pytest.fixture
def served(tmp_path: Path, repo: Repo) -> Iterator[Daemon]:
    with daemon(tmp_path / "served") as running:
        yield running


@pytest.fixture
def git_log(tmp_path: Path) -> Path:
    """A ``git`` first on PATH that logs each call, then runs the real one."""
    real = shutil.which("git")
    assert real is not None
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    log = tmp_path / "git-calls.log"
    shim = shim_dir / "git"
    shim.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(log))}\n'
                    f'exec {shlex.quote(real)} "$@"\n')
    shim.chmod(0o755)
    os.environ["PATH"] = f"{shim_dir}{os.pathsep}{os.environ['PATH']}"
    return log


def git_config(world: World, *entries: str, extra: str = "") -> None:
    """The world's config with ``skills`` holding these TOML entries (inline tables)."""
    world.config.write_text(f'venv = "venv"\nskills = [{", ".join(entries)}]\n{extra}',
                            encoding="utf-8")


def source(url: str, **keys: str) -> str:
    items = [f'git = "{url}"', *(f'{k} = "{v}"' for k, v in keys.items())]
    return "{ " + ", ".join(items) + " }"


def cache_root(world: World) -> Path:
    return Path(os.environ["XDG_CACHE_HOME"]) / "kernel-bootstrap" / "git"
