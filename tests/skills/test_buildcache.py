"""The build cache (skills/buildcache.py) in process: keys, atomic publish, corrupt entries, locks
and pruning. With the real uv, tests/integration/test_build_cache.py."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap.config import Skill
from bootstrap.skills import _build_worker, buildcache
from bootstrap.skills.python_skill import PythonSkill, load_python_skill
from testing.skills import Package, make_skill

PY = "3.12.3"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> buildcache.Cache:
    monkeypatch.setenv(buildcache.ENV, str(tmp_path / "builds"))
    opened = buildcache.open_cache()
    assert opened is not None
    return opened


def python_skill(parent: Path, name: str = "alpha") -> PythonSkill:
    path = make_skill(parent, name, package=Package(), exist_ok=True)
    return load_python_skill(Skill(name, path))


def reload(skill: PythonSkill) -> PythonSkill:
    return load_python_skill(skill.skill)


def publish(cache: buildcache.Cache, skill: PythonSkill, data: bytes = b"PK wheel") -> Path:
    """An entry published as the build worker publishes one."""
    k = buildcache.key(skill, PY)
    staging = cache.staging(k)
    staging.mkdir()
    wheel = staging / f"{skill.project}-0.1.0-py3-none-any.whl"
    wheel.write_bytes(data)
    item = {"out": str(staging), "entry": str(cache.entry(k)), "meta": cache.metadata(skill)}
    _build_worker._publish(item, str(wheel))
    return cache.entry(k)


def test_the_cache_lives_in_the_user_cache_dir_unless_the_env_var_moves_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(buildcache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert buildcache.root() == tmp_path / "xdg" / "kernel-bootstrap" / "builds"
    monkeypatch.setenv(buildcache.ENV, str(tmp_path / "elsewhere"))
    assert buildcache.root() == tmp_path / "elsewhere"


def test_the_key_follows_what_the_build_reads_and_nothing_else(tmp_path: Path) -> None:
    skill = python_skill(tmp_path)
    first = buildcache.key(skill, PY)
    assert buildcache.key(reload(skill), PY) == first
    os.utime(skill.skill.pyproject, (1, 1))  # a touch: same bytes, same build
    (skill.skill.path / "src" / "alpha" / "more.py").write_text("X = 1\n")  # sources: editable
    assert buildcache.key(reload(skill), PY) == first
    assert buildcache.key(skill, "3.13.0") != first
    assert buildcache.key(skill, PY, ["--index-url", "http://x"]) != first

    (skill.skill.path / "setup.cfg").write_text("[metadata]\n")
    with_cfg = buildcache.key(reload(skill), PY)
    assert with_cfg != first
    (skill.skill.path / "setup.cfg").unlink()
    with skill.skill.pyproject.open("a") as f:
        f.write("# edited\n")
    assert buildcache.key(reload(skill), PY) not in (first, with_cfg)

    other = python_skill(tmp_path / "elsewhere")  # the same project at another path
    assert buildcache.key(other, PY) != buildcache.key(python_skill(tmp_path / "again"), PY)


def test_src_layout_is_in_the_key(tmp_path: Path) -> None:
    src = python_skill(tmp_path / "a")
    src_key = buildcache.key(src, PY)
    # The same pyproject bytes at the same path, without src/: another build.
    (src.skill.path / "src").rename(tmp_path / "aside")
    assert buildcache.key(reload(src), PY) != src_key


def test_a_published_entry_is_taken_as_a_copy_and_its_use_recorded(
        tmp_path: Path, cache: buildcache.Cache) -> None:
    skill = python_skill(tmp_path)
    k = buildcache.key(skill, PY)
    assert cache.take(k, "alpha", tmp_path / "work" / "alpha") is None
    entry = publish(cache, skill, b"wheel bytes")
    assert [p.name for p in cache.root.iterdir() if not p.name.startswith(".")] == [k]
    meta = json.loads((entry / "entry.json").read_text())
    assert meta["sha256"] == hashlib.sha256(b"wheel bytes").hexdigest()
    assert meta["path"] == str(skill.skill.path)

    got = cache.take(k, "alpha", tmp_path / "work" / "alpha")
    assert got is not None and got.parent == tmp_path / "work" / "alpha"
    assert got.read_bytes() == b"wheel bytes" and not got.samefile(entry / got.name)
    assert (entry / buildcache.USED).is_file()


def test_a_second_publish_of_the_same_key_keeps_the_first(
        tmp_path: Path, cache: buildcache.Cache) -> None:
    skill = python_skill(tmp_path)
    entry = publish(cache, skill, b"first")
    k = buildcache.key(skill, PY)
    staging = cache.staging(k)
    staging.mkdir()
    (staging / "alpha-0.1.0-py3-none-any.whl").write_bytes(b"second")
    item = {"out": str(staging), "entry": str(entry), "meta": cache.metadata(skill)}
    kept = _build_worker._publish(item, str(staging / "alpha-0.1.0-py3-none-any.whl"))
    assert kept == str(staging / "alpha-0.1.0-py3-none-any.whl")  # ours, for this session
    assert (entry / "alpha-0.1.0-py3-none-any.whl").read_bytes() == b"first"


@pytest.mark.parametrize("damage", ["wheel bytes", "wheel missing", "entry.json garbage",
                                    "entry.json to /dev/zero", "wheel name escapes",
                                    "old schema"])
def test_a_corrupt_entry_is_a_miss_with_a_warning_and_goes_away(
        tmp_path: Path, cache: buildcache.Cache, caplog: pytest.LogCaptureFixture,
        damage: str) -> None:
    skill = python_skill(tmp_path)
    entry = publish(cache, skill)
    [wheel] = entry.glob("*.whl")
    meta_file = entry / "entry.json"
    meta = json.loads(meta_file.read_text())
    if damage == "wheel bytes":
        wheel.write_bytes(b"PK truncat")
    elif damage == "wheel missing":
        wheel.unlink()
    elif damage == "entry.json garbage":
        meta_file.write_text("{not json")
    elif damage == "entry.json to /dev/zero":
        meta_file.unlink()
        meta_file.symlink_to("/dev/zero")
    elif damage == "wheel name escapes":
        meta_file.write_text(json.dumps({**meta, "wheel": "../../outside.whl"}))
    else:
        meta_file.write_text(json.dumps({**meta, "schema": 0}))
    with caplog.at_level(logging.WARNING, logger="kernel_bootstrap"):
        got = cache.take(buildcache.key(skill, PY), "alpha", tmp_path / "work")
    assert got is None
    assert "corrupt build cache entry" in caplog.text and "alpha" in caplog.text
    assert not entry.exists()
    assert publish(cache, skill).is_dir()  # the rebuild's entry takes its place


def test_an_unwritable_cache_is_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(buildcache.ENV, str(tmp_path / "file" / "builds"))
    assert buildcache.open_cache() is None


HOLD = """
import sys, time
from pathlib import Path
from bootstrap.primitives.lock import hold
with hold(Path(sys.argv[1]), 5, purpose="build"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_key_another_session_is_building_is_waited_for_then_built_anyway(
        cache: buildcache.Cache) -> None:
    held = subprocess.Popen([sys.executable, "-c", HOLD, str(cache.root / "locks" / "k1.lock"),
                             "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout is not None and held.stdout.readline() == "held\n"
        with cache.building(["k2", "k1"], timeout=0.5) as locked:
            assert locked == {"k2"}  # k1 is left to build anyway, once the wait is over
    finally:
        held.kill()
        held.wait()
    short = subprocess.Popen([sys.executable, "-c", HOLD, str(cache.root / "locks" / "k1.lock"),
                              "0.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert short.stdout is not None and short.stdout.readline() == "held\n"
        with cache.building(["k1"], timeout=20) as locked:
            assert locked == {"k1"}  # released after a short build: waited for, then ours
    finally:
        short.wait()


def dead_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def test_prune_removes_gone_skills_unused_entries_and_dead_leftovers(
        tmp_path: Path, cache: buildcache.Cache) -> None:
    kept = publish(cache, python_skill(tmp_path, "kept"))
    gone_skill = python_skill(tmp_path, "gone")
    gone = publish(cache, gone_skill)
    (gone_skill.skill.pyproject).unlink()
    old = publish(cache, python_skill(tmp_path, "old"))
    long_ago = time.time() - 40 * 86400
    for path in (old / "used", old / "entry.json"):
        path.touch()
        os.utime(path, (long_ago, long_ago))
    dead = cache.root / f".{'0' * 40}.build-{dead_pid()}-deadbeef"
    (dead / "half").mkdir(parents=True)
    live = cache.root / f".{'1' * 40}.build-{os.getpid()}-cafecafe"
    live.mkdir()

    done = buildcache.prune()
    assert kept.is_dir() and live.is_dir()
    assert not gone.exists() and not old.exists() and not dead.exists()
    assert len([d for d in done if "removed build cache entry" in d]) == 3
    assert sorted(p.name for p in cache.root.iterdir() if not p.name.startswith(".")) == [
        kept.name]


def test_gc_prunes_the_build_cache(tmp_path: Path, cache: buildcache.Cache) -> None:
    gone_skill = python_skill(tmp_path / "skills", "gone")
    gone = publish(cache, gone_skill)
    (gone_skill.skill.pyproject).unlink()
    config = tmp_path / "kernel-bootstrap.toml"
    config.write_text('venv = "venv"\nskills = ["skills/*"]\n')
    result = subprocess.run([sys.executable, "-m", "bootstrap", "gc", "--json", "--config",
                             str(config)], capture_output=True, text=True, check=False,
                            env={**os.environ, buildcache.ENV: str(cache.root)})
    assert result.returncode == 0, result.stderr
    assert any(str(gone) in line for line in json.loads(result.stdout)["done"])
    assert not gone.exists()
