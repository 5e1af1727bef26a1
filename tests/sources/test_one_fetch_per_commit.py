"""One fetch per commit: a source's skills cost the same few git processes whatever their
number, counted by a logging `git` first on PATH (real git, a `git daemon` on 127.0.0.1).

The time of 300 skills is a benchmark figure (scripts/bench_sources.py), not a test."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from bootstrap.primitives.fs import remove_tree
from testing.gitrepo import _ID, Daemon, Repo
from testing.world import World
from tests.sources.conftest import cache_root, git_config, source

MANY = 40


def _repo(base: Path, count: int) -> Repo:
    made = Repo(base)
    for i in range(count):
        made.skill(f"s{i:03}", files={"doc.md": f"skill {i}\n", "bin/run.sh": "#!/bin/sh\n"})
    made.commit("skills")
    return made


def _calls(log: Path) -> list[str]:
    """Our tool's git commands (the daemon's own start is not ours), and a fresh log."""
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return [line for line in lines if not line.startswith("daemon ")]


def _locked(world: World) -> list[str]:
    return re.findall(r'^name = "(.*)"$', (world.root / "skills-lock.toml").read_text(), re.M)


def _lock(world: World, url: str, log: Path) -> list[str]:
    git_config(world, source(url, subdirectory="skills/*"))
    done = world.run("lock", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    return _calls(log)


def test_a_glob_source_costs_the_same_few_git_processes_whatever_its_number_of_skills(
        tmp_path: Path, served: Daemon, git_log: Path) -> None:
    _repo(tmp_path / "served" / "few", 4)
    _repo(tmp_path / "served" / "many", MANY)
    _calls(git_log)
    few = World(tmp_path / "few")
    many = World(tmp_path / "many")
    # Each a first `lock` with its own new cache repository: resolve, create, fetch, check out.
    few_calls = _lock(few, served.url("few"), git_log)
    many_calls = _lock(many, served.url("many"), git_log)
    assert len(_locked(few)) == 4 and len(_locked(many)) == MANY
    assert len(many_calls) <= 10, "\n".join(many_calls)
    assert len(many_calls) == len(few_calls), "\n".join(many_calls)
    assert sum("fetch" in c.split() for c in many_calls) == 2  # the commit, then every blob


def test_a_new_machine_makes_every_locked_tree_with_one_fetch(
        tmp_path: Path, served: Daemon, git_log: Path) -> None:
    _repo(tmp_path / "served" / "many", MANY)
    world = World(tmp_path / "many")
    _lock(world, served.url("many"), git_log)
    remove_tree(cache_root(world))  # the lock is committed; this machine has no cache yet
    done = world.run("ensure", "--json", "--strict", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["failed"] == []
    calls = _calls(git_log)
    assert len(calls) <= 10, "\n".join(calls)
    assert sum("fetch" in c.split() for c in calls) == 2
    trees = sorted((cache_root(world) / "trees").glob("*/s*"))
    assert sorted(t.name for t in trees) == sorted(_locked(world)) and len(trees) == MANY
    assert all((t / "bin" / "run.sh").read_text() == "#!/bin/sh\n" for t in trees)


def test_one_skill_git_refuses_fails_alone_and_its_siblings_are_made_together(
        tmp_path: Path, served: Daemon) -> None:
    made = _repo(tmp_path / "served" / "many", 3)
    # A `.git` file committed by hand (git refuses to add one): the one-pass checkout leaves
    # it out with a warning, so the skills are made again one by one and that one is named.
    _plant(made, "skills/s001", ".git", b"[core]\n")
    world = World(tmp_path / "many")
    git_config(world, source(served.url("many"), subdirectory="skills/*"))
    done = world.run("ensure", "--json", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    failed = {f["name"]: f["error"] for f in json.loads(done.stdout)["failed"]}
    assert set(failed) == {"s001"} and ".git" in failed["s001"]
    assert sorted(_locked(world)) == ["s000", "s002"]
    assert not list((cache_root(world) / "trees").glob("*/s001"))


def _plant(repo: Repo, directory: str, name: str, data: bytes) -> None:
    """A new commit whose ``directory`` also holds the file ``name``, made with git's plumbing
    (which checks no name), as a hostile server would serve it."""
    def run(*args: str, given: bytes = b"") -> str:
        done = subprocess.run(["git", *args], cwd=repo.path, input=given, capture_output=True,
                              check=True, env={**os.environ, **_ID})
        return done.stdout.decode().strip()

    oid = run("hash-object", "-w", "--stdin", given=data)
    entry = f"100644 blob {oid}\t{name}"
    parts = directory.split("/")
    for depth in range(len(parts), -1, -1):  # the deepest tree first, then each parent
        here = "/".join(parts[:depth])
        listed = run("ls-tree", f"HEAD:{here}" if here else "HEAD^{tree}")
        child = parts[depth] if depth < len(parts) else name
        kept = [line for line in listed.splitlines() if line.split("\t", 1)[1] != child]
        oid = run("mktree", given="\n".join([*kept, entry]).encode() + b"\n")
        entry = f"040000 tree {oid}\t{parts[depth - 1]}" if depth else ""
    commit = run("commit-tree", oid, "-p", "HEAD", "-m", "planted")
    run("update-ref", "refs/heads/main", commit)
