"""The ring around git sources: `status` (each skill's `path`, a git skill's `source`),
`publish`/`push` without SRC, and `gc` of the git cache."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from testing.gitrepo import Daemon, Repo
from testing.world import World
from tests.sources.conftest import cache_root, git_config, source


def test_status_gives_each_skill_its_path_and_a_git_skill_its_source(
        world: World, served: Daemon, repo: Repo) -> None:
    local = world.skill("local", python=False)
    git_config(world, '"skills/*"', source(served.url("skills"), subdirectory="skills/pdf"))
    world.ensure()
    lock = (world.root / "skills-lock.toml").read_text()
    [sha] = re.findall(r'^sha256 = "([0-9a-f]{64})"$', lock, re.M)
    skills = {s["name"]: s for s in world.status()["skills"]}
    assert skills["local"]["path"] == str(local) and "source" not in skills["local"]
    assert skills["pdf"]["path"] == str(cache_root(world) / "trees" / sha / "pdf")
    assert skills["pdf"]["source"] == {"git": served.url("skills"), "commit": repo.head(),
                                       "sha256": sha}
    assert Path(skills["pdf"]["path"], "SKILL.md").is_file()
    text = world.run("status", env=dict(os.environ)).stdout
    assert f"git {served.url('skills')}@{repo.head()[:12]}" in text


def test_publish_and_push_without_src_take_the_configured_skills_git_ones_included(
        world: World, served: Daemon, repo: Repo, tmp_path: Path) -> None:
    world.skill("local", python=False)
    git_config(world, '"skills/*"', source(served.url("skills"), subdirectory="skills/pdf"))
    root = tmp_path / "root"
    done = world.run("publish", "--into", str(root), "--json", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert sorted(s["name"] for s in json.loads(done.stdout)["skills"]) == ["local", "pdf"]
    assert (root / "pdf" / "SKILL.md").read_bytes() == (
        repo.path / "skills" / "pdf" / "SKILL.md").read_bytes()
    dest = tmp_path / "dest"
    done = world.run("push", "--dest", str(dest), env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith(".")) == [
        "local", "pdf"]


def test_publish_without_src_refuses_a_git_tree_that_does_not_match_the_lock(
        world: World, served: Daemon, repo: Repo, tmp_path: Path) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    assert world.run("lock", env=dict(os.environ)).returncode == 0
    lock = world.root / "skills-lock.toml"
    [sha] = re.findall(r'^sha256 = "([0-9a-f]{64})"$', lock.read_text(), re.M)
    lock.write_text(lock.read_text().replace(sha, "0" * 64))
    root = tmp_path / "root"
    done = world.run("publish", "--into", str(root), env=dict(os.environ))
    assert done.returncode == 1
    assert "pdf" in done.stderr and "0" * 64 in done.stderr
    assert not (root / "pdf").exists()


def _age(path: Path, days: float) -> None:
    then = time.time() - days * 86400
    os.utime(path, (then, then))


def _age_cache(world: World, days: float) -> None:
    for entry in [*(cache_root(world) / "trees").iterdir(),
                  *(cache_root(world) / "repos").iterdir()]:
        _age(entry, days)


def test_gc_prunes_cached_repositories_and_trees_no_lock_names_once_unused_for_30_days(
        world: World, served: Daemon, repo: Repo, tmp_path: Path) -> None:
    other = Repo(tmp_path / "served" / "other")
    other.skill("xlsx")
    other.commit("first")
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    world.ensure()
    [first] = list((cache_root(world) / "trees").iterdir())
    repo.write("skills/pdf/NEW.txt", "moved on\n")
    repo.commit("second")
    assert world.run("lock", "--upgrade", env=dict(os.environ)).returncode == 0
    world.ensure()  # the venv moves on too: until then it uses the first tree, which gc keeps
    elsewhere = World(tmp_path / "elsewhere")
    git_config(elsewhere, source(served.url("other"), subdirectory="skills/xlsx"))
    elsewhere.ensure()
    trees = {p.name for p in (cache_root(world) / "trees").iterdir()}
    repos = {p.name for p in (cache_root(world) / "repos").iterdir() if p.is_dir()}
    assert len(trees) == 3 and len(repos) == 2
    (elsewhere.root / "skills-lock.toml").unlink()  # that config's lock names nothing now

    assert world.run("gc", env=dict(os.environ)).returncode == 0  # all recent: all kept
    assert {p.name for p in (cache_root(world) / "trees").iterdir()} == trees

    _age_cache(world, 31)
    done = world.run("gc", "--json", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    said = "\n".join(json.loads(done.stdout)["done"])
    named = re.findall(r'^sha256 = "([0-9a-f]{64})"$',
                       (world.root / "skills-lock.toml").read_text(), re.M)
    assert {p.name for p in (cache_root(world) / "trees").iterdir()} == set(named)
    assert first.name not in named and first.name in said
    left = [p for p in (cache_root(world) / "repos").iterdir() if p.is_dir()]
    assert len(left) == 1 and "removed cached git repository" in said
    data = world.ensure("--json")  # what is left still serves, without the network
    assert json.loads(data.stdout)["failed"] == []
