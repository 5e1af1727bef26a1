"""Our own directories (bootstrap.places): nothing is listed, created or removed through a
directory of the build cache, the warm fingerprints or a local snapshot store that is a link,
and the build cache believes only entries nobody else could have written (issue 22)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap.skills import buildcache
from testing.world import World
from tests.skills.test_buildcache import PY, publish, python_skill


def victims(tmp_path: Path) -> Path:
    """A directory of someone else's files, old enough for any pruning rule."""
    victim = tmp_path / "victims"
    victim.mkdir()
    long_ago = time.time() - 60 * 86400
    for name in ("passwd", f"{'a' * 40}.lock", f"{'b' * 40}.tar"):
        (victim / name).write_text("x\n")
        os.utime(victim / name, (long_ago, long_ago))
    return victim


def gc(world: World, cache: Path) -> subprocess.CompletedProcess[str]:
    result = world.run("gc", "--json", env={buildcache.ENV: str(cache)})
    assert result.returncode == 0, result.stderr
    return result


def test_gc_removes_nothing_through_a_symlinked_locks_directory(tmp_path: Path) -> None:
    world = World(tmp_path / "w")
    cache = tmp_path / "bcache"
    cache.mkdir()
    victim = victims(tmp_path)
    (cache / "locks").symlink_to(victim)
    result = gc(world, cache)
    assert sorted(p.name for p in victim.iterdir()) == ["a" * 40 + ".lock", "b" * 40 + ".tar",
                                                         "passwd"]
    assert json.loads(result.stdout)["done"] == []
    assert f"{cache / 'locks'} is a symbolic link" in result.stderr


def test_gc_removes_nothing_through_a_symlinked_build_cache(tmp_path: Path) -> None:
    world = World(tmp_path / "w")
    victim = victims(tmp_path)
    (victim / "locks").mkdir()
    (tmp_path / "bcache").symlink_to(victim)
    gc(world, tmp_path / "bcache")
    assert sorted(p.name for p in victim.iterdir()) == ["a" * 40 + ".lock", "b" * 40 + ".tar",
                                                         "locks", "passwd"]


def test_no_lock_is_created_through_a_symlinked_locks_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(buildcache.ENV, str(tmp_path / "bcache"))
    cache = buildcache.open_cache()
    assert cache is not None
    victim = tmp_path / "victims"
    victim.mkdir()
    (cache.root / "locks").symlink_to(victim)
    with cache.building(["k1"], timeout=1) as locked:
        assert locked == set()  # built without sharing, never locked through the link
    assert list(victim.iterdir()) == []


def test_a_symlinked_build_cache_is_no_cache(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victims"
    victim.mkdir()
    (tmp_path / "bcache").symlink_to(victim)
    monkeypatch.setenv(buildcache.ENV, str(tmp_path / "bcache"))
    assert buildcache.open_cache() is None


@pytest.mark.parametrize("plant", ["a link to an entry elsewhere", "another user's entry",
                                   "an entry others can write", "an entry the group can write"])
def test_an_entry_someone_else_could_have_written_is_never_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        plant: str) -> None:
    # A planted wheel with its own sha256 in entry.json is whole: only who wrote it tells.
    monkeypatch.setenv(buildcache.ENV, str(tmp_path / "bcache"))
    cache = buildcache.open_cache()
    assert cache is not None
    skill = python_skill(tmp_path / "skills")
    entry = publish(cache, skill, b"PK planted")
    if plant == "a link to an entry elsewhere":
        elsewhere = tmp_path / "elsewhere"
        os.rename(entry, elsewhere)
        entry.symlink_to(elsewhere)
    elif plant == "another user's entry":
        os.chown(entry, 12345, 12345)
    else:
        entry.chmod(0o757 if plant == "an entry others can write" else 0o775)
    with caplog.at_level(logging.WARNING, logger="kernel_bootstrap"):
        got = cache.take(buildcache.key(skill, PY), "alpha", tmp_path / "work")
    assert got is None
    assert not (tmp_path / "work").exists()
    assert "corrupt build cache entry" in caplog.text and str(entry) in caplog.text
    assert not os.path.lexists(entry)  # out of the way: the rebuild's entry takes its place
    if plant == "a link to an entry elsewhere":
        assert (tmp_path / "elsewhere" / "entry.json").is_file()  # never removed through it


def test_a_build_cache_of_another_user_is_no_cache(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bcache").mkdir()
    os.chown(tmp_path / "bcache", 12345, 12345)
    monkeypatch.setenv(buildcache.ENV, str(tmp_path / "bcache"))
    assert buildcache.open_cache() is None


def test_a_symlinked_snapshot_store_is_refused_by_list_and_prune(tmp_path: Path) -> None:
    world = World(tmp_path / "w")
    victim = victims(tmp_path)
    (world.root / "store").symlink_to(victim)
    world.write_config(snapshots="store")
    for args in (("snapshot", "prune", "--keep", "0"), ("snapshot", "list")):
        result = world.run(*args)
        assert result.returncode == 2, result.stderr
        assert f"{world.root / 'store'} is a symbolic link" in result.stderr
        assert "Traceback" not in result.stderr
    assert (victim / f"{'b' * 40}.tar").is_file()


def test_no_snapshot_is_written_through_a_symlinked_store(tmp_path: Path) -> None:
    world = World(tmp_path / "w")
    victim = tmp_path / "victims"
    victim.mkdir()
    (world.root / "store").symlink_to(victim)
    world.write_config(requirements=["six"], snapshots="store")
    result = world.ensure()
    assert list(victim.iterdir()) == []
    assert "could not write the snapshot" in result.stderr


if sys.platform == "win32":  # pragma: no cover - symlinks and uids: POSIX only
    pytestmark = pytest.mark.skip("POSIX ownership")
