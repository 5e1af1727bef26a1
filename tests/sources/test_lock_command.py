"""`kernel-bootstrap lock` with git sources, and `ensure --locked` / `run --locked`, against
the fake uv and real `git daemon` repositories."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from testing.gitrepo import Daemon, Repo
from testing.world import World
from tests.sources.conftest import git_config, source


def _lock(world: World) -> Path:
    return world.root / "skills-lock.toml"


def _run_json(world: World, *args: str, code: int = 0) -> dict[str, Any]:
    result = world.run(*args, "--json", env=dict(os.environ))
    assert result.returncode == code, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _commits(world: World) -> list[str]:
    return re.findall(r'^commit = "([0-9a-f]{40})"$', _lock(world).read_text(), re.M)


def _editable_dirs(world: World) -> list[str]:
    return [e for call in world.installs() for e in call.editables]


def test_lock_with_only_git_sources_writes_the_skills_lock(
        world: World, served: Daemon, repo: Repo) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    data = _run_json(world, "lock")
    assert "lockfile" not in data  # no runtime `lock` key: the skills lock alone
    lock = data["skills_lock"]
    assert lock["path"] == str(_lock(world)) and lock["changed"] and lock["failed"] == []
    assert sorted(s["name"] for s in lock["skills"]) == ["docx", "pdf"]
    assert _commits(world) == [repo.head()] * 2
    assert world.installs() == []  # lock pins; it installs nothing
    again = _run_json(world, "lock")
    assert not again["skills_lock"]["changed"]


def test_lock_with_a_runtime_lock_does_both_files(
        world: World, served: Daemon, repo: Repo) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"),
               extra='requirements = ["six"]\nlock = "requirements.lock"\n')
    data = _run_json(world, "lock")
    assert data["lockfile"] == str(world.root / "requirements.lock") and data["changed"]
    assert (world.root / "requirements.lock").is_file()
    assert [s["name"] for s in data["skills_lock"]["skills"]] == ["pdf"]
    text = world.run("lock", env=dict(os.environ)).stdout
    assert "requirements.lock: unchanged" in text and "skills-lock.toml: unchanged" in text


def test_lock_keeps_the_commit_and_upgrade_moves_it_then_ensure_installs_it(
        world: World, served: Daemon, repo: Repo) -> None:
    git_config(world, source(served.url("skills"), branch="main", subdirectory="skills/pdf"))
    _run_json(world, "ensure")
    old = repo.head()
    repo.write("skills/pdf/NEW.txt", "moved on\n")
    new = repo.commit("second")
    assert not _run_json(world, "lock")["skills_lock"]["changed"]
    assert _commits(world) == [old]
    data = _run_json(world, "lock", "--upgrade")
    assert data["skills_lock"]["changed"] and _commits(world) == [new]
    [entry] = data["skills_lock"]["skills"]
    world.clear_log()
    _run_json(world, "ensure")
    assert _editable_dirs(world) == ["pdf"]  # installed again: its tree changed
    installed = Path(world.marker()["skills"]["pdf"]["path"])
    assert installed.parent.name == entry["sha256"]  # the new tree, materialised
    assert (installed / "NEW.txt").read_text() == "moved on\n"


def test_ensure_locked_with_a_changed_source_exits_2_and_changes_nothing(
        world: World, served: Daemon, repo: Repo) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    _run_json(world, "ensure")
    before = _lock(world).read_bytes()
    git_config(world, source(served.url("skills"), subdirectory="skills/docx"))
    world.clear_log()
    for command in (["ensure", "--locked"], ["run", "--locked"]):
        result = world.run(*command, env=dict(os.environ))
        assert result.returncode == 2, result.stderr
        assert "skills[0]" in result.stderr and "not in the skills lock" in result.stderr
        assert _lock(world).read_bytes() == before
        assert world.uv_calls() == []


def test_ensure_locked_with_a_matching_lock_installs(
        world: World, served: Daemon, repo: Repo) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    _run_json(world, "lock")
    before = _lock(world).read_bytes()
    data = _run_json(world, "ensure", "--locked")
    assert "pdf" in data["installed"] and _lock(world).read_bytes() == before



def test_a_warm_start_with_git_skills_runs_no_git_and_no_uv(
        world: World, served: Daemon, repo: Repo, git_log: Path) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    for _ in range(2):  # the second settles any stamp taken too close to the clock
        _run_json(world, "ensure")
    git_log.unlink()
    world.clear_log()
    data = _run_json(world, "ensure")
    assert data["failed"] == [] and data["action"] == "ready"
    assert not git_log.exists() and world.uv_calls() == []


def test_an_edited_skills_lock_is_not_answered_warm(
        world: World, served: Daemon, repo: Repo) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    for _ in range(2):
        _run_json(world, "ensure")
    [sha] = re.findall(r'^sha256 = "([0-9a-f]{64})"$', _lock(world).read_text(), re.M)
    forged = ("0" if sha[0] != "0" else "1") + sha[1:]
    _lock(world).write_text(_lock(world).read_text().replace(sha, forged))
    data = _run_json(world, "ensure")
    [failed] = data["failed"]
    assert failed["name"] == "pdf" and forged in failed["error"]
