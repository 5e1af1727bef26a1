"""SIGKILL during fetch and materialise: the next run completes, and no half tree is ever used.

A kill loop: ensure is started against a fresh cache (or one a kill left half filled) and its
whole process group SIGKILLed after a range of delays, which land in ``git fetch``, in the
checkout, in the hash and around the rename. After every kill, each tree in the cache must
hash to its name (a half tree never carries one), and the next run must finish.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from bootstrap.primitives.fs import remove_tree
from bootstrap.sources.treehash import tree_sha256
from testing.gitrepo import Daemon, Repo
from testing.world import World
from tests.sources.conftest import cache_root, git_config, source

DELAYS = (0.05, 0.15, 0.25, 0.35, 0.5, 0.65, 0.8, 1.0, 1.3)


def _trees_are_whole(world: World) -> int:
    count = 0
    trees = cache_root(world) / "trees"
    for tree in trees.glob("*/*") if trees.is_dir() else []:
        if tree.parent.name.startswith(".tmp"):
            continue  # a side directory: never used, reaped once its writer is gone
        if tree.name.startswith("."):
            continue  # the tree's record (bootstrap.sources.treerecord), beside it
        assert tree_sha256(tree) == tree.parent.name, f"a half tree in place: {tree}"
        count += 1
    return count


def test_killed_during_fetch_and_materialise_the_next_run_completes(
        world: World, served: Daemon, repo: Repo) -> None:
    # Big enough files that fetch, checkout and hash each take a while.
    repo.write("skills/pdf/data/blob.bin", os.urandom(6 * 1024 * 1024))
    repo.write("skills/docx/data/blob.bin", os.urandom(6 * 1024 * 1024))
    repo.commit("big")
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    env = dict(os.environ)
    for round_, delay in enumerate(DELAYS * 2):
        if round_ < len(DELAYS) and cache_root(world).exists():
            remove_tree(cache_root(world))  # first pass: each kill lands in a fresh fetch
        child = subprocess.Popen(world.command("ensure"), env=env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        _trees_are_whole(world)
    result = world.run("ensure", "--json", "--strict", env=env)
    assert result.returncode == 0, result.stderr
    assert _trees_are_whole(world) >= 2
    assert {s["name"]: s["state"] for s in world.status()["skills"]} == {
        "docx": "installed", "pdf": "installed"}
    leftovers = [p.name for p in (cache_root(world) / "trees").iterdir()
                 if p.name.startswith(".tmp")]
    assert leftovers == []


def test_a_killed_gits_lock_files_do_not_block_the_next_fetch(
        world: World, served: Daemon, repo: Repo) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    world.ensure(env=dict(os.environ))
    [cache] = [p for p in (cache_root(world) / "repos").iterdir() if p.is_dir()]
    # What a git SIGKILLed in a fetch leaves: shallow.lock fails every later shallow fetch.
    (cache / "shallow.lock").write_text("")
    (cache / "config.lock").write_text("")
    repo.write("skills/pdf/more.txt", "more\n")
    repo.commit("second")
    Path(world.root / "skills-lock.toml").unlink()
    result = world.run("ensure", "--json", "--strict", env=dict(os.environ))
    assert result.returncode == 0, result.stderr
