"""`kernel-bootstrap verify`: git trees against the skills lock, published trees against
publish's record, editables against the marker; exit 1 naming each file, 0 when all match."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any

from testing.gitrepo import Daemon, Repo
from testing.world import World
from tests.sources.conftest import git_config, repo, served, source, world

__all__ = ["repo", "served", "world"]  # the git-source fixtures, shared with tests/sources


def _verify(world: World, *args: str, code: int) -> dict[str, Any]:
    result = world.run("verify", "--json", *args, env=dict(os.environ))
    assert result.returncode == code, result.stdout + result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _writable(path: Path) -> None:
    """A materialised tree is read-only; a person (or a bug) may still change it."""
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


def _tree(world: World, name: str) -> Path:
    return Path(world.marker()["skills"][name]["path"])


def test_verify_passes_then_names_each_changed_missing_and_extra_file_of_a_git_tree(
        world: World, served: Daemon, repo: Repo) -> None:
    repo.write("skills/pdf/notes/a.txt", "a\n")
    repo.write("skills/pdf/b.txt", "b\n")
    repo.commit("more files")
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    world.ensure()
    data = _verify(world, code=0)
    assert data["ok"] and data["checked"]["git"] == 2 and data["problems"] == []
    tree = _tree(world, "pdf")
    _writable(tree)
    (tree / "notes" / "a.txt").write_text("edited\n")
    (tree / "b.txt").unlink()
    (tree / "planted.txt").write_text("x\n")
    data = _verify(world, code=1)
    [problem] = data["problems"]
    assert problem["kind"] == "git" and problem["name"] == "pdf"
    assert problem["changed"] == ["notes/a.txt"]
    assert problem["missing"] == ["b.txt"] and problem["extra"] == ["planted.txt"]
    text = world.run("verify", env=dict(os.environ))
    assert text.returncode == 1
    assert "changed: notes/a.txt" in text.stdout and "missing: b.txt" in text.stdout
    assert "extra: planted.txt" in text.stdout


def test_verify_names_an_exec_bit_change(world: World, served: Daemon, repo: Repo) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    world.ensure()
    tree = _tree(world, "pdf")
    (tree / "SKILL.md").chmod(0o555)
    [problem] = _verify(world, code=1)["problems"]
    assert problem["changed"] == ["SKILL.md"]


def test_verify_into_names_a_file_changed_in_a_published_tree(
        world: World, tmp_path: Path) -> None:
    skill = world.skill("alpha", python=False)
    root = tmp_path / "published"
    done = world.run("publish", "--into", str(root), str(skill))
    assert done.returncode == 0, done.stderr
    assert _verify(world, "--into", str(root), code=0)["checked"]["published"] == 1
    (root / "alpha" / "SKILL.md").write_text((root / "alpha" / "SKILL.md").read_text() + "x\n")
    (root / "alpha" / "new.txt").write_text("new\n")
    [problem] = _verify(world, "--into", str(root), code=1)["problems"]
    assert problem["kind"] == "published" and problem["name"] == "alpha"
    assert problem["changed"] == ["SKILL.md"] and problem["extra"] == ["new.txt"]


def test_verify_into_names_a_published_tree_that_is_gone(
        world: World, tmp_path: Path) -> None:
    skill = world.skill("alpha", python=False)
    root = tmp_path / "published"
    assert world.run("publish", "--into", str(root), str(skill)).returncode == 0
    (root / "alpha" / "SKILL.md").unlink()
    (root / "alpha").rmdir()
    [problem] = _verify(world, "--into", str(root), code=1)["problems"]
    assert problem["name"] == "alpha" and problem["detail"].startswith("missing")


def test_verify_names_an_editable_that_points_elsewhere(world: World) -> None:
    world.skill("alpha")
    world.ensure()
    assert _verify(world, code=0)["checked"]["editables"] == 1
    [direct] = world.root.glob("venv/lib/python*/site-packages/alpha*.dist-info/direct_url.json")
    data = json.loads(direct.read_text())
    data["url"] = (world.root / "elsewhere").as_uri()
    direct.write_text(json.dumps(data))
    [problem] = _verify(world, code=1)["problems"]
    assert problem["kind"] == "editable" and problem["name"] == "alpha"
    assert "elsewhere" in problem["detail"]


def test_verify_hashes_a_tree_as_the_lock_and_publish_do_plain_or_not(tmp_path: Path) -> None:
    from bootstrap.sources.treehash import git_hash, git_mode, publish_hash, read, tree_sha256
    from bootstrap.trees.skilltree import file_digest, hash_records, load_skill_tree, tree_hash
    from testing.skills import make_skill

    plain = make_skill(tmp_path, "plain", {"a/b.txt": "b\n", "run.sh": "#!/bin/sh\n"},
                       description="d", executables=["run.sh"])
    odd = make_skill(tmp_path, "odd", {"café.txt": "c\n", "x/y.txt": "y\n"}, description="d",
                     symlinks={"link": "x/y.txt"})
    for tree in (plain, odd):
        walked = load_skill_tree(tree, spec=False)  # publish's walk, publish's hash
        as_git = dataclasses.replace(walked, entries=tuple(
            dataclasses.replace(e, mode=git_mode(e.kind, e.mode)) for e in walked.entries))
        digests = [file_digest(e.path) for e in walked.entries if e.kind == "file"]
        listing = read(tree)
        assert git_hash(listing) == tree_sha256(tree) == hash_records(
            as_git, digests).removeprefix("sha256:")
        assert publish_hash(listing) == tree_hash(walked)
