"""A git source that fails keeps what it had; one bad skill of a glob fails only itself.

Real git (a `git daemon` on 127.0.0.1), the fake uv: what matters is what stays installed,
what the skills lock holds, what is said and the exit code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from bootstrap.sources.spec import GitSource
from testing.gitrepo import Daemon, Repo
from testing.world import World
from tests.sources.conftest import cache_root, git_config, source


def _lock(world: World) -> Path:
    return world.root / "skills-lock.toml"


def _ensure(world: World, *args: str, code: int = 0) -> tuple[dict[str, Any], str]:
    result = world.run("ensure", "--json", *args, env=dict(os.environ))
    assert result.returncode == code, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data, result.stderr


def _uninstalls(world: World) -> list[list[str]]:
    return [c for c in world.uv_calls() if c[:2] == ["pip", "uninstall"]]


def _installed_then_kept(world: World, url: str, **changed: str) -> tuple[bytes, str]:
    """A good ensure of ``url``'s skills/*, then the source edited to ``changed`` and a
    plain ensure: the lock's bytes before, and that ensure's stderr (its checks asserted)."""
    git_config(world, source(url, branch="main", subdirectory="skills/*"))
    _ensure(world)
    assert world.imports("pdf")
    locked = _lock(world).read_bytes()
    git_config(world, source(url, **{"branch": "main", "subdirectory": "skills/*", **changed}))
    world.clear_log()
    data, stderr = _ensure(world)
    assert world.imports("pdf"), stderr
    assert _lock(world).read_bytes() == locked
    assert not _uninstalls(world) and data["removed"] == []
    [failure] = data["failed"]
    for said in (failure["error"], stderr):
        assert url.split("@")[-1] in said and "docx" in said and "pdf" in said
    # --strict says so with its exit code, and still changes nothing.
    _ensure(world, "--strict", code=3)
    assert _lock(world).read_bytes() == locked and world.imports("pdf")
    return locked, stderr


def test_a_typo_in_the_branch_keeps_the_skills_installed_and_locked(
        world: World, served: Daemon) -> None:
    _, stderr = _installed_then_kept(world, served.url("skills"), branch="nosuch")
    assert "nosuch" in stderr


def test_a_stopped_daemon_keeps_the_skills_installed_and_locked(
        world: World, served: Daemon) -> None:
    """The ref edited (so it must be resolved) while the server is down."""
    git_config(world, source(served.url("skills"), branch="main", subdirectory="skills/*"))
    _ensure(world)
    served.stop()
    _installed_then_kept(world, served.url("skills"), branch="dev")


def test_a_stopped_daemon_with_the_source_unchanged_is_served_from_the_cache(
        world: World, served: Daemon) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    _ensure(world)
    locked = _lock(world).read_bytes()
    served.stop()
    world.config.write_text(world.config.read_text() + "\n")  # not warm: a full check
    data, _ = _ensure(world, "--strict")
    assert data["failed"] == [] and _lock(world).read_bytes() == locked
    assert world.imports("pdf")


def test_the_warning_names_the_url_without_its_credentials(
        world: World, served: Daemon) -> None:
    """A source with a token whose host is down: kept, and the token is said nowhere."""
    git_config(world, source(served.url("skills"), branch="main", subdirectory="skills/*"))
    _ensure(world)
    # The same skills, locked and cached for an https URL (nothing listens on port 9).
    shown = "https://127.0.0.1:9/skills"
    secret = "https://user:hunter22@127.0.0.1:9/skills"
    _lock(world).write_text(_lock(world).read_text().replace(served.url("skills"), shown))
    repos = cache_root(world) / "repos"
    shutil.copytree(repos / GitSource(0, served.url("skills")).cache_key,
                    repos / GitSource(0, secret).cache_key)
    _, stderr = _installed_then_kept(world, secret, branch="nosuch")
    assert "hunter22" not in stderr and "user:" not in stderr
    assert "hunter22" not in _lock(world).read_text()


def test_only_removing_the_source_or_lock_upgrade_drops_kept_skills(
        world: World, served: Daemon) -> None:
    _installed_then_kept(world, served.url("skills"), branch="nosuch")
    upgraded = world.run("lock", "--upgrade", env=dict(os.environ))
    assert upgraded.returncode == 1, upgraded.stderr
    assert "name =" not in _lock(world).read_text()
    data, _ = _ensure(world)
    assert "pdf" in data["removed"] and not world.imports("pdf")


def test_removing_the_failing_source_drops_its_skills(
        world: World, served: Daemon) -> None:
    _installed_then_kept(world, served.url("skills"), branch="nosuch")
    world.skill("local", python=False)
    git_config(world, '"skills/*"')
    data, _ = _ensure(world, "--strict")
    assert data["failed"] == [] and "pdf" in data["removed"] and not world.imports("pdf")
    assert "name =" not in _lock(world).read_text()


def test_one_bad_skill_of_a_glob_fails_alone_and_named(
        world: World, served: Daemon, repo: Repo) -> None:
    repo.skill("evil", symlinks={"escape": "../../../etc/passwd"})
    repo.commit("evil")
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    data, stderr = _ensure(world, "--strict", code=3)
    [failure] = data["failed"]
    assert failure["name"] == "evil"
    assert "symlink '../../../etc/passwd' points outside the skill directory" in failure["error"]
    assert "skill evil failed" in stderr and "skills[0]" not in stderr
    assert sorted(data["installed"]) == ["pdf"] and world.imports("pdf")
    assert re.findall(r'^name = "(.*)"$', _lock(world).read_text(), re.M) == ["docx", "pdf"]
