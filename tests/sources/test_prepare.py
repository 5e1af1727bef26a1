"""`ensure` with git sources: locked, fetched from a real `git daemon`, checked, installed."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from testing.gitrepo import Daemon, Repo
from testing.world import World
from tests.sources.conftest import cache_root, git_config, source


def _lock(world: World) -> Path:
    return world.root / "skills-lock.toml"


def _ensure_json(world: World, *args: str, env: dict[str, str] | None = None,
                 code: int = 0) -> dict[str, Any]:
    result = world.run("ensure", "--json", *args, env={**os.environ, **(env or {})})
    assert result.returncode == code, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _installed_editables(world: World) -> list[str]:
    return [e for call in world.installs() for e in call.editables]


def test_ensure_locks_fetches_and_installs_git_skills_like_local_ones(
        world: World, served: Daemon, repo: Repo) -> None:
    world.skill("local", python=False)
    git_config(world, '"skills/*"', source(served.url("skills"), subdirectory="skills/*"))
    data = _ensure_json(world)
    assert data["failed"] == []
    assert "pdf" in data["installed"]
    status = world.status()
    assert {s["name"]: s["state"] for s in status["skills"]} == {
        "local": "installed", "docx": "installed", "pdf": "installed"}
    text = _lock(world).read_text()
    assert text.startswith("version = 1\n")
    names = re.findall(r'^name = "(.*)"$', text, re.M)
    assert names == ["docx", "pdf"]  # sorted; local skills are not locked
    assert f'commit = "{repo.head()}"' in text
    assert 'path = "skills/pdf"' in text and 'subdirectory = "skills/*"' in text
    assert re.search(r'^sha256 = "[0-9a-f]{64}"$', text, re.M)
    # The cache repositories keep the URL (credentials and all) in their config: ours alone.
    assert stat.S_IMODE((cache_root(world) / "repos").stat().st_mode) == 0o700


def test_the_lock_is_stable_byte_for_byte(world: World, served: Daemon) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    _ensure_json(world)
    first = _lock(world).read_bytes()
    _lock(world).unlink()
    _ensure_json(world)
    assert _lock(world).read_bytes() == first


def test_a_moved_branch_leaves_the_locked_commit_installed(
        world: World, served: Daemon, repo: Repo) -> None:
    git_config(world, source(served.url("skills"), branch="main", subdirectory="skills/pdf"))
    _ensure_json(world)
    locked = _lock(world).read_bytes()
    old = repo.head()
    repo.write("skills/pdf/NEW.txt", "moved on\n")
    repo.commit("second")
    world.config.write_text(world.config.read_text() + "\n")  # not warm: a full check
    _ensure_json(world)
    assert _lock(world).read_bytes() == locked
    assert f'commit = "{old}"' in locked.decode()
    trees = list((cache_root(world) / "trees").glob("*/pdf"))
    assert len(trees) == 1 and not (trees[0] / "NEW.txt").exists()


def test_a_forged_sha256_in_the_lock_installs_nothing_from_it(
        world: World, served: Daemon) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    _ensure_json(world)
    text = _lock(world).read_text()
    real = re.findall(r'^sha256 = "(.*)"$', text, re.M)[1]  # pdf's
    forged = "0" * 64
    _lock(world).write_text(text.replace(real, forged))
    world.clear_log()
    # A new venv, so that nothing installed before counts; the cached tree is not the forged one.
    env = {"KERNEL_BOOTSTRAP_VENV": str(world.root / "venv2")}
    data = _ensure_json(world, "--strict", env=env, code=3)
    failed = {f["name"]: f["error"] for f in data["failed"]}
    assert set(failed) == {"pdf"}
    assert forged in failed["pdf"] and real in failed["pdf"]
    assert served.url("skills") in failed["pdf"]
    assert "pdf" not in _installed_editables(world)
    assert not list((cache_root(world) / "trees").glob(f"{forged}*"))


@pytest.mark.parametrize("offline", ["1", ""])
def test_a_new_venv_from_the_cache_when_the_daemon_is_gone(
        world: World, served: Daemon, offline: str) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/*"))
    _ensure_json(world)
    served.stop()
    world.clear_log()
    # Offline or not: a locked, cached source needs no network at all.
    env = {"KERNEL_BOOTSTRAP_VENV": str(world.root / "fresh"), "KERNEL_BOOTSTRAP_OFFLINE": offline}
    data = _ensure_json(world, "--strict", env=env)
    assert data["failed"] == [] and "pdf" in data["installed"]
    assert "pdf" in _installed_editables(world)


def test_offline_an_uncached_commit_fails_that_skill_at_once(
        world: World, served: Daemon, repo: Repo) -> None:
    world.skill("local", python=False)
    git_config(world, '"skills/*"', source(served.url("skills"), subdirectory="skills/pdf"))
    _lock(world).write_text(
        'version = 1\n\n[[skill]]\nname = "pdf"\n'
        f'git = "{served.url("skills")}"\nsubdirectory = "skills/pdf"\npath = "skills/pdf"\n'
        f'commit = "{repo.head()}"\nsha256 = "{"a" * 64}"\n')
    result = world.run("ensure", "--json", "--strict",
                       env={**os.environ, "KERNEL_BOOTSTRAP_OFFLINE": "1"})
    assert result.returncode == 3, result.stderr
    failed = json.loads(result.stdout)["failed"]
    assert failed == [{"name": "pdf", "error":
                       f"{served.url('skills')}@{repo.head()}: not in the cache and offline"}]
    assert result.stderr.count("not in the cache and offline") == 1
    assert world.status()["skills"][0]["name"] == "local"
    # The next start is not warm (it would say "ready" without the failed skill).
    again = world.run("ensure", "--strict", env={**os.environ, "KERNEL_BOOTSTRAP_OFFLINE": "1"})
    assert again.returncode == 3


def test_a_stale_entry_is_dropped_and_a_new_source_added(
        world: World, served: Daemon) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/docx"))
    _ensure_json(world)
    assert 'name = "docx"' in _lock(world).read_text()
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    _ensure_json(world)
    text = _lock(world).read_text()
    assert 'name = "pdf"' in text and 'name = "docx"' not in text


def test_a_tag_and_a_rev_are_pinned_to_their_commits(
        world: World, served: Daemon, repo: Repo) -> None:
    first = repo.head()
    repo.tag("v1")
    repo.write("skills/docx/more.md", "x\n")
    second = repo.commit("second")
    git_config(world, source(served.url("skills"), tag="v1", subdirectory="skills/pdf"),
               source(served.url("skills"), rev=second, subdirectory="skills/docx"))
    _ensure_json(world)
    text = _lock(world).read_text()
    assert f'tag = "v1"\nsubdirectory = "skills/pdf"\npath = "skills/pdf"\ncommit = "{first}"' \
        in text
    assert f'rev = "{second}"' in text and f'commit = "{second}"' in text


def test_a_name_in_both_a_local_and_a_git_entry_is_an_error_naming_both(
        world: World, served: Daemon) -> None:
    world.skill("pdf", python=False)
    git_config(world, '"skills/*"', source(served.url("skills"), subdirectory="skills/pdf"))
    result = world.run("ensure")
    assert result.returncode == 2
    assert "two skills named 'pdf'" in result.stderr
    assert str(world.skills_dir / "pdf") in result.stderr and served.url("skills") in result.stderr


def test_a_symlink_out_of_the_skill_is_refused_as_publish_refuses_it(
        world: World, served: Daemon, repo: Repo) -> None:
    repo.skill("evil", symlinks={"escape": "../../../etc/passwd"})
    repo.commit("evil")
    git_config(world, source(served.url("skills"), subdirectory="skills/evil"))
    data = _ensure_json(world, "--strict", code=3)
    [failure] = data["failed"]
    assert failure["name"] == "evil"  # the skill, not the source: it fails alone
    assert "symlink '../../../etc/passwd' points outside the skill directory" in failure["error"]
    assert not list((cache_root(world) / "trees").glob("*/evil"))


def test_credentials_never_reach_the_output_the_lock_or_status(world: World) -> None:
    url = "https://user:hunter22@127.0.0.1:9/x.git"
    git_config(world, source(url, branch="main"))
    result = world.run("ensure", "--json")
    everything = result.stdout + result.stderr + json.dumps(world.status())
    assert "hunter22" not in everything and "user:" not in everything
    assert "https://127.0.0.1:9/x.git" in result.stdout
    assert not _lock(world).exists() or "hunter22" not in _lock(world).read_text()


def test_a_big_blob_outside_the_skill_is_never_fetched(
        world: World, served: Daemon, repo: Repo) -> None:
    repo.write("data/big.bin", os.urandom(20 * 1024 * 1024))
    repo.commit("big")
    git_config(world, source(served.url("skills"), subdirectory="skills/pdf"))
    _ensure_json(world)
    [cache] = [p for p in (cache_root(world) / "repos").iterdir() if p.is_dir()]
    fetched = sum(f.stat().st_size for f in (cache / "objects").rglob("*") if f.is_file())
    [tree] = (cache_root(world) / "trees").glob("*/pdf")
    skill = sum(f.stat().st_size for f in tree.rglob("*") if f.is_file())
    assert fetched < 64 * 1024, (fetched, skill)  # the 20 MB blob stayed on the server


def test_the_materialised_tree_is_read_only_and_an_edited_one_is_made_again(
        world: World, served: Daemon) -> None:
    git_config(world, source(served.url("skills"), subdirectory="skills/docx"))
    _ensure_json(world)
    [tree] = (cache_root(world) / "trees").glob("*/docx")
    assert not stat.S_IMODE(tree.stat().st_mode) & 0o222
    assert not stat.S_IMODE((tree / "SKILL.md").stat().st_mode) & 0o222
    tree.chmod(0o755)
    (tree / "SKILL.md").chmod(0o644)
    (tree / "SKILL.md").write_text("tampered\n")
    world.config.write_text(world.config.read_text() + "\n")
    served.stop()  # made again from the cache repository: no network needed
    _ensure_json(world, env={"KERNEL_BOOTSTRAP_OFFLINE": "1"})
    assert "tampered" not in (tree / "SKILL.md").read_text()


def test_a_repository_that_is_one_skill_over_file_url(world: World, tmp_path: Path) -> None:
    repo = Repo(tmp_path / "alone" / "solo")
    repo.skill("solo", under="")
    repo.commit("solo")
    git_config(world, source(repo.file_url))
    data = _ensure_json(world)
    assert data["failed"] == []
    assert world.status()["skills"][0]["name"] == "solo"
    assert 'path = "."' in _lock(world).read_text()
    _ensure_json(world, "--strict")  # read back: the root, used from the cache


def test_locked_with_a_source_the_lock_lacks_is_a_config_error_changing_nothing(
        world: World, served: Daemon) -> None:
    from bootstrap.config import load_config
    from bootstrap.engine.sources import prepare
    from bootstrap.errors import ConfigError

    git_config(world, source(served.url("skills"), subdirectory="skills/docx"))
    _ensure_json(world)
    before = _lock(world).read_bytes()
    git_config(world, source(served.url("skills"), subdirectory="skills/docx"),
               source(served.url("skills"), subdirectory="skills/pdf"))
    with pytest.raises(ConfigError, match=r"skills\[1\].*not in the skills lock"):
        prepare(load_config(world.config), locked=True)
    assert _lock(world).read_bytes() == before
    git_config(world, source(served.url("skills"), subdirectory="skills/docx"))
    config, failed = prepare(load_config(world.config), locked=True)
    assert failed == {} and [s.name for s in config.skills] == ["docx"]


def test_a_lock_that_cannot_be_written_is_a_warning_not_a_failed_start(
        world: World, served: Daemon) -> None:
    (world.root / "not-a-dir").write_text("")
    git_config(world, source(served.url("skills"), subdirectory="skills/docx"),
               extra='skills-lock = "not-a-dir/skills-lock.toml"\n')
    result = world.run("ensure", "--json", "--strict", env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert "cannot write the skills lock" in result.stderr
    assert json.loads(result.stdout)["failed"] == []


def test_upgrade_moves_to_the_new_commit_and_the_old_stays_usable_from_the_cache(
        world: World, served: Daemon, repo: Repo) -> None:
    from bootstrap.config import load_config
    from bootstrap.engine.sources import prepare
    from bootstrap.primitives.fs import remove_tree

    git_config(world, source(served.url("skills"), branch="main", subdirectory="skills/pdf"))
    _ensure_json(world)
    old_lock = _lock(world).read_bytes()
    repo.write("skills/pdf/NEW.txt", "new\n")
    new = repo.commit("second")
    config, failed = prepare(load_config(world.config), upgrade=True)
    assert failed == {}
    assert f'commit = "{new}"' in _lock(world).read_text()
    assert (config.skills[0].path / "NEW.txt").read_text() == "new\n"
    # Back to the old pin, offline, its tree removed: made again from the cached commit.
    _lock(world).write_bytes(old_lock)
    served.stop()
    remove_tree(cache_root(world) / "trees")
    data = _ensure_json(world, "--strict", env={"KERNEL_BOOTSTRAP_OFFLINE": "1"})
    assert data["failed"] == []
    [tree] = (cache_root(world) / "trees").glob("*/pdf")
    assert not (tree / "NEW.txt").exists()


def test_the_users_git_config_and_git_variables_are_not_used(
        world: World, served: Daemon) -> None:
    home = Path(os.environ["HOME"])
    # Each would send the fetch elsewhere (or run a program) if git took it.
    (home / ".gitconfig").write_text(
        f'[url "ext::sh -c touch% {home}/pwned"]\n\tinsteadOf = {served.url("")}\n'
        '[core]\n\thooksPath = /nonexistent\n')
    env = {"GIT_DIR": str(world.root / "nowhere"), "GIT_CONFIG_COUNT": "1",
           "GIT_CONFIG_KEY_0": "url.git://192.0.2.1/.insteadOf",
           "GIT_CONFIG_VALUE_0": served.url("")}
    git_config(world, source(served.url("skills"), subdirectory="skills/docx"))
    data = _ensure_json(world, "--strict", env=env)
    assert data["failed"] == []
    assert not (home / "pwned").exists()
