"""A materialised tree is checked where it is used: an edited file, a world-writable tree, a
file another user owns and a lock's commit the cache never checked out are each caught by the
next start (warm or not), named, and made again from the cache or failed."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bootstrap import warm
from testing.gitrepo import Daemon, Repo
from testing.world import World
from tests.sources.conftest import git_config, source

_NOTE = "notes/a.txt"


def _warm(world: World) -> None:
    """Full starts until the warm fingerprint holds (stamps taken within a clock tick of an
    edit are not believed, so a start right after one writes a fingerprint that does not)."""
    for _ in range(6):
        world.ensure()
        if warm.holds(str(world.config)) is not None:
            return
    raise AssertionError("the warm fingerprint never held")


def _tree(world: World, name: str) -> Path:
    return Path(world.marker()["skills"][name]["path"]) if name == "pdf" else next(
        Path(os.environ["XDG_CACHE_HOME"]).glob(f"kernel-bootstrap/git/trees/*/{name}"))


def _with_notes(world: World, served: Daemon, repo: Repo) -> Path:
    repo.write(f"skills/docx/{_NOTE}", "original\n")
    repo.commit("notes")
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    _warm(world)
    return _tree(world, "docx")


def _edit(path: Path, text: str) -> None:
    """As a person would: make it writable, write, make it read-only again."""
    path.chmod(0o644)
    path.write_text(text)
    path.chmod(0o444)


def _json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_an_edited_file_is_seen_by_the_next_warm_start_and_made_again(
        world: World, served: Daemon, repo: Repo) -> None:
    tree = _with_notes(world, served, repo)
    _edit(tree / _NOTE, "tampered")  # the same size: only its stamp tells
    # The fingerprint stamped every file of the tree, not only its root and SKILL.md.
    assert warm.holds(str(world.config)) is None
    served.stop()  # made again from the cache's git objects: no network
    result = world.run("ensure", "--json", "--strict",
                       env={**os.environ, "KERNEL_BOOTSTRAP_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert re.search(r"docx changed since it was checked \(changed: notes/a\.txt\)",
                     result.stderr), result.stderr
    assert (tree / _NOTE).read_text() == "original\n"
    assert not stat.S_IMODE((tree / _NOTE).stat().st_mode) & 0o222
    assert world.status()["ready"] is True
    _warm(world)  # and the starts after it are warm again


def test_status_does_not_vouch_for_an_edited_tree(
        world: World, served: Daemon, repo: Repo) -> None:
    _with_notes(world, served, repo)
    tree = _tree(world, "pdf")
    module = next(tree.glob("src/*/__init__.py"))
    _edit(module, "VALUE = 'tampered'\n")
    status = world.run("status", "--json")
    assert status.returncode == 1, status.stdout
    assert "pdf" not in [s["name"] for s in _json(status)["skills"]
                         if s["state"] == "installed"]
    assert "tampered" in module.read_text()  # status changes nothing


def test_a_world_writable_tree_fails_verify_and_ensure_retry_seals_it_again(
        world: World, served: Daemon, repo: Repo) -> None:
    tree = _with_notes(world, served, repo)
    subprocess.run(["chmod", "-R", "a+w", str(tree)], check=True)
    verify = world.run("verify", "--json", env=dict(os.environ))
    assert verify.returncode == 1, verify.stdout
    [problem] = _json(verify)["problems"]
    assert problem["name"] == "docx" and "not read-only" in problem["detail"]
    assert _NOTE in problem["detail"]
    result = world.run("ensure", "--retry", env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert "made read-only again" in result.stderr
    for path in [tree, *tree.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode == (0o555 if path.is_dir() else 0o444), (path, oct(mode))
    assert world.run("verify", env=dict(os.environ)).returncode == 0
    assert (tree / _NOTE).read_text() == "original\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_another_user_owns_is_never_used(
        world: World, served: Daemon, repo: Repo) -> None:
    tree = _with_notes(world, served, repo)
    # Its bytes unchanged: its owner could change them at any time.
    os.chown(tree / _NOTE, 65534, 65534)
    result = world.run("ensure", env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert f"not owned by this user: {_NOTE}" in result.stderr
    assert (tree / _NOTE).stat().st_uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can write into a read-only tree")
def test_bytecode_python_writes_into_a_tree_as_root_is_not_a_change(
        world: World, served: Daemon, repo: Repo) -> None:
    _with_notes(world, served, repo)
    package = next(_tree(world, "pdf").glob("src/*"))
    # What a kernel running as root leaves when it imports the skill.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""})
    assert list(package.glob("__pycache__/*.pyc"))
    assert world.status()["ready"] is True
    result = world.run("ensure", env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert "changed since" not in result.stderr and "read-only" not in result.stderr
    assert list(package.glob("__pycache__/*.pyc"))  # kept: the tree was not made again
    _warm(world)
    assert world.run("verify", env=dict(os.environ)).returncode == 0


@pytest.mark.parametrize("offline", ["", "1"])
def test_a_locked_commit_the_cache_never_checked_out_is_not_believed(
        world: World, served: Daemon, repo: Repo, offline: str) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/docx"))
    world.ensure()
    lock = world.root / "skills-lock.toml"
    real = repo.head()
    forged = "1" * 40
    lock.write_text(lock.read_text().replace(real, forged))  # the sha256 left right
    status = _json(world.run("status", "--json"))
    assert forged not in json.dumps(status)
    result = world.run("ensure", "--json", "--strict",
                       env={**os.environ, "KERNEL_BOOTSTRAP_OFFLINE": offline})
    assert result.returncode == 3, result.stderr
    [failure] = _json(result)["failed"]
    assert failure["name"] == "docx" and forged in failure["error"]
    assert forged not in json.dumps(_json(world.run("status", "--json")))
    # The right commit is used from the cache as before.
    lock.write_text(lock.read_text().replace(forged, real))
    again = world.run("ensure", "--json", "--strict",
                      env={**os.environ, "KERNEL_BOOTSTRAP_OFFLINE": "1"})
    assert again.returncode == 0, again.stderr


def test_a_tree_is_one_fingerprint_line_that_holds_until_any_entry_changes(
        tmp_path: Path) -> None:
    from bootstrap import fingerprint
    from bootstrap.sources.paths import trees_root

    tree = trees_root() / ("a" * 64) / "demo"
    (tree / "sub").mkdir(parents=True)
    (tree / "SKILL.md").write_text("x")
    (tree / "sub" / "a.txt").write_text("a")
    config = tmp_path / "kernel-bootstrap.toml"
    config.write_text("")
    paths = [str(p) for p in (config, tree, tree / "SKILL.md", tree / "sub", tree / "sub/a.txt")]
    fingerprint.save(str(config), "/v", "/v/bin/python",
                     fingerprint.stamps([*paths, "/v/bin/python"]))
    text = Path(str(warm.fingerprint_path(str(config)))).read_text()
    assert [line.split("\t")[::2] for line in text.splitlines() if line.startswith("tree")] == [
        ["tree", "", "SKILL.md", "sub", "sub/a.txt"]]
    assert f"stat\t{tree}" not in text
    held = warm.holds(str(config))
    assert held is not None and set(paths) <= held[5]  # as if each had its own line
    (tree / "sub" / "b.txt").write_text("planted")  # changes sub's stamp only
    assert warm.holds(str(config)) is None
